"""Per-row token sampling for a batch of unrelated requests.

Responsibilities: (1) the official sampler (repetition penalty once per seen id, EOS banned before
``min_steps``, top-p on the un-tempered logits, temperature, top-k with ties kept, exponential race)
with every parameter given per row; (2) batch-independent randomness: a row's noise is a pure
function of its request key and its step (a counter-based hash on the device), never of which rows
share the batch or of a global generator.

Seeds: the official code seeds torch's global generator, so its draws depend on everything else
the process ran. Here a request's ``seed`` (and the sentence index) key its own noise stream: the
same seed, text and options give the same tokens alone or beside any other requests, but not the
tokens the official code or the conformance loops (``engine.t2s.decoding``, a ``torch.Generator``
per request) draw for that seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")
_M32 = 0xFFFFFFFF
# 32-bit avalanche hash (lowbias32-style constants below 2**31: every product fits in int64)
_C1, _C2 = 0x21F0AAAD, 0x735A2D97
_GOLDEN = 0x9E3779B1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2) & _M32
    return x ^ (x >> 15)


def _mix32_int(x: int) -> int:
    x &= _M32
    x ^= x >> 16
    x = (x * _C1) & _M32
    x ^= x >> 15
    x = (x * _C2) & _M32
    return x ^ (x >> 15)


def stream_key(seed: int, sentence: int) -> int:
    """The 32-bit key of one sentence's noise stream (host side)."""
    return _mix32_int(_mix32_int(seed & _M32) ^ _mix32_int((seed >> 32) + 0x5BD1E995) ^ _mix32_int(sentence + 1))


def race_noise(keys: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) draws ``(B, vocab)`` float32 for rows with stream ``keys`` (B,) at decode ``steps`` (B,)."""
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    base = _mix32(keys ^ _mix32((steps * _GOLDEN) & _M32))  # (B,)
    h = _mix32(base.unsqueeze(1) ^ ((ids * _GOLDEN + 0x6A09E667) & _M32).unsqueeze(0))  # (B, V)
    h = _mix32(h ^ base.unsqueeze(1))
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # (0, 1), never 0 or 1
    return -torch.log(u)


@dataclass
class RowParams:
    """Per-row sampling parameters and noise keys as device tensors of the pool's size."""

    top_k: torch.Tensor  # (S,) long, >= 1
    top_p: torch.Tensor  # (S,) float32, (0, 1]
    temperature: torch.Tensor  # (S,) float32
    penalty: torch.Tensor  # (S,) float32
    min_steps: torch.Tensor  # (S,) long
    key: torch.Tensor  # (S,) int64, [0, 2**32)

    @classmethod
    def empty(cls, slots: int, device: torch.device) -> RowParams:
        return cls(
            top_k=torch.ones(slots, dtype=torch.long, device=device),
            top_p=torch.ones(slots, dtype=torch.float32, device=device),
            temperature=torch.ones(slots, dtype=torch.float32, device=device),
            penalty=torch.ones(slots, dtype=torch.float32, device=device),
            min_steps=torch.zeros(slots, dtype=torch.long, device=device),
            key=torch.zeros(slots, dtype=torch.int64, device=device),
        )

    def select(self, row: int) -> RowParams:
        """One row's parameters as a batch of one."""
        return RowParams(*(t[row : row + 1] for t in (self.top_k, self.top_p, self.temperature, self.penalty,
                                                       self.min_steps, self.key)))

    def rows(self, n: int) -> RowParams:
        return RowParams(*(t[:n] for t in (self.top_k, self.top_p, self.temperature, self.penalty,
                                            self.min_steps, self.key)))


def sample_rows(logits: torch.Tensor, seen: torch.Tensor, step: torch.Tensor, p: RowParams,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) any float, seen (B, V) bool, step (B,) long -> (token (B,), argmax (B,)) long.

    The official order per row: penalty, EOS ban, [argmax], top-p, temperature, top-k, race.
    """
    logits = logits.float()
    vocab = logits.shape[1]
    pen = p.penalty.unsqueeze(1)
    logits = torch.where(seen, torch.where(logits < 0, logits * pen, logits / pen), logits)
    banned = (step < p.min_steps).unsqueeze(1)  # (B, 1)
    eos_col = torch.arange(vocab, device=logits.device) == vocab - 1
    logits = logits.masked_fill(banned & eos_col, NEG_INF)
    argmax = logits.argmax(dim=-1)
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    # top-p on the un-tempered logits (rows with top_p == 1 skip it, as officially)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove_sorted = (cum > p.top_p.unsqueeze(1)) & (p.top_p < 1.0).unsqueeze(1)
    remove_sorted[:, 0] = False
    logits = logits.masked_fill(remove_sorted.scatter(1, sorted_idx, remove_sorted), NEG_INF)
    temp = torch.clamp(p.temperature, min=1e-5).unsqueeze(1)
    logits = logits / temp
    # top-k: the k-th largest filtered value (top-p removed a tail of the sorted order)
    kth = torch.gather(sorted_logits.masked_fill(remove_sorted, NEG_INF) / temp, 1,
                       (torch.clamp(p.top_k, max=vocab) - 1).unsqueeze(1))  # (B, 1)
    logits = torch.where(logits < kth, NEG_INF, logits)
    probs = F.softmax(logits, dim=-1)
    token = torch.argmax(probs / race_noise(p.key, step, vocab), dim=-1)
    return token, argmax
