"""A static-shape T2S decoder: preallocated KV cache, on-device sampling, optional CUDA graph.

Same function as :mod:`engine.t2s.decoding` (same tokens in float32 with greedy sampling, same
stop rules and result quirks), shaped for speed:

* every decode step has fixed tensor shapes (KV cache of a bucketed capacity, a validity mask
  instead of a growing sequence, finished rows kept and ignored rather than removed), so one
  step can be captured in a CUDA graph and replayed;
* sampling runs on the device in float32: the repetition penalty uses a per-row "seen" mask
  (the official penalty applies once per distinct id, so a mask is exact), the early EOS ban
  masks the EOS logit instead of slicing it off (same distribution; the random stream differs);
* the host looks at the stop flags only every ``sync_every`` steps.

A :class:`FastT2S` belongs to one model on one device and owns its captured graphs (an LRU
bounded by ``max_graphs``); requests take turns on it (a lock), each with its own generator.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.models.t2s import Text2SemanticModel
from engine.t2s.decoding import (
    SamplingParams,
    StopRules,
    T2SInput,
    T2SOutput,
    prefix_lm_mask,
)
from engine.t2s.kernels import choose_attention

NEG_INF = float("-inf")


def _drain(gen: Generator) -> object:
    """Run a generator to its end and return its return value."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def _bucket(n: int, step: int = 256) -> int:
    return ((n + step - 1) // step) * step


def fused_layers(tk, model: Text2SemanticModel, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 valid: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x (B, D) -> (B, D) through every block with the Triton kernels (``tk``).

    k, v: (L, B, H, cap, hd) caches (``k[i]`` contiguous); valid (B, cap) keys each row may attend;
    pos (1,) the cache position of the new input, written by the attention kernel. Each block's
    second residual add + LayerNorm is folded into the next block's QKV projection (the GEMV
    prologue); the last one runs on its own.
    """
    small = x.shape[0] <= tk.MAX_GEMV_ROWS

    def linear(inp, lin_w, lin_b, relu=False, residual=None, norm=None):
        if small:
            return tk.gemv(inp, lin_w, lin_b, relu, residual, norm)
        if norm is not None:
            inp = tk.add_layer_norm(inp, residual, norm)
        out = torch._addmm_activation(lin_b, inp, lin_w.t()) if relu else F.linear(inp, lin_w, lin_b)
        return out, inp

    pending: tuple[torch.Tensor, torch.nn.LayerNorm] | None = None  # (residual, norm) owed by x
    for i, layer in enumerate(model.layers):
        attn_mod = layer.self_attn
        qkv, x = linear(x, attn_mod.in_proj_weight, attn_mod.in_proj_bias,
                        residual=pending[0] if pending else None, norm=pending[1] if pending else None)
        attn = tk.decode_attention(qkv, k[i], v[i], valid, pos)  # (B, D)
        h, _ = linear(attn, attn_mod.out_proj.weight, attn_mod.out_proj.bias)
        hidden, x = linear(h, layer.linear1.weight, layer.linear1.bias, relu=True, residual=x, norm=layer.norm1)
        f, _ = linear(hidden, layer.linear2.weight, layer.linear2.bias)
        x, pending = f, (x, layer.norm2)
    return tk.add_layer_norm(x, pending[0], pending[1])


@dataclass
class _State:
    """Static buffers of one (batch, capacity) shape; graphs read and write only these."""

    k: torch.Tensor  # (L, B, H, cap, hd)
    v: torch.Tensor
    valid: torch.Tensor  # (B, 1, 1, cap) bool: key positions a query may attend
    bias: torch.Tensor  # (B, 1, 1, cap) float32: 0 where valid, -inf elsewhere
    token: torch.Tensor  # (B, 1) long: last sampled token (next input)
    pos: torch.Tensor  # (1,) long: cache slot of the next input
    audio_pos: torch.Tensor  # (1,) long: positional index of the next input in the semantic stream
    step: torch.Tensor  # (1,) long: decode step index (official idx) of the logits being sampled
    seen: torch.Tensor  # (B, V) bool: ids present in the row's history
    params: torch.Tensor  # (4,) float: top_p, temperature, repetition_penalty, unused
    min_steps: torch.Tensor  # (1,) long
    out_token: torch.Tensor  # (B, 1) long: sampled this step
    out_argmax: torch.Tensor  # (B,) long: argmax of the penalised logits this step
    noise: torch.Tensor  # (B, V) float: Exp(1) draws for the race
    hist_token: torch.Tensor  # (B, cap) long: sampled token of every step
    hist_argmax: torch.Tensor  # (B, cap) long: penalised-logits argmax of every step
    top_k: int = 15  # static per captured graph: part of the graph key
    use_top_p: bool = False  # static per captured graph: top_p < 1


class FastT2S:
    """Fast decoding for one model on one device (owns its CUDA graphs; requests take turns)."""

    def __init__(self, model: Text2SemanticModel, use_cuda_graph: bool | None = None,
                 sync_every: int = 8, max_graphs: int = 8, attention: str = "auto",
                 compile_step: bool = False) -> None:
        if attention not in ("auto", "triton", "matmul", "sdpa"):
            raise ValueError(f"attention must be auto, triton, matmul or sdpa, not {attention!r}")
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        dims = model.dims  # "auto" takes the Triton kernels only where they run and fit this model's widths
        attention = choose_attention(attention, self.device, dims.hidden_dim, dims.n_head, dims.ffn_dim)
        self.attention = attention
        # fused Triton kernels for the step (attention with the cache write, add + LayerNorm)
        self._tk = importlib.import_module("engine.t2s.kernels.triton_step") if attention == "triton" else None
        # optional: let torch.compile fuse the step's small kernels (first capture then takes minutes)
        self._step = torch.compile(self._decode_step, dynamic=False) if compile_step else self._decode_step
        self.use_graph = (self.device.type == "cuda") if use_cuda_graph is None else use_cuda_graph
        self.sync_every = max(1, sync_every)
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, tuple[_State, torch.cuda.CUDAGraph | None]] = OrderedDict()
        self._lock = threading.Lock()
        d = model.dims
        self._n_head, self._hd, self._n_layer, self._vocab = d.n_head, d.head_dim, d.n_layer, d.vocab_size

    # ---- buffers -----------------------------------------------------------------------------
    def _new_state(self, batch: int, cap: int, top_k: int, use_top_p: bool) -> _State:
        dev, dt = self.device, self.dtype
        kv_shape = (self._n_layer, batch, self._n_head, cap, self._hd)
        return _State(
            k=torch.zeros(kv_shape, device=dev, dtype=dt), v=torch.zeros(kv_shape, device=dev, dtype=dt),
            valid=torch.zeros(batch, 1, 1, cap, dtype=torch.bool, device=dev),
            bias=torch.full((batch, 1, 1, cap), NEG_INF, dtype=torch.float32, device=dev),
            token=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            pos=torch.zeros(1, dtype=torch.long, device=dev), audio_pos=torch.zeros(1, dtype=torch.long, device=dev),
            step=torch.zeros(1, dtype=torch.long, device=dev),
            seen=torch.zeros(batch, self._vocab, dtype=torch.bool, device=dev),
            params=torch.zeros(4, dtype=torch.float32, device=dev),
            min_steps=torch.zeros(1, dtype=torch.long, device=dev),
            out_token=torch.zeros(batch, 1, dtype=torch.long, device=dev),
            out_argmax=torch.zeros(batch, dtype=torch.long, device=dev),
            noise=torch.ones(batch, self._vocab, dtype=torch.float32, device=dev),
            hist_token=torch.zeros(batch, cap, dtype=torch.long, device=dev),
            hist_argmax=torch.zeros(batch, cap, dtype=torch.long, device=dev),
            top_k=min(top_k, self._vocab), use_top_p=use_top_p,
        )

    # ---- the math ----------------------------------------------------------------------------
    def _sample(self, st: _State, h_last: torch.Tensor) -> None:
        """Official sampler on the device: penalty, top-p, temperature, top-k, race (in place)."""
        logits = self.model.logits(h_last).float()  # (B, V)
        top_p, temperature, penalty = st.params[0], st.params[1], st.params[2]
        logits = torch.where(st.seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
        eos_banned = st.step < st.min_steps  # (1,)
        eos_col = torch.zeros_like(logits[:1])
        eos_col[:, -1] = 1.0
        logits = logits.masked_fill((eos_col > 0) & eos_banned, NEG_INF)
        st.out_argmax.copy_(logits.argmax(dim=-1))
        if st.use_top_p:
            sorted_logits, sorted_idx = torch.sort(logits, descending=True)
            cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
            remove_sorted = cum > top_p
            remove_sorted[:, 0] = False
            logits = logits.masked_fill(remove_sorted.scatter(1, sorted_idx, remove_sorted), NEG_INF)
        logits = logits / torch.clamp(temperature, min=1e-5)
        pivot = torch.topk(logits, st.top_k, dim=-1).values[:, -1:]  # ties at the pivot survive
        logits = torch.where(logits < pivot, NEG_INF, logits)
        probs = F.softmax(logits, dim=-1)
        st.out_token.copy_(torch.argmax(probs / st.noise, dim=-1, keepdim=True))
        st.hist_token.index_copy_(1, st.step, st.out_token)
        st.hist_argmax.index_copy_(1, st.step, st.out_argmax.unsqueeze(1))

    def _decode_step(self, st: _State) -> None:
        """One token for every row, reading and writing only the state's buffers."""
        m = self.model
        x = m.ar_audio_embedding(st.token)  # (B, 1, D)
        pe = m.ar_audio_position.pe.index_select(0, st.audio_pos).to(x.dtype)  # (1, D)
        x = x + m.ar_audio_position.alpha * pe
        st.valid.index_fill_(3, st.pos, True)
        if self._tk is not None:
            self._sample(st, self._fused_layers(st, x[:, 0]))
        else:
            self._sample(st, self._torch_layers(st, x)[:, -1])
        st.seen.scatter_(1, st.out_token, True)
        st.token.copy_(st.out_token)
        st.pos += 1
        st.audio_pos += 1
        st.step += 1

    def _fused_layers(self, st: _State, x: torch.Tensor) -> torch.Tensor:
        return fused_layers(self._tk, self.model, x, st.k, st.v, st.valid.view(x.shape[0], -1), st.pos)

    def _torch_layers(self, st: _State, x: torch.Tensor) -> torch.Tensor:
        """x (B, 1, D) -> (B, 1, D) through every block with stock PyTorch operators.

        Without a graph the step may look at the host-side length and attend only the filled
        part of the cache (much less work on CPUs); under a graph it attends the whole capacity.
        """
        b = x.shape[0]
        st.bias.index_fill_(3, st.pos, 0.0)
        scale = self._hd ** -0.5
        end = st.k.shape[3] if self.use_graph else int(st.pos) + 1
        valid, bias = st.valid[..., :end], st.bias[..., :end]
        for i, layer in enumerate(self.model.layers):
            q, k, v = layer.qkv(x)
            q = q.view(b, 1, self._n_head, self._hd).transpose(1, 2)  # (B, H, 1, hd)
            st.k[i].index_copy_(2, st.pos, k.view(b, 1, self._n_head, self._hd).transpose(1, 2))
            st.v[i].index_copy_(2, st.pos, v.view(b, 1, self._n_head, self._hd).transpose(1, 2))
            keys, values = st.k[i][:, :, :end], st.v[i][:, :, :end]
            if self.attention == "sdpa":
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=valid)
            else:  # one query: two batched GEMVs and a float32 softmax
                scores = torch.matmul(q, keys.transpose(-1, -2)).float() * scale + bias  # (B, H, 1, end)
                attn = torch.matmul(F.softmax(scores, dim=-1).to(q.dtype), values)  # (B, H, 1, hd)
            x = layer.finish(x, attn.transpose(1, 2).reshape(b, 1, -1))
        return x

    def _prefill(self, st: _State, xy: torch.Tensor, mask: torch.Tensor) -> None:
        """Full forward over the prefix (text + prompt tokens) into the cache, then sample step 0."""
        b, s, _ = xy.shape
        x = xy
        for i, layer in enumerate(self.model.layers):
            q, k, v = (t.view(b, s, self._n_head, self._hd).transpose(1, 2) for t in layer.qkv(x))
            st.k[i, :, :, :s] = k
            st.v[i, :, :, :s] = v
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = layer.finish(x, attn.transpose(1, 2).reshape(b, s, -1))
        self._sample(st, x[:, -1])

    # ---- graphs ------------------------------------------------------------------------------
    def _state_for(self, batch: int, cap: int, params: SamplingParams) -> tuple[_State, torch.cuda.CUDAGraph | None]:
        key = (batch, cap, params.top_k, params.top_p < 1.0)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key]
        st = self._new_state(batch, cap, params.top_k, params.top_p < 1.0)
        graph = None
        if self.use_graph:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(3):  # warm up kernels and workspaces outside the capture
                    self._step(st)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream), torch.inference_mode():
                self._step(st)
        self._graphs[key] = (st, graph)
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return st, graph

    def warm_up(self, batch_sizes: Sequence[int] = (1,), capacities: Sequence[int] = (512,),
                params: SamplingParams = SamplingParams()) -> None:
        """Capture graphs ahead of the first request (each new shape costs a capture otherwise)."""
        with self._lock:
            for b in batch_sizes:
                for c in capacities:
                    self._state_for(b, _bucket(c), params)

    # ---- public API (same results as T2SDecoder) ----------------------------------------------
    def decode_naive(self, item: T2SInput, prompt: torch.Tensor | None, params: SamplingParams = SamplingParams(),
                     rules: StopRules = StopRules(), generator: torch.Generator | None = None) -> T2SOutput:
        return _drain(self._run([item], prompt, params, rules, generator, naive=True, stream=False))[0]

    def naive_steps(self, item: T2SInput, prompt: torch.Tensor | None, params: SamplingParams = SamplingParams(),
                    rules: StopRules = StopRules(), generator: torch.Generator | None = None) -> Iterator[int]:
        """Like :meth:`T2SDecoder.naive_steps`: yield kept tokens as they are confirmed (every ``sync_every``
        steps); the return value is the T2SOutput. The decoder is held until the generator finishes."""
        results = yield from self._run([item], prompt, params, rules, generator, naive=True, stream=True)
        return results[0]

    def decode_batch(self, items: Sequence[T2SInput], prompt: torch.Tensor | None,
                     params: SamplingParams = SamplingParams(), rules: StopRules = StopRules(),
                     generator: torch.Generator | None = None) -> list[T2SOutput]:
        if prompt is None:  # the official batched loop decodes reference-free items one by one
            return [self.decode_naive(it, None, params, rules, generator) for it in items]
        return _drain(self._run(list(items), prompt, params, rules, generator, naive=False, stream=False))

    @torch.inference_mode()
    def _run(self, items: list[T2SInput], prompt: torch.Tensor | None, params: SamplingParams,
             rules: StopRules, generator: torch.Generator | None, naive: bool,
             stream: bool) -> Generator[int, None, list[T2SOutput]]:
        """Decode; with ``stream`` (one row) yield each token once it is certain to be kept."""
        m, dev = self.model, self.device
        bsz = len(items)
        prefixes = [m.embed_text(it.phones.to(dev).unsqueeze(0), it.bert.to(dev, self.dtype).unsqueeze(0))[0]
                    for it in items]
        tx = max(p.shape[0] for p in prefixes)
        x = torch.stack([F.pad(p, (0, 0, tx - p.shape[0], 0)) for p in prefixes])
        if prompt is not None:
            y0 = prompt.to(dev).long().view(1, -1).expand(bsz, -1)
            xy = torch.cat([x, m.embed_audio(y0)], dim=1)
        else:
            y0 = torch.zeros(bsz, 0, dtype=torch.long, device=dev)
            xy = x
        prefix_len, s = y0.shape[1], xy.shape[1]
        limit = rules.max_steps if rules.early_stop_num == -1 else min(rules.max_steps, rules.early_stop_num + 2)
        cap = _bucket(s + limit)
        lengths = torch.tensor([p.shape[0] for p in prefixes], device=dev)
        mask, key_ok = prefix_lm_mask(lengths, lengths + prefix_len, s)
        mask = mask.unsqueeze(1)  # (B, 1, S, S)
        with self._lock:
            st, graph = self._state_for(bsz, cap, params)
            st.k.zero_()
            st.v.zero_()
            st.valid.zero_()
            st.valid[:, 0, 0, :s] = key_ok
            st.bias.copy_(torch.where(st.valid, 0.0, NEG_INF))
            st.seen.zero_()
            if prefix_len:
                st.seen.scatter_(1, y0, True)
            st.params.copy_(torch.tensor([params.top_p, params.temperature, params.repetition_penalty, 0.0],
                                         device=dev))
            st.min_steps.fill_(rules.min_steps)
            st.pos.fill_(s)
            st.audio_pos.fill_(prefix_len)
            st.step.fill_(0)
            self._draw(st, generator)
            self._prefill(st, xy, mask)
            st.seen.scatter_(1, st.out_token, True)
            st.token.copy_(st.out_token)
            st.step.fill_(1)
            n, yielded = 1, 0
            results = self._collect(st, 1, y0, rules, naive, done_only=True)
            while results is None:
                if stream:  # no row has stopped within the first n steps: all n tokens are kept
                    yield from st.hist_token[0, yielded:n].tolist()
                    yielded = n
                for _ in range(min(self.sync_every, limit - n)):
                    self._draw(st, generator)
                    if graph is not None:
                        graph.replay()
                    else:
                        self._step(st)
                    n += 1
                results = self._collect(st, n, y0, rules, naive, done_only=n < limit)
            if stream:
                yield from results[0].sequence[prefix_len + yielded:].tolist()
        return results

    def _draw(self, st: _State, generator: torch.Generator | None) -> None:
        st.noise.exponential_(1, generator=generator)

    def _collect(self, st: _State, n: int, y0: torch.Tensor, rules: StopRules, naive: bool,
                 done_only: bool) -> list[T2SOutput] | None:
        """Apply the official stop rules to the first n steps; None while some row is still running."""
        sampled = st.hist_token[:, :n].cpu()  # (B, n)
        top = st.hist_argmax[:, :n].cpu()
        y0 = y0.cpu()
        eos = self.model.dims.eos
        prefix_len = y0.shape[1]
        n = sampled.shape[1]
        outputs: list[T2SOutput] = []
        for r in range(sampled.shape[0]):
            hit = ((sampled[r] == eos) | (top[r] == eos)).nonzero()
            eos_at = int(hit[0, 0]) if hit.numel() else None
            early_at = rules.early_stop_num if rules.early_stop_num != -1 else None  # first idx with len > es
            cap_at = rules.max_steps - 1
            ends = [e for e in (eos_at, early_at, cap_at) if e is not None and e < n]
            if not ends:
                if done_only:
                    return None
                raise RuntimeError("decoding ran out of steps without a stop")  # cannot happen: limit covers it
            idx = min(ends)
            kept = sampled[r, : idx + 1]
            stop = "eos" if idx == eos_at else ("early_stop" if idx == early_at else "max_steps")
            if naive:
                seq = torch.cat([y0[r], kept[:-1] if stop == "eos" else kept])
                if seq.numel() == 0:
                    seq = torch.zeros(1, dtype=torch.long)
                steps = idx if prefix_len else 0
            else:
                seq = torch.cat([y0[r], kept[:-1]])
                steps = idx
            outputs.append(T2SOutput(tokens=seq if steps == 0 else seq[-steps:], steps=steps, stop=stop,
                                     sequence=seq))
        return outputs
