"""The T2S side of the scheduler: a pool of KV-cache slots decoded together, one step at a time.

Responsibilities: (1) hold the decoding state of every slot on the device (KV cache, last token,
positions, seen ids, sampling parameters), (2) prefill arrivals into free slots and run one decode
step over the first ``n`` slots, as a captured CUDA graph per bucketed batch size on CUDA, eagerly
elsewhere. It knows nothing about requests: the scheduler decides which slot holds what.

Cache layout: every slot row has ``capacity`` positions, and all rows write the new position at one
shared ring pointer (the Triton attention kernel takes one position for the whole batch). A prefix
is placed so that it ends right before the pointer; a key's place in the row does not matter to
attention (positions are in the embeddings), only the ``valid`` mask does.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from engine.models.t2s import Text2SemanticModel
from engine.runtime import copy_to_host, host_to_device
from engine.serving.sampling import RowParams, sample_rows
from engine.t2s.decoding import SamplingParams, T2SInput, prefix_lm_mask
from engine.t2s.fast import fused_layers
from engine.t2s.kernels import triton_available

log = logging.getLogger(__name__)

SMALL_BUCKETS = (1, 2, 4, 8)  # decode batch sizes with a graph of their own (GEMV kernels below 9 rows)
WINDOW_STEP = 64  # eager attention reads the newest positions, rounded up to this


def batch_buckets(slots: int) -> tuple[int, ...]:
    """Captured batch sizes: 1, 2, 4, 8, then about 1.5x apart (16, 24, 32, 48, ...), up to ``slots``."""
    sizes, b = list(SMALL_BUCKETS), 16
    while b < slots:
        sizes.append(b)
        sizes.append(b * 3 // 2)
        b *= 2
    return tuple(sorted({s for s in sizes if s < slots} | {slots}))


class SlotDecoder:
    """Decoding state of ``slots`` rows over one shared T2S model (which it never modifies)."""

    def __init__(self, model: Text2SemanticModel, slots: int, capacity: int, use_graph: bool | None = None,
                 attention: str = "auto") -> None:
        p = next(model.parameters())
        self.model, self.device, self.dtype = model, p.device, p.dtype
        self.slots, self.capacity = slots, capacity
        d = model.dims
        self.n_head, self.head_dim, self.vocab, self.eos = d.n_head, d.head_dim, d.vocab_size, d.eos
        if attention == "auto":
            attention = "triton" if triton_available(self.device) else "torch"
        self._tk = importlib.import_module("engine.t2s.kernels.triton_step") if attention == "triton" else None
        self.use_graph = (self.device.type == "cuda") if use_graph is None else use_graph
        dev, dt = self.device, self.dtype
        kv = (d.n_layer, slots, d.n_head, capacity, d.head_dim)
        self.k = torch.zeros(kv, device=dev, dtype=dt)  # (L, S, H, cap, hd)
        self.v = torch.zeros(kv, device=dev, dtype=dt)
        self.valid = torch.zeros(slots, capacity, dtype=torch.bool, device=dev)  # keys each row may attend
        self.token = torch.zeros(slots, dtype=torch.long, device=dev)  # next input of each row
        self.audio_pos = torch.zeros(slots, dtype=torch.long, device=dev)  # its position in the semantic stream
        self.step_index = torch.zeros(slots, dtype=torch.long, device=dev)  # official idx of the next sample
        self.seen = torch.zeros(slots, self.vocab, dtype=torch.bool, device=dev)  # ids in the row's history
        self.params = RowParams.empty(slots, dev)
        self.out_token = torch.zeros(slots, dtype=torch.long, device=dev)
        self.out_argmax = torch.zeros(slots, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)  # ring pointer: where the next input goes
        self.pos_host = 0
        self.window = WINDOW_STEP  # eager attention span (set by the scheduler from the longest row)
        self.buckets = batch_buckets(slots) if self.use_graph else ()
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self.missing: set[int] = set()  # buckets stepped eagerly for want of a graph (captured when quiet)
        self.captures = 0  # graphs captured
        pinned = self.device.type == "cuda"
        self._host = torch.zeros(2, slots, dtype=torch.long, pin_memory=pinned)

    @property
    def bytes_per_slot(self) -> int:
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    # ---- one decode step ----------------------------------------------------------------------
    def _step_rows(self, b: int) -> None:
        """One token for rows [0, b), reading and writing only the pool's buffers (graph-safe)."""
        m = self.model
        x = m.ar_audio_embedding(self.token[:b])  # (b, D)
        pe = m.ar_audio_position.pe.index_select(0, self.audio_pos[:b]).to(x.dtype)
        x = x + m.ar_audio_position.alpha * pe
        valid = self.valid[:b]
        valid.index_fill_(1, self.pos, True)
        if self._tk is not None:
            h = fused_layers(self._tk, m, x, self.k[:, :b], self.v[:, :b], valid, self.pos)
        else:
            h = self._torch_layers(x, b)
        tok, arg = sample_rows(m.logits(h), self.seen[:b], self.step_index[:b], self.params.rows(b))
        self.seen[:b].scatter_(1, tok.unsqueeze(1), True)
        self.token[:b].copy_(tok)
        self.out_token[:b].copy_(tok)
        self.out_argmax[:b].copy_(arg)
        self.pos.add_(1).remainder_(self.capacity)
        self.audio_pos[:b].add_(1)
        self.step_index[:b].add_(1)

    def _torch_layers(self, x: torch.Tensor, b: int) -> torch.Tensor:
        """x (b, D) -> (b, D) with stock operators. Under a graph the step attends the whole ring;
        eagerly it attends only the newest ``window`` positions (the rows' longest span)."""
        h, hd = self.n_head, self.head_dim
        if self.use_graph:
            span = None
            mask = self.valid[:b].view(b, 1, 1, -1)
        else:
            w = min(self.capacity, self.window)
            lo = self.pos_host + 1 - w
            span = slice(lo, self.pos_host + 1) if lo >= 0 else (
                torch.arange(lo, self.pos_host + 1, device=self.device) % self.capacity)
            mask = (self.valid[:b, span] if isinstance(span, slice) else self.valid[:b].index_select(1, span))
            mask = mask.view(b, 1, 1, -1)
        x = x.unsqueeze(1)  # (b, 1, D)
        for i, layer in enumerate(self.model.layers):
            q, k, v = (t.view(b, 1, h, hd).transpose(1, 2) for t in layer.qkv(x))  # (b, H, 1, hd)
            self.k[i, :b].index_copy_(2, self.pos, k)
            self.v[i, :b].index_copy_(2, self.pos, v)
            if span is None:
                keys, values = self.k[i, :b], self.v[i, :b]
            elif isinstance(span, slice):
                keys, values = self.k[i, :b, :, span], self.v[i, :b, :, span]
            else:
                keys, values = self.k[i, :b].index_select(2, span), self.v[i, :b].index_select(2, span)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = layer.finish(x, attn.transpose(1, 2).reshape(b, 1, -1))
        return x[:, 0]

    def _bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        return n

    @torch.inference_mode()
    def step(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Decode one token for rows [0, n); returns (sampled, argmax of the penalised logits), (n,) each.
        A bucket without a captured graph runs eagerly (the same operations) and is noted in ``missing``:
        a step never captures, since other threads may be using the device (see :meth:`capture`)."""
        b = self._bucket(n)
        graph = self._graphs.get(b) if self.use_graph else None
        if graph is not None:
            graph.replay()
        else:
            if self.use_graph:
                self.missing.add(b)
            self._step_rows(b)
        self.pos_host = (self.pos_host + 1) % self.capacity
        copy_to_host(((self._host[0, :b], self.out_token[:b]), (self._host[1, :b], self.out_argmax[:b])), self.device)
        host = self._host.numpy()  # read only after copy_to_host waited for the device (CUDA, MPS, ...)
        return host[0, :n].copy(), host[1, :n].copy()

    def _capture(self, b: int) -> torch.cuda.CUDAGraph:
        """Capture the step of ``b`` rows (warm-up runs first; the pool's state is saved around them).
        The caller makes sure no other thread uses the device meanwhile (engine.serving.gate)."""
        saved = [t.clone() for t in (self.token, self.audio_pos, self.step_index, self.pos, self.valid, self.seen,
                                     self.out_token, self.out_argmax)]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                self._step_rows(b)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: an API call another thread makes meanwhile cannot invalidate this capture
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"), \
                torch.inference_mode():
            self._step_rows(b)
        for dst, src in zip((self.token, self.audio_pos, self.step_index, self.pos, self.valid, self.seen,
                             self.out_token, self.out_argmax), saved):
            dst.copy_(src)
        return graph

    def uncaptured(self, limit: int | None = None) -> list[int]:
        """Buckets (up to ``limit`` rows) that have no graph yet."""
        if not self.use_graph:
            return []
        return [b for b in self.buckets if (limit is None or b <= limit) and b not in self._graphs]

    def capture(self, buckets: Sequence[int]) -> int:
        """Capture the graphs of ``buckets`` (their steps replay from then on); returns how many were
        captured. Only while no other thread uses the device: the scheduler calls it from its decode loop
        inside ``DeviceGate.capture``."""
        done = 0
        for b in buckets:
            if self.use_graph and b not in self._graphs:
                self._graphs[b] = self._capture(b)
                self.captures += 1
                done += 1
            self.missing.discard(b)
        return done

    def capture_all(self, limit: int | None = None) -> int:
        """Capture every bucket up front (up to ``limit`` rows); the caller guarantees a quiet device."""
        return self.capture(self.uncaptured(limit))

    # ---- arrivals -----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, rows: Sequence[int], inputs: Sequence[T2SInput], prompts: Sequence[torch.Tensor | None],
                params: Sequence[SamplingParams], min_steps: Sequence[int], keys: Sequence[int],
                ) -> tuple[np.ndarray, np.ndarray]:
        """Run the prefixes (phones + BERT, then the prompt tokens) of new rows into their slots and
        sample their step 0; returns (sampled, argmax) per row. Rows are left-padded to one width."""
        m, dev, n = self.model, self.device, len(rows)
        prefixes, text_lengths, totals = [], [], []
        for item, prompt in zip(inputs, prompts):
            x = m.embed_text(item.phones.to(dev).unsqueeze(0), item.bert.to(dev, self.dtype).unsqueeze(0))[0]
            text_lengths.append(x.shape[0])
            if prompt is not None:
                x = torch.cat([x, m.embed_audio(prompt.to(dev).long().view(1, -1))[0]])
            prefixes.append(x)
            totals.append(x.shape[0])
        width = max(totals)
        if width >= self.capacity:
            raise ValueError(f"a prefix of {width} positions does not fit a slot of {self.capacity}")
        if not self.use_graph and not bool(self.valid.any()):
            # an empty pool stepped eagerly (the CPU): restart the ring so that this prefix starts at WINDOW_STEP;
            # a lone row's window (its span rounded up to WINDOW_STEP) then stays one slice of the cache, not a
            # gather of keys, values and mask in every layer and step, until the ring wraps
            self.pos_host = WINDOW_STEP + width
            self.pos.fill_(self.pos_host)
        xy = torch.stack([F.pad(x, (0, 0, width - x.shape[0], 0)) for x in prefixes])  # (n, W, D)
        # every host number of the prefill in one copy per dtype (each copy from pageable memory waits for the
        # stream): lengths, rows, the rows' sampling parameters and noise keys, their prompt lengths
        ints = host_to_device(np.array(
            [text_lengths, totals, list(rows), [s.top_k for s in params], list(min_steps), list(keys),
             [t - tl for t, tl in zip(totals, text_lengths)]], dtype=np.int64), dev)
        floats = host_to_device(np.array(
            [[s.top_p for s in params], [s.temperature for s in params], [s.repetition_penalty for s in params]],
            dtype=np.float32), dev)
        mask, key_ok = prefix_lm_mask(ints[0], ints[1], width)
        idx = (torch.arange(self.pos_host - width, self.pos_host, device=dev) % self.capacity)  # (W,) ring places
        rows_t = ints[2]
        heads = torch.arange(self.n_head, device=dev)
        where = (rows_t.view(-1, 1, 1), heads.view(1, -1, 1), idx.view(1, 1, -1))
        x = xy
        for i, layer in enumerate(m.layers):
            q, k, v = (t.view(n, width, self.n_head, self.head_dim).transpose(1, 2) for t in layer.qkv(x))
            self.k[i].index_put_(where, k)
            self.v[i].index_put_(where, v)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
            x = layer.finish(x, attn.transpose(1, 2).reshape(n, width, -1))
        self.valid.index_fill_(0, rows_t, False)
        self.valid[rows_t.view(-1, 1), idx.view(1, -1)] = key_ok
        self.seen.index_fill_(0, rows_t, False)
        for r, prompt in zip(rows, prompts):
            if prompt is not None and prompt.numel():
                self.seen[r, prompt.to(dev).long().view(-1)] = True
        p = self.params
        for t, values in ((p.top_k, ints[3]), (p.top_p, floats[0]), (p.temperature, floats[1]),
                          (p.penalty, floats[2]), (p.min_steps, ints[4]), (p.key, ints[5])):
            t[rows_t] = values.to(t.dtype)
        rp = RowParams(*(t[rows_t] for t in (p.top_k, p.top_p, p.temperature, p.penalty, p.min_steps, p.key)))
        zero = torch.zeros(n, dtype=torch.long, device=dev)
        tok, arg = sample_rows(m.logits(x[:, -1]), self.seen[rows_t], zero, rp)
        self.seen[rows_t, tok] = True
        self.token[rows_t] = tok
        self.audio_pos[rows_t] = ints[6].to(self.audio_pos.dtype)  # prompt length: next PE index
        self.step_index[rows_t] = 1
        return tok.cpu().numpy(), arg.cpu().numpy()

    def release(self) -> None:
        """Give back the KV pool and the graphs (after a failed step, before a new decoder is made); the
        decoder is unusable afterwards."""
        empty = torch.zeros(0, device=self.device, dtype=self.dtype)
        self.k, self.v = empty, empty
        self._graphs, self._pool = {}, None
        self.use_graph, self.buckets = False, ()
        self.missing.clear()

    # ---- bookkeeping --------------------------------------------------------------------------
    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Move a row's whole state to another (free) row."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])
        for t in (self.valid, self.token, self.audio_pos, self.step_index, self.seen, self.params.top_k,
                  self.params.top_p, self.params.temperature, self.params.penalty, self.params.min_steps,
                  self.params.key):
            t[dst] = t[src]
        self.valid[src] = False

    @torch.inference_mode()
    def clear(self, row: int) -> None:
        self.valid[row] = False

    # ---- device fallback ----------------------------------------------------------------------
    @torch.inference_mode()
    def to_cpu(self, model: Text2SemanticModel) -> None:
        """Carry on on the CPU in float32 with ``model`` (a CPU copy of the shared model): every state tensor
        (KV cache, rows, sampling parameters) moves, so the rows decoding now continue where they are."""
        def cpu(t: torch.Tensor) -> torch.Tensor:
            return t.to("cpu", torch.float32) if t.is_floating_point() else t.cpu()

        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) and name != "_host":
                setattr(self, name, cpu(value))
        p = self.params
        self.params = RowParams(*(cpu(t) for t in (p.top_k, p.top_p, p.temperature, p.penalty, p.min_steps, p.key)))
        self.model, self.device, self.dtype = model, torch.device("cpu"), torch.float32
        self.use_graph, self._tk, self.buckets, self._graphs, self._pool = False, None, (), {}, None
