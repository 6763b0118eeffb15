"""OpenMP teams on the CPU (engine.openmp): a thread that has done a request's torch work gives its team back
before it waits (the caller after the first sentence's front end, the text thread after each sentence, the
decode loop and the acoustic thread when they run out of work, the caller's flow at its end), so that a lone
request's stages each find one team in the process and keep libgomp's full spin; and each of them fits its
thread count to the cores other processes leave free before its work."""

from __future__ import annotations

import threading

import pytest

import engine.cloner
import engine.openmp
import engine.serving.acoustic_rounds
import engine.serving.scheduler
import engine.studio
import tests.support.synth as sup
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.studio import Studio

TEXT = "The quick brown fox jumps over the lazy dog. It was a bright cold day."


def _calls(monkeypatch, name: str, modules) -> list[str]:
    """The names of the threads that call ``name`` of engine.openmp from now on (the call still happens)."""
    calls: list[str] = []
    real = getattr(engine.openmp, name)

    def recorded(*args, **kwargs):
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    for module in modules:
        monkeypatch.setattr(module, name, recorded)
    return calls


def _release_calls(monkeypatch) -> list[str]:
    return _calls(monkeypatch, "release_team", (engine.openmp, engine.serving.scheduler, engine.serving.acoustic_rounds,
                                                engine.studio))


def _fit_calls(monkeypatch) -> list[str]:
    return _calls(monkeypatch, "fit_threads", (engine.openmp, engine.serving.scheduler, engine.serving.acoustic_rounds,
                                               engine.cloner))


def _synthesize(scheduler: bool, stream: bool, calls: list[str]) -> None:
    """One request on the shared tiny v2 set; with the scheduler, until its decode loop and acoustic thread have
    been seen in ``calls`` (or 5 s) and it is idle."""
    shared = sup.studio("v2")
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler=scheduler), pool=shared.pool)
    try:
        opts = SynthesisOptions(seed=3, text_split_method="cut5", early_stop_num=30, streaming_mode=stream)
        results = list(studio.synthesize(TEXT, "en", Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"), opts))
        assert results and results[-1].is_last
        if scheduler:  # the decode loop and the acoustic thread release theirs once the request is done
            sched = next(iter(studio._schedulers.values()))
            for _ in range(500):
                if {"t2s-loop", "acoustic"} <= set(calls) and sched.idle:
                    break
                threading.Event().wait(0.01)
    finally:
        studio.close()


@pytest.mark.parametrize("stream", [False, True])
def test_every_thread_of_a_scheduled_cpu_request_gives_its_team_back(monkeypatch, stream) -> None:
    calls = _release_calls(monkeypatch)
    _synthesize(True, stream, calls)
    caller = threading.current_thread().name
    assert caller in calls  # after the first sentence's front end, before the request waits for its audio
    assert any(name.startswith("text") for name in calls)  # the next sentence, featurised on the text thread
    assert "t2s-loop" in calls and "acoustic" in calls


def test_the_callers_flow_gives_its_team_back_at_its_end(monkeypatch) -> None:
    calls = _release_calls(monkeypatch)
    _synthesize(False, False, calls)
    assert calls == [threading.current_thread().name]


@pytest.mark.parametrize("stream", [False, True])
def test_every_thread_of_a_scheduled_cpu_request_fits_its_thread_count_first(monkeypatch, stream) -> None:
    calls = _fit_calls(monkeypatch)
    _synthesize(True, stream, calls)
    assert threading.current_thread().name in calls
    assert any(name.startswith("text") for name in calls)
    assert "t2s-loop" in calls and "acoustic" in calls


def test_the_callers_flow_fits_its_thread_count_first(monkeypatch) -> None:
    calls = _fit_calls(monkeypatch)
    _synthesize(False, False, calls)
    assert calls == [threading.current_thread().name]
