"""SOLA: join audio fragments whose ends overlap (the official ``sola_algorithm``), in one place.

Used by token-chunk streaming (two consecutive chunks) and by batched v3/v4 synthesis (a row of
CFM windows). The next fragment is shifted by the lag (0..search) of highest normalised
cross-correlation with the previous fragment's tail, then its first ``overlap`` samples are
Hann-cross-faded with that tail.
"""

from __future__ import annotations

from collections.abc import Sequence

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
