"""What synthesis yields: :class:`Result` pieces in order, and :func:`join` for the whole file.

Audio in results is float32 in [-1, 1] at ``Result.sample_rate``; ``Result.pcm16()`` gives the
official int16 samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import EngineError


@dataclass(frozen=True)
class Result:
    """One piece of output audio, in order.

    Non-streaming: one result per sentence (its audio followed by the official ``fragment_interval``
    silence). Streaming: one per token chunk, then the sentence's silence as its own result.
    ``join`` of all results equals the official whole-file output.
    """

    audio: np.ndarray  # float32 (n,), |x| <= 1 (fragments louder than 1 are peak-normalised, as officially)
    sample_rate: int  # 32000 (v1/v2/v2Pro*), 24000 (v3), 48000 (v4)
    text: str  # normalised text of the sentence this audio belongs to
    phones: tuple[int, ...]  # phone ids of that sentence (target text only)
    index: int  # 0, 1, 2... in output order
    sentence: int  # index of the sentence in the text
    is_last: bool  # no result follows
    seed: int  # the seed actually used (reproduces the request)
    tokens: tuple[int, ...] = ()  # semantic tokens behind this audio (the whole sentence, or the chunk)
    kind: str = "speech"  # "speech" or "silence" (a streaming sentence gap)

    def pcm16(self) -> np.ndarray:
        """The official int16 conversion ``x * 32768``, clipped (the official cast wraps a +1.0 sample)."""
        return np.clip(self.audio * 32768.0, -32768, 32767).astype(np.int16)


def join(results: Sequence[Result] | Iterator[Result]) -> tuple[int, np.ndarray]:
    """Concatenate results into ``(sample_rate, float32 audio)``; the whole-file output."""
    results = list(results)
    if not results:
        raise EngineError("no audio was produced")
    rate = results[0].sample_rate
    return rate, np.concatenate([r.audio for r in results]).astype(np.float32, copy=False)
