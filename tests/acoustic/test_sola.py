"""SOLA joins of several streaming chunk pairs at once (engine.acoustic.sola.sola_chunks) against one pair at a
time (sola_pair, as SentenceStream._finish joins a chunk alone)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.acoustic.sola import sola_chunks, sola_pair


def _pairs(seed: int, lengths: list[int], overlap: int, shifts: list[int], dtype) -> tuple[list, list]:
    """Heads and nexts cut from continuous signals, each next starting ``shift`` samples before its head's end
    minus ``overlap``: the best lag is ``shift``."""
    g = torch.Generator().manual_seed(seed)
    heads, nexts = [], []
    for n, shift in zip(lengths, shifts):
        t = torch.arange(4000 + n, dtype=torch.float32)
        f = 0.01 + 0.02 * torch.rand((), generator=g)
        x = (torch.sin(2 * math.pi * f * t) + 0.3 * torch.randn(t.shape, generator=g)).to(dtype)
        cut = 2000
        heads.append(x[:cut].clone())
        nexts.append(x[cut - overlap - shift: cut - overlap - shift + n].clone())
    return heads, nexts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunks_joined_together_equal_chunks_joined_one_by_one(dtype):
    overlap, search = 64, 80
    lengths = [400, 144, 1000, 100, 700, 170]  # 100: shorter than overlap + search, joined on its own
    shifts = [3, 0, 50, 7, 80, 60]  # 170 - 60 - 64: the kept part is shorter than the overlap
    heads, nexts = _pairs(1, lengths, overlap, shifts, dtype)
    alone_nexts = [n.clone() for n in nexts]
    want = [sola_pair(h, n, overlap, search)[h.shape[0] - overlap: -overlap] for h, n in zip(heads, alone_nexts)]
    together_nexts = [n.clone() for n in nexts]
    got = sola_chunks(heads, together_nexts, overlap, search)
    assert [t.shape[0] for t in got] == [n - s - overlap for n, s in zip(lengths, shifts)]  # the planted lags
    for g, w in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for a, b, before in zip(together_nexts, alone_nexts, nexts):  # the in-place write of sola_pair, or none
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert torch.equal(a, before) == (dtype != torch.float32)


def test_no_pair_is_fine():
    assert sola_chunks([], [], 8) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lazy_joins_cut_on_the_host_are_the_joins(dtype):
    """``lazy`` leaves the lags on the device: cut after one copy to the host (Delivery), each join is what
    the eager join plays, and the float32 in-place write into next has happened already."""
    from engine.acoustic.delivery import Delivery
    from engine.acoustic.sola import Lagged

    overlap, search = 64, 80
    lengths, shifts = [400, 144, 100, 700], [3, 0, 7, 80]
    heads, nexts = _pairs(2, lengths, overlap, shifts, dtype)
    eager_nexts, lazy_nexts = [n.clone() for n in nexts], [n.clone() for n in nexts]
    want = sola_chunks(heads, eager_nexts, overlap, search)
    lazy = sola_chunks(heads, lazy_nexts, overlap, search, lazy=True)
    assert [isinstance(x, Lagged) for x in lazy] == [True, True, False, True]  # 100 < overlap + search: eager
    for a, b in zip(lazy_nexts, eager_nexts):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    extra = torch.arange(5.0)  # a plain tensor beside the joins goes through untouched
    got = Delivery([*lazy, extra], "cpu").wait()
    for g, w in zip(got, [*want, extra]):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for x, w in zip(lazy, want):
        cut = x.cut() if isinstance(x, Lagged) else x
        torch.testing.assert_close(cut, w, rtol=0, atol=0)
