"""Autoregressive decoding of semantic tokens with a :class:`Text2SemanticModel`.

Responsibilities: (1) run the prefix-LM attention with a per-request KV cache, (2) sample tokens
with the official order of penalties and filters (``AR/models/utils.py`` ``sample``) and the official stop
rules (``AR/models/t2s_model.py`` ``Text2SemanticDecoder.infer_panel_*``). The shared
model is never mutated; every request gets its own :class:`T2SDecoder`.

Two loops mirror the official ones: :meth:`T2SDecoder.naive_steps` (one sentence, also the
streaming loop) and :meth:`T2SDecoder.decode_batch` (left-padded batch whose finished rows leave
the batch). Their results keep the official quirks (see :class:`T2SOutput`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.errors import OptionsError
from engine.models.t2s import Text2SemanticModel

LogitsHook = Callable[[int, torch.Tensor], None]  # (step, raw logits (B, V)) for tests and tools


@dataclass(frozen=True)
class SamplingParams:
    """Token sampling settings (official defaults of ``TTS.run``)."""

    top_k: int = 15  # keep the k most likely tokens (1 = greedy)
    top_p: float = 1.0  # nucleus filter on the un-tempered logits; 1 disables it
    temperature: float = 1.0  # logits are divided by max(temperature, 1e-5)
    repetition_penalty: float = 1.35  # applied once per distinct id already in the sequence

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise OptionsError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise OptionsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise OptionsError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise OptionsError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty!r}")


@dataclass(frozen=True)
class StopRules:
    """When decoding ends (official values)."""

    early_stop_num: int = 2700  # hz * max_sec of the checkpoint; -1 disables
    max_steps: int = 1500  # hard cap on iterations (60 s of audio)
    min_steps: int = 11  # EOS is impossible for steps 0..min_steps-1

    def __post_init__(self) -> None:
        if self.early_stop_num < -1 or self.max_steps < 1 or self.min_steps < 0:
            raise OptionsError(f"invalid stop rules {self}")


@dataclass(frozen=True)
class T2SInput:
    """One sentence: phone ids ``(T,)`` and BERT features ``(1024, T)`` (prompt first, then target)."""

    phones: torch.Tensor
    bert: torch.Tensor

    def __post_init__(self) -> None:
        if self.phones.ndim != 1 or self.bert.ndim != 2 or self.bert.shape[1] != self.phones.shape[0]:
            raise OptionsError(
                f"phones (T,) and bert (1024, T) must agree, got {tuple(self.phones.shape)} and {tuple(self.bert.shape)}"
            )
        if self.phones.numel() == 0:
            raise OptionsError("a T2S input needs at least one phone")


@dataclass(frozen=True)
class T2SOutput:
    """The result for one sentence.

    tokens: what the official ``TTS.run`` hands to SoVITS, ``sequence[-steps:]`` (the whole
      sequence when ``steps == 0``, i.e. reference-free). Official quirk kept: after an early stop
      the naive loop drops the first generated token and the batched loop the last one.
    steps: the official ``idx`` (iteration at which decoding ended).
    stop: "eos", "early_stop" or "max_steps".
    sequence: the official ``y`` row (prompt tokens included, reference-free excepted).
    """

    tokens: torch.Tensor
    steps: int
    stop: str
    sequence: torch.Tensor


def penalize_repeats(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive / multiply negative logits of every id in ``history`` (once per id)."""
    if penalty == 1.0 or history.shape[1] == 0:
        return logits
    history = history.long()
    score = torch.gather(logits, 1, history)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter(1, history, score)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """top-p (no shift: the crossing token goes too), temperature, then top-k (ties survive)."""
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True)
        cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove_sorted = cum > params.top_p
        remove_sorted[:, 0] = False
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    logits = logits / max(params.temperature, 1e-5)
    k = min(params.top_k, logits.shape[-1])
    pivot = torch.topk(logits, k).values[:, -1:]
    return torch.where(logits < pivot, float("-inf"), logits)


def race_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Exponential-race draw ``argmax(p / q), q ~ Exp(1)``: (B, V) -> (B, 1) long."""
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return torch.argmax(probs / q, dim=-1, keepdim=True)


def prefix_lm_mask(text_lengths: torch.Tensor, total_lengths: torch.Tensor, width: int,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix-LM attention mask of left-padded rows: ``(mask (B, W, W), key_ok (B, W))``, True = may attend.

    Row b holds padding, then its ``text_lengths[b]`` text positions, then its semantic positions, up to
    ``total_lengths[b]`` real positions ending at ``width``. Text queries see the row's text; semantic
    queries see the text and the semantic positions up to their own; padding keys are never seen
    (``key_ok``); padding queries see the row's text (no empty softmax row).
    """
    dev = total_lengths.device
    start = (width - total_lengths).view(-1, 1, 1)  # (B, 1, 1) first real position
    text_end = start + text_lengths.view(-1, 1, 1).to(dev)
    q = torch.arange(width, device=dev).view(1, -1, 1)
    k = torch.arange(width, device=dev).view(1, 1, -1)
    text_key = k < text_end
    mask = ((k <= q) | text_key) & ~((q < text_end) & ~text_key) & (k >= start)  # (B, W, W)
    key_ok = torch.arange(width, device=dev).view(1, -1) >= start.view(-1, 1)  # (B, W)
    return mask, key_ok


class KVCache:
    """Per-layer keys and values ``(B, H, capacity, head_dim)``, grown in blocks."""

    BLOCK = 256

    def __init__(self, n_layer: int) -> None:
        self.k: list[torch.Tensor] = [torch.empty(0)] * n_layer
        self.v: list[torch.Tensor] = [torch.empty(0)] * n_layer
        self.length = 0

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(B, H, T, hd)`` at the current end; return the filled views."""
        end = self.length + k.shape[2]
        if self.k[layer].numel() == 0 or end > self.k[layer].shape[2]:
            cap = end + self.BLOCK
            for buf in (self.k, self.v):
                old = buf[layer]
                new = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
                if old.numel():
                    new[:, :, : self.length] = old[:, :, : self.length]
                buf[layer] = new
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]


class T2SDecoder:
    """Decoding state for one request over a shared model (which it never modifies)."""

    def __init__(self, model: Text2SemanticModel, generator: torch.Generator | None = None,
                 on_logits: LogitsHook | None = None) -> None:
        self.model = model
        self.generator = generator
        self.on_logits = on_logits
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    # ---- transformer ------------------------------------------------------------------------
    def _forward(self, x: torch.Tensor, cache: KVCache, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, D) new positions; mask (B, 1|H, T, S) True = may attend, or None. -> (B, D) last."""
        b, t, _ = x.shape
        n_head = self.model.dims.n_head
        for i, layer in enumerate(self.model.layers):
            q, k, v = layer.qkv(x)
            q = q.view(b, t, n_head, -1).transpose(1, 2)  # (B, H, T, hd)
            k = k.view(b, t, n_head, -1).transpose(1, 2)
            v = v.view(b, t, n_head, -1).transpose(1, 2)
            k_all, v_all = cache.store(i, k, v)  # (B, H, S, hd)
            attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
            x = layer.finish(x, attn.transpose(1, 2).reshape(b, t, -1))
        cache.advance(t)
        return x[:, -1]

    def _logits(self, step: int, h_last: torch.Tensor) -> torch.Tensor:
        logits = self.model.logits(h_last)
        if self.on_logits is not None:
            self.on_logits(step, logits.detach().clone())
        return logits.float()

    def _pick(self, logits: torch.Tensor, history: torch.Tensor, step: int, params: SamplingParams,
              rules: StopRules) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (sampled (B, 1), argmax of the penalised logits (B,)); EOS banned before min_steps."""
        if step < rules.min_steps:
            logits = logits[:, :-1]
        logits = penalize_repeats(logits, history, params.repetition_penalty)
        probs = F.softmax(filter_logits(logits, params), dim=-1)
        return race_sample(probs, self.generator), logits.argmax(dim=-1)

    def _prefix(self, item: T2SInput) -> torch.Tensor:
        phones = item.phones.to(self.device).unsqueeze(0)
        bert = item.bert.to(self.device, self.dtype).unsqueeze(0)
        return self.model.embed_text(phones, bert)[0]  # (T, D)

    # ---- one sentence (official infer_panel_naive) ---------------------------------------------
    @torch.inference_mode()
    def naive_steps(self, item: T2SInput, prompt: torch.Tensor | None, params: SamplingParams = SamplingParams(),
                    rules: StopRules = StopRules()) -> Iterator[int]:
        """Yield each token as soon as it is certain to be kept; the return value is the T2SOutput."""
        eos = self.model.dims.eos
        x = self._prefix(item).unsqueeze(0)  # (1, Tx, D)
        tx = x.shape[1]
        if prompt is not None:
            y = prompt.to(self.device).long().view(1, -1)
            xy = torch.cat([x, self.model.embed_audio(y)], dim=1)
        else:
            y = torch.zeros(1, 0, dtype=torch.long, device=self.device)
            xy = x
        prefix_len = y.shape[1]
        s = xy.shape[1]
        mask, _ = prefix_lm_mask(torch.tensor([tx], device=self.device), torch.tensor([s], device=self.device), s)
        cache = KVCache(len(self.model.layers))
        h = self._forward(xy, cache, mask.unsqueeze(1))
        stop, step = "max_steps", 0
        for step in range(rules.max_steps):
            if step:
                nxt = self.model.embed_audio(y[:, -1:], offset=prefix_len + step - 1)
                h = self._forward(nxt, cache, None)
            sampled, top = self._pick(self._logits(step, h), y, step, params, rules)
            y = torch.cat([y, sampled], dim=1)
            ended = None
            if rules.early_stop_num != -1 and y.shape[1] - prefix_len > rules.early_stop_num:
                ended = "early_stop"
            if int(top[0]) == eos or int(sampled[0, 0]) == eos:
                ended = "eos"
                y = y[:, :-1]
            if ended is None and step == rules.max_steps - 1:
                ended = "max_steps"
            if ended != "eos":
                yield int(sampled[0, 0])
            if ended is not None:
                stop = ended
                break
        if y.shape[1] == 0:
            y = torch.zeros(1, 1, dtype=torch.long, device=self.device)  # official "bad zero prediction"
        seq = y[0]
        steps = 0 if prompt is None else step
        tokens = seq if steps == 0 else seq[-steps:]
        return T2SOutput(tokens=tokens, steps=steps, stop=stop, sequence=seq)

    def decode_naive(self, item: T2SInput, prompt: torch.Tensor | None, params: SamplingParams = SamplingParams(),
                     rules: StopRules = StopRules()) -> T2SOutput:
        it = self.naive_steps(item, prompt, params, rules)
        while True:
            try:
                next(it)
            except StopIteration as done:
                return done.value

    # ---- several sentences at once (official infer_panel_batch_infer) ---------------------------
    @torch.inference_mode()
    def decode_batch(self, items: Sequence[T2SInput], prompt: torch.Tensor | None,
                     params: SamplingParams = SamplingParams(), rules: StopRules = StopRules()) -> list[T2SOutput]:
        """Left-padded batch sharing one prompt; rows leave the batch when they finish.

        Without a prompt the official code decodes the items one by one; so does this.
        """
        if prompt is None:
            return [self.decode_naive(item, None, params, rules) for item in items]
        eos = self.model.dims.eos
        bsz = len(items)
        prefixes = [self._prefix(item) for item in items]
        tx = max(p.shape[0] for p in prefixes)
        x = torch.stack([F.pad(p, (0, 0, tx - p.shape[0], 0)) for p in prefixes])  # (B, Tx, D)
        y = prompt.to(self.device).long().view(1, -1).expand(bsz, -1)
        prefix_len = y.shape[1]
        xy = torch.cat([x, self.model.embed_audio(y)], dim=1)  # (B, S, D)
        s = xy.shape[1]
        lengths = torch.tensor([p.shape[0] for p in prefixes], device=self.device)
        mask, key_ok = prefix_lm_mask(lengths, lengths + prefix_len, s)  # (B, S, S), (B, S)
        cache = KVCache(len(self.model.layers))
        h = self._forward(xy, cache, mask.unsqueeze(1))
        rows = list(range(bsz))  # batch row -> item index
        results: list[T2SOutput | None] = [None] * bsz
        for step in range(rules.max_steps):
            if step:
                nxt = self.model.embed_audio(y[:, -1:], offset=prefix_len + step - 1)
                h = self._forward(nxt, cache, key_ok[:, None, None, :])
            sampled, top = self._pick(self._logits(step, h), y, step, params, rules)
            y = torch.cat([y, sampled], dim=1)
            done = (sampled[:, 0] == eos) | (top == eos)
            if bool(done.any()):
                for r in done.nonzero()[:, 0].tolist():
                    results[rows[r]] = self._batch_output(y[r, :-1], step, "eos")
                keep = (~done).nonzero()[:, 0]
                rows = [rows[r] for r in keep.tolist()]
                y, key_ok = y.index_select(0, keep), key_ok.index_select(0, keep)
                cache.keep_rows(keep)
            early = rules.early_stop_num != -1 and y.shape[1] - prefix_len > rules.early_stop_num
            if early or step == rules.max_steps - 1:
                for r, item_index in enumerate(rows):
                    results[item_index] = self._batch_output(y[r, :-1], step, "early_stop" if early else "max_steps")
                rows = []
            if not rows:
                break
            key_ok = F.pad(key_ok, (0, 1), value=True)
        return [r for r in results if r is not None]

    @staticmethod
    def _batch_output(seq: torch.Tensor, step: int, stop: str) -> T2SOutput:
        return T2SOutput(tokens=seq[-step:] if step else seq, steps=step, stop=stop, sequence=seq)
