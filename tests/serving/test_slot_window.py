"""The CPU slot pool's ring pointer: a lone request's window is one slice of the KV cache (no gather), and the
numbers do not depend on where in the ring a row sits (a wrapped row and a sliced one give the same tokens)."""

from __future__ import annotations

import torch

from engine.models.t2s import T2SDims
from engine.serving.slots import WINDOW_STEP, SlotDecoder
from engine.t2s.decoding import SamplingParams, T2SInput
from engine.testweights.t2s import random_t2s_model

DIMS = T2SDims(embedding_dim=64, hidden_dim=64, n_head=4, n_layer=2, bert_dim=32)
GREEDY = SamplingParams(top_k=1, repetition_penalty=1.35)


def _inputs(seed: int, phones: int = 12, prompt: int = 9) -> tuple[T2SInput, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    item = T2SInput(torch.randint(1, 100, (phones,), generator=g), torch.randn(DIMS.bert_dim, phones, generator=g))
    return item, torch.randint(0, 1000, (prompt,), generator=g)


def _decode(pool: SlotDecoder, row: int, item, prompt, steps: int, key: int = 5) -> list[int]:
    tok, _ = pool.prefill([row], [item], [prompt], [GREEDY], [10**9], [key])
    out = [int(tok[0])]
    length = item.phones.shape[0] + prompt.numel()
    for i in range(steps):
        pool.window = ((length + i + 2 + 63) // 64) * 64
        toks, _ = pool.step(row + 1)
        out.append(int(toks[row]))
    return out


@torch.inference_mode()
def test_an_empty_cpu_pool_starts_its_ring_after_the_prefix_and_the_tokens_do_not_depend_on_it() -> None:
    model = random_t2s_model(DIMS, seed=3)
    item, prompt = _inputs(1)
    width = item.phones.shape[0] + prompt.numel()
    fresh = SlotDecoder(model, slots=2, capacity=256)
    gathers = []
    original = torch.Tensor.index_select
    # the window gathers select along the positions (dim 2 of keys/values, 1 of the mask); the position
    # embedding's lookup (dim 0) is no window
    torch.Tensor.index_select = lambda self, dim, index: (dim and gathers.append(dim)) or original(self, dim, index)
    try:
        sliced = _decode(fresh, 0, item, prompt, steps=20)
    finally:
        torch.Tensor.index_select = original
    assert fresh.pos_host == WINDOW_STEP + width + 20  # the prefix starts at WINDOW_STEP, then a position a step
    assert not gathers  # every step's window was a slice of the cache

    wrapped = SlotDecoder(model, slots=2, capacity=256)
    wrapped.valid[1, 0] = True  # a live row elsewhere: the pointer is left at 0 and the prefix wraps the ring
    assert _decode(wrapped, 0, item, prompt, steps=20) == sliced
    assert wrapped.pos_host == 20
