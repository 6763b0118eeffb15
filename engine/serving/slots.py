"""The T2S side of the scheduler: a pool of KV-cache slots decoded together, one step at a time.

Responsibilities: (1) hold the decoding state of every slot on the device (KV cache, last token,
positions, seen ids, sampling parameters), (2) prefill arrivals into free slots and run one decode
step over the first ``n`` slots, as a captured CUDA graph per bucketed batch size on CUDA, eagerly
elsewhere. It knows nothing about requests: the scheduler decides which slot holds what.

Cache layout: every slot row has ``capacity`` positions, and all rows write the new position at one
shared ring pointer (the Triton attention kernel takes one position for the whole batch). A prefix
is placed so that it ends right before the pointer; a key's place in the row does not matter to
attention (positions are in the embeddings), only the ``valid`` mask does.

Prefills on CUDA: a prefill's 24 layers are hundreds of small kernels whose launches, not their arithmetic, set
its time (benchmarks/prefill_split.py: 15-35 ms on the host for 3-4 ms on an H100, more while other threads hold
the GIL). So a prefill of ``n`` rows and widest prefix ``w`` replays a graph captured for a bucket (the next of
``PREFILL_ROWS`` rows, ``w`` rounded up to ``PREFILL_WIDTH_STEP``): its rows are left-padded further (padding keys
are masked, as between rows of one prefill already), and the bucket's spare rows write their keys and values to
one scratch row of the pool that nothing reads. Warm-up captures every bucket up to ``PREFILL_WARM_WIDTH``; a bucket
met without a graph runs eagerly at its exact width and is noted in ``prefill_missing`` for the scheduler to
capture.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

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
PREFILL_ROWS = (1, 2, 4, 8, 16)  # rows of the captured prefills (more rows prefill eagerly)
PREFILL_WIDTH_STEP = 64  # a captured prefill's width: the widest prefix rounded up to this
PREFILL_GRAPH_POSITIONS = 8192  # rows x width of the largest captured prefill (bounds their count and memory)
PREFILL_WARM_WIDTH = 1024  # warm-up captures every bucket up to this width: 72 (40 of them took 1.3 s on an H100)


def batch_buckets(slots: int) -> tuple[int, ...]:
    """Captured batch sizes: 1, 2, 4, 8, then about 1.5x apart (16, 24, 32, 48, ...), up to ``slots``."""
    sizes, b = list(SMALL_BUCKETS), 16
    while b < slots:
        sizes.append(b)
        sizes.append(b * 3 // 2)
        b *= 2
    return tuple(sorted({s for s in sizes if s < slots} | {slots}))


@dataclass
class _PrefillGraph:
    """A captured prefill of ``rows`` x ``width`` positions: it reads the decoder's static prefill inputs and
    leaves each row's logits and key mask in its outputs."""

    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # (rows, vocab)
    key_ok: torch.Tensor  # (rows, width)


class SlotDecoder:
    """Decoding state of ``slots`` rows over one shared T2S model (which it never modifies)."""

    def __init__(self, model: Text2SemanticModel, slots: int, capacity: int, use_graph: bool | None = None,
                 attention: str = "auto", prefill_graphs: bool | None = None) -> None:
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
        # captured prefills (CUDA): their spare rows write keys and values to row ``slots``, which nothing reads
        self.prefill_graphs = (self.use_graph and dev.type == "cuda") if prefill_graphs is None else prefill_graphs
        self.scratch = slots
        kv = (d.n_layer, slots + (1 if self.prefill_graphs else 0), d.n_head, capacity, d.head_dim)
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
        self._prefills: dict[tuple[int, int], _PrefillGraph] = {}
        self._prefill_pool = None
        self.prefill_missing: set[tuple[int, int]] = set()  # buckets prefilled eagerly for want of a graph
        self.prefill_captures = 0
        if self.prefill_graphs:  # the captured prefills' inputs (each bucket reads their first positions)
            self._pf_x = torch.zeros(PREFILL_GRAPH_POSITIONS, d.hidden_dim, device=dev, dtype=dt)
            self._pf_ints = torch.zeros(3 * PREFILL_ROWS[-1] + PREFILL_GRAPH_POSITIONS, dtype=torch.long, device=dev)

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
    def prefill_bucket(self, n: int, width: int) -> tuple[int, int] | None:
        """The captured prefill that ``n`` rows of widest prefix ``width`` would replay, or None (eager)."""
        if not self.prefill_graphs:
            return None
        rows = next((r for r in PREFILL_ROWS if r >= n), None)
        w = math.ceil(width / PREFILL_WIDTH_STEP) * PREFILL_WIDTH_STEP
        if rows is None or w >= self.capacity or rows * w > PREFILL_GRAPH_POSITIONS:
            return None
        return rows, w

    def _prefix_layers(self, xy: torch.Tensor, ints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layers over left-padded prefixes ``xy`` (R, W, D), writing each row's keys and values into its
        slot at the ring places given; ``ints`` holds R text lengths, R prefix lengths, R slot rows, then the W
        ring places. Returns (logits of each row's last position, key_ok (R, W)). Graph-safe."""
        m, (n, width) = self.model, xy.shape[:2]
        mask, key_ok = prefix_lm_mask(ints[:n], ints[n:2 * n], width)
        mask = mask.unsqueeze(1)
        heads = torch.arange(self.n_head, device=self.device)
        where = (ints[2 * n:3 * n].view(-1, 1, 1), heads.view(1, -1, 1), ints[3 * n:3 * n + width].view(1, 1, -1))
        x = xy
        for i, layer in enumerate(m.layers):
            q, k, v = (t.view(n, width, self.n_head, self.head_dim).transpose(1, 2) for t in layer.qkv(x))
            self.k[i].index_put_(where, k)
            self.v[i].index_put_(where, v)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = layer.finish(x, attn.transpose(1, 2).reshape(n, width, -1))
        return m.logits(x[:, -1]), key_ok

    def _embed_prefixes(self, xy: torch.Tensor, inputs: Sequence[T2SInput], prompts: Sequence[torch.Tensor | None],
                        places: torch.Tensor, n_text: int) -> None:
        """Write the rows' embedded prefixes (phones + BERT, then prompt tokens, each with its positions) into
        ``xy`` (R, W, D), zeros elsewhere, in a few batched kernels; ``places`` holds the text positions, their
        flat places in ``xy``, then the prompt positions and their flat places (``n_text`` text positions)."""
        m, dev = self.model, self.device
        flat = xy.view(-1, xy.shape[-1])
        flat.zero_()
        n_audio = (places.numel() - 2 * n_text) // 2
        text = m.ar_text_embedding(torch.cat([item.phones.to(dev) for item in inputs]))
        bert = torch.cat([item.bert.to(dev, self.dtype) for item in inputs], dim=1)
        x = text + m.bert_proj(bert.t())
        flat.index_copy_(0, places[n_text:2 * n_text], self._positioned(m.ar_text_position, x, places[:n_text]))
        if n_audio:
            tokens = torch.cat([p.to(dev).long().view(-1) for p in prompts if p is not None and p.numel()])
            x = m.ar_audio_embedding(tokens)
            a = 2 * n_text
            flat.index_copy_(0, places[a + n_audio:], self._positioned(m.ar_audio_position, x, places[a:a + n_audio]))

    @staticmethod
    def _positioned(position, x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """``x + alpha * PE[at]`` (what ScaledPosition adds to a row starting at 0, for rows of any start)."""
        table = position.pe if x.shape[0] <= position.pe.shape[0] else position.encodings(0, x.shape[0])
        return x + position.alpha * table.index_select(0, at).to(x.dtype)

    @torch.inference_mode()
    def prefill(self, rows: Sequence[int], inputs: Sequence[T2SInput], prompts: Sequence[torch.Tensor | None],
                params: Sequence[SamplingParams], min_steps: Sequence[int], keys: Sequence[int],
                ) -> tuple[np.ndarray, np.ndarray]:
        """Run the prefixes (phones + BERT, then the prompt tokens) of new rows into their slots and
        sample their step 0; returns (sampled, argmax) per row. Rows are left-padded to one width (on CUDA
        to their bucket's, when it has a captured graph)."""
        dev, n = self.device, len(rows)
        text_lengths = [item.phones.shape[0] for item in inputs]
        prompt_lengths = [p.numel() if p is not None else 0 for p in prompts]
        totals = [t + p for t, p in zip(text_lengths, prompt_lengths)]
        width = max(totals)
        if width >= self.capacity:
            raise ValueError(f"a prefix of {width} positions does not fit a slot of {self.capacity}")
        if not self.use_graph and not bool(self.valid.any()):
            # an empty pool stepped eagerly (the CPU): restart the ring so that this prefix starts at WINDOW_STEP;
            # a lone row's window (its span rounded up to WINDOW_STEP) then stays one slice of the cache, not a
            # gather of keys, values and mask in every layer and step, until the ring wraps
            self.pos_host = WINDOW_STEP + width
            self.pos.fill_(self.pos_host)
        bucket = self.prefill_bucket(n, width)
        graph = self._prefills.get(bucket) if bucket is not None else None
        if bucket is not None and graph is None:
            self.prefill_missing.add(bucket)
        r, w = bucket if graph is not None else (n, width)
        spare = r - n  # a bucket's rows beyond these: one masked position each, written to the scratch row
        # every host number of the prefill in one copy per dtype (each copy from pageable memory waits for the
        # stream): the layers' inputs (lengths, slot rows, ring places), the rows' sampling parameters and
        # noise keys and prompt lengths, then where each prefix position goes in the padded batch
        starts = [i * w + w - t for i, t in enumerate(totals)]
        text_at = [np.arange(t) for t in text_lengths]
        prompt_at = [np.arange(p) for p in prompt_lengths]
        ints = host_to_device(np.concatenate([
            text_lengths, [1] * spare, totals, [1] * spare, list(rows), [self.scratch] * spare,
            np.arange(self.pos_host - w, self.pos_host) % self.capacity,
            [s.top_k for s in params], list(min_steps), list(keys), prompt_lengths,
            *text_at, *(s + a for s, a in zip(starts, text_at)),
            *prompt_at, *(s + t + a for s, t, a in zip(starts, text_lengths, prompt_at)),
            *(np.full(p, row) for row, p in zip(rows, prompt_lengths))]).astype(np.int64), dev)
        floats = host_to_device(np.array(
            [[s.top_p for s in params], [s.temperature for s in params], [s.repetition_penalty for s in params]],
            dtype=np.float32), dev)
        layer_ints = ints[:3 * r + w]
        rows_t, idx = layer_ints[2 * r:2 * r + n], layer_ints[3 * r:]
        top_k, min_steps_t, keys_t, prompt_len = ints[3 * r + w:3 * r + w + 4 * n].view(4, n)
        n_text, n_audio = sum(text_lengths), sum(prompt_lengths)
        places = ints[3 * r + w + 4 * n:3 * r + w + 4 * n + 2 * (n_text + n_audio)]
        prompt_rows = ints[3 * r + w + 4 * n + 2 * (n_text + n_audio):]
        if graph is not None:
            self._pf_ints[:3 * r + w].copy_(layer_ints)
            self._embed_prefixes(self._pf_x[:r * w].view(r, w, -1), inputs, prompts, places, n_text)
            graph.graph.replay()
            logits, key_ok = graph.logits[:n], graph.key_ok[:n]
        else:
            xy = torch.empty(n, w, self.model.dims.hidden_dim, device=dev, dtype=self.dtype)
            self._embed_prefixes(xy, inputs, prompts, places, n_text)
            logits, key_ok = self._prefix_layers(xy, layer_ints)
        self.valid.index_fill_(0, rows_t, False)
        self.valid[rows_t.view(-1, 1), idx.view(1, -1)] = key_ok
        self.seen.index_fill_(0, rows_t, False)
        if n_audio:  # the prompt's ids count as seen (the repetition penalty)
            self.seen[prompt_rows, torch.cat([p.to(dev).long().view(-1) for p in prompts
                                              if p is not None and p.numel()])] = True
        p = self.params
        for t, values in ((p.top_k, top_k), (p.top_p, floats[0]), (p.temperature, floats[1]),
                          (p.penalty, floats[2]), (p.min_steps, min_steps_t), (p.key, keys_t)):
            t[rows_t] = values.to(t.dtype)
        rp = RowParams(*(t[rows_t] for t in (p.top_k, p.top_p, p.temperature, p.penalty, p.min_steps, p.key)))
        zero = torch.zeros(n, dtype=torch.long, device=dev)
        tok, arg = sample_rows(logits, self.seen[rows_t], zero, rp)
        self.seen[rows_t, tok] = True
        self.token[rows_t] = tok
        self.audio_pos[rows_t] = prompt_len.to(self.audio_pos.dtype)  # prompt length: next PE index
        self.step_index[rows_t] = 1
        out = torch.stack([tok, arg]).cpu().numpy()  # one wait for the device
        return out[0], out[1]

    def _capture_prefill(self, rows: int, width: int) -> _PrefillGraph:
        """Capture the prefill of bucket (rows, width) over the static inputs, its runs writing only the scratch
        row. The caller makes sure no other thread uses the device meanwhile (engine.serving.gate)."""
        dev = self.device
        xy = self._pf_x[:rows * width].view(rows, width, -1)
        ints = self._pf_ints[:3 * rows + width]
        ints[:2 * rows].fill_(1)  # every row one position long, in the scratch row
        ints[2 * rows:3 * rows].fill_(self.scratch)
        ints[3 * rows:].copy_(torch.arange(width, device=dev))
        xy.zero_()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                self._prefix_layers(xy, ints)
        torch.cuda.current_stream(dev).wait_stream(stream)
        if self._prefill_pool is None:
            self._prefill_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._prefill_pool, stream=stream, capture_error_mode="thread_local"), \
                torch.inference_mode():
            logits, key_ok = self._prefix_layers(xy, ints)
        return _PrefillGraph(graph, logits, key_ok)

    def uncaptured_prefills(self, max_width: int = PREFILL_WARM_WIDTH) -> list[tuple[int, int]]:
        """Prefill buckets up to ``max_width`` positions that have no graph yet (none off CUDA)."""
        if not self.prefill_graphs:
            return []
        buckets = {self.prefill_bucket(r, w) for r in PREFILL_ROWS
                   for w in range(PREFILL_WIDTH_STEP, max_width + 1, PREFILL_WIDTH_STEP)}
        return sorted(b for b in buckets - {None} if b not in self._prefills)

    def capture_prefills(self, buckets: Sequence[tuple[int, int]]) -> int:
        """Capture the prefills of ``buckets`` (their prefills replay from then on); returns how many were
        captured. As :meth:`capture`: only inside ``DeviceGate.capture``."""
        done = 0
        for bucket in buckets:
            if self.prefill_graphs and bucket not in self._prefills:
                self._prefills[bucket] = self._capture_prefill(*bucket)
                self.prefill_captures += 1
                done += 1
            self.prefill_missing.discard(bucket)
        return done

    def release(self) -> None:
        """Give back the KV pool and the graphs (after a failed step, before a new decoder is made); the
        decoder is unusable afterwards."""
        empty = torch.zeros(0, device=self.device, dtype=self.dtype)
        self.k, self.v = empty, empty
        self._graphs, self._pool = {}, None
        self._prefills, self._prefill_pool = {}, None
        self.use_graph, self.buckets, self.prefill_graphs = False, (), False
        self.missing.clear()
        self.prefill_missing.clear()

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
        self.prefill_graphs, self._prefills, self._prefill_pool = False, {}, None
        self.prefill_missing.clear()
