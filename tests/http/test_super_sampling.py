"""api_v2's super_sampling: a v3 (24 kHz) answer is widened to 48 kHz with the AP-BWE model when it
is in its official place, and keeps its rate when it is not (as the official code does)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import numpy as np
import soundfile as sf

from engine.acoustic.super_sampling import SuperSamplerStore
from engine.options import SynthesisOptions
from engine.results import Result
from engine.testweights.ap_bwe import write_ap_bwe
from studio.http.exchange import JobControl
from studio.http.limits import ServerLimits
from studio.http.synthesis import TTSJob, start_stream, synthesize_whole


def _ctx(store, rate: int):
    def synthesize(*args, **kwargs):
        tone = (0.2 * np.sin(np.arange(rate // 2) / 5.0)).astype(np.float32)
        return (Result(tone, rate, "a", (), i, i, i == 1, 3) for i in range(2))

    metrics = SimpleNamespace(audio_seconds=SimpleNamespace(inc=lambda amount: None))
    return SimpleNamespace(studio=SimpleNamespace(synthesize=synthesize), metrics=metrics, super_sampler=store,
                           limits=ServerLimits())


def _job(super_sampling: bool, streaming: bool = False) -> TTSJob:
    return TTSJob("a. b.", "en", None, SynthesisOptions(super_sampling=super_sampling), None, None, "wav",
                  streaming)


def _control() -> JobControl:
    return JobControl(time.monotonic() + 60)


def test_v3_answers_are_widened_when_the_model_is_in_place(tmp_path) -> None:
    store = SuperSamplerStore(tmp_path / "g_24kto48k.zip")
    data, rate, _ = synthesize_whole(_ctx(store, 24000), _job(True), _control())
    assert rate == 24000 and sf.info(io.BytesIO(data)).samplerate == 24000  # absent: the rate stays
    write_ap_bwe(tmp_path)
    data, rate, _ = synthesize_whole(_ctx(store, 24000), _job(True), _control())
    assert rate == 48000 and sf.info(io.BytesIO(data)).samplerate == 48000
    assert synthesize_whole(_ctx(store, 24000), _job(False), _control())[1] == 24000  # only when asked
    assert synthesize_whole(_ctx(store, 32000), _job(True), _control())[1] == 32000  # v3 only


def test_a_streamed_v3_answer_is_widened_piece_by_piece(tmp_path) -> None:
    store = SuperSamplerStore(write_ap_bwe(tmp_path))

    def streamed(rate: int, widen: bool) -> tuple[int, float]:
        data = b"".join(piece for piece, _ in start_stream(_ctx(store, rate), _job(widen, True), _control()))
        sr = int.from_bytes(data[24:28], "little")  # a streamed WAV header leaves the lengths open
        return sr, (len(data) - 44) / 2 / sr

    assert streamed(24000, True) == (48000, 1.0)  # two half-second pieces, each at 48 kHz
    assert streamed(24000, False) == (24000, 1.0) and streamed(32000, True) == (32000, 1.0)
