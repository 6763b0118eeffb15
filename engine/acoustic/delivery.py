"""An acoustic round's audio on its way to the host, without waiting for the device while it is queued.

:func:`engine.acoustic.streaming.voice_together` with ``lazy`` returns, for a streamed chunk joined by SOLA, a
:class:`engine.acoustic.sola.Lagged` whose lag is still on the device. :class:`Delivery` queues one copy of every
chunk's samples and every lag to the host (:class:`engine.runtime.HostCopy`) and cuts the played samples there, so
the thread that voices rounds can queue the next round's kernels before it waits for this one's audio.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.acoustic.sola import Lagged
from engine.runtime import HostCopy


class Delivery:
    """The audio of ``items`` (device tensors, or :class:`Lagged` joins) on the host, in one copy: :meth:`wait`
    returns the played samples of each, as :meth:`Lagged.cut` would on the device."""

    def __init__(self, items: Sequence[torch.Tensor | Lagged], device: torch.device | str) -> None:
        self._items = list(items)
        lags: dict[int, torch.Tensor] = {}
        for item in self._items:
            if isinstance(item, Lagged):
                lags.setdefault(id(item.lags), item.lags)
        self._lag_ids = list(lags)
        audio = [item.audio if isinstance(item, Lagged) else item for item in self._items]
        self._copy = HostCopy(audio + list(lags.values()), device)

    def wait(self) -> list[torch.Tensor]:
        host = self._copy.wait()
        n = len(self._items)
        lags = {key: read.tolist() for key, read in zip(self._lag_ids, host[n:])}
        return [item.cut(audio, lags[id(item.lags)]) if isinstance(item, Lagged) else audio
                for item, audio in zip(self._items, host[:n])]
