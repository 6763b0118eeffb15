"""SOLA: join audio fragments whose ends overlap (the official ``sola_algorithm``), in one place.

Used by token-chunk streaming (two consecutive chunks) and by batched v3/v4 synthesis (a row of
CFM windows). The next fragment is shifted by the lag (0..search) of highest normalised
cross-correlation with the previous fragment's tail, then its first ``overlap`` samples are
Hann-cross-faded with that tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SOLA_SEARCH = 320  # samples searched for the best alignment


def sola_tail(head: torch.Tensor, nxt: torch.Tensor, overlap: int, search: int = SOLA_SEARCH) -> torch.Tensor:
    """``nxt[lag:]`` with its first ``overlap`` samples cross-faded into the last ``overlap`` of ``head``.

    Both 1-D float32. As officially, the cross-fade is written into ``nxt`` itself and the result is
    a view of it: a caller that keeps ``nxt`` sees the faded samples.
    """
    w1, w2 = head[-overlap:], nxt[: overlap + search]
    corr = F.conv1d(w2.view(1, 1, -1), w1.view(1, 1, -1)).view(-1)
    energy = F.conv1d(w2.view(1, 1, -1) ** 2, torch.ones_like(w1).view(1, 1, -1)).view(-1) + 1e-8
    lag = int((corr / energy.sqrt()).argmax())
    tail = nxt[lag:]
    window = torch.hann_window(overlap * 2, device=head.device, dtype=head.dtype)
    tail[:overlap] = window[:overlap] * tail[:overlap] + window[overlap:] * head[-overlap:]
    return tail


@dataclass(frozen=True)
class Lagged:
    """What a stream plays of a chunk whose SOLA lag is still on the device: ``audio[lag:len(audio) - overlap]``
    with ``lag = lags[index]`` (:func:`sola_chunks` with ``lazy``). Nothing waits for the device until it is cut:
    :meth:`cut` on the device, or :func:`engine.acoustic.delivery.start_delivery` after one copy to the host."""

    audio: torch.Tensor  # (samples,) the chunk with its cross-fade written at [lag, lag + overlap)
    lags: torch.Tensor  # (pairs,) long, on the device: the lags of the pairs joined together
    index: int
    overlap: int

    def cut(self, audio: torch.Tensor | None = None, lags: Sequence[int] | None = None) -> torch.Tensor:
        """The played samples: of ``audio`` (this chunk's copy, e.g. on the host) with ``lags`` (the lags read),
        else of the device tensors (one wait for the device)."""
        audio = self.audio if audio is None else audio
        lag = int(self.lags[self.index]) if lags is None else int(lags[self.index])
        return audio[lag:audio.shape[0] - self.overlap]


def sola_chunks(heads: Sequence[torch.Tensor], nexts: Sequence[torch.Tensor], overlap: int,
                search: int = SOLA_SEARCH, lazy: bool = False) -> list:
    """For several (previous chunk, next chunk) pairs of one dtype and device, what a stream plays of the next
    chunk: ``sola_pair(head, next, overlap)[len(head) - overlap: -overlap]`` each, with its in-place write (a
    float32 ``next`` holds its cross-fade afterwards). The lags of the pairs whose ``next`` has ``overlap +
    search`` samples come from one grouped correlation (its rows padded to a power of two: few shapes, few
    cuDNN plans) and reach the host in one copy (one wait for the device, not one a pair); their cross-fades
    are computed together, in float32. The same arithmetic per pair; only the correlation's summation order
    may differ (a grouped convolution), so a lag can differ where two are tied to rounding. Shorter pairs are
    joined one by one.

    ``lazy``: those pairs are returned as :class:`Lagged` (the cross-fade written on the device, the lag not read):
    the caller cuts them once it has the lags, so queuing the join never waits for the device."""
    out: list = [None] * len(heads)
    full = [i for i, n in enumerate(nexts) if n.shape[0] >= overlap + search]
    for i in sorted(set(range(len(heads))) - set(full)):
        out[i] = sola_pair(heads[i], nexts[i], overlap, search)[heads[i].shape[0] - overlap: -overlap]
    if not full:
        return out
    rows = 1 << (len(full) - 1).bit_length()
    pad = [heads[full[0]].new_zeros(overlap + search)] * (rows - len(full))
    w1 = torch.stack([heads[i][-overlap:] for i in full] + [z[:overlap] for z in pad]).float()  # (rows, overlap)
    w2 = torch.stack([nexts[i][: overlap + search] for i in full] + pad).float()  # (rows, overlap + search)
    corr = F.conv1d(w2.unsqueeze(0), w1.unsqueeze(1), groups=rows)[0]  # (rows, search + 1)
    energy = F.conv1d(w2.unsqueeze(0) ** 2, torch.ones_like(w1).unsqueeze(1), groups=rows)[0] + 1e-8
    lags = (corr / energy.sqrt()).argmax(dim=1)[: len(full)]
    w1, w2 = w1[: len(full)], w2[: len(full)]
    window = torch.hann_window(overlap * 2, device=w1.device, dtype=w1.dtype)
    at = lags.unsqueeze(1) + torch.arange(overlap, device=w1.device)  # (pairs, overlap): next[lag:lag + overlap]
    faded = window[:overlap] * w2.gather(1, at) + window[overlap:] * w1
    dtype = nexts[full[0]].dtype
    if dtype != torch.float32:
        faded = faded.to(dtype)  # as sola_pair's result, cast back (next itself is not written: a float copy was)
    for k, i in enumerate(full):
        # float32: into next itself, as sola_tail writes; else into a copy (sola_pair wrote into a float copy)
        written = nexts[i] if dtype == torch.float32 else nexts[i].clone()
        written.scatter_(0, at[k], faded[k])
        out[i] = Lagged(written, lags, k, overlap)
    if lazy:
        return out
    read = lags.tolist()  # one wait for the device
    return [o.cut(lags=read) if isinstance(o, Lagged) else o for o in out]


def sola_join(fragments: Sequence[torch.Tensor], overlap: int, search: int = SOLA_SEARCH) -> torch.Tensor:
    """Join consecutive 1-D fragments (the inputs are left unchanged); the dtype of the first."""
    if not fragments:
        raise ValueError("sola_join needs at least one fragment")
    out = [f.float().clone() for f in fragments]
    for i in range(len(out) - 1):
        out[i + 1] = sola_tail(out[i], out[i + 1], overlap, search)
        out[i] = out[i][:-overlap]
    return torch.cat(out, 0).to(fragments[0].dtype)


def sola_pair(first: torch.Tensor, second: torch.Tensor, overlap: int, search: int = SOLA_SEARCH) -> torch.Tensor:
    """Two fragments joined, with the official in-place write into ``second`` when it is float32
    already (``.float()`` returns it unchanged), which the next streaming chunk sees."""
    a, b = first.float(), second.float()
    return torch.cat([a[:-overlap], sola_tail(a, b, overlap, search)]).to(first.dtype)
