"""OpenMP teams on the CPU (engine.openmp): a thread that has done a request's torch work gives its team back
before it waits (the caller after the first sentence's front end, the text thread after each sentence, the
decode loop and the acoustic thread when they run out of work, the caller's flow at its end), so that a lone
request's stages each find one team in the process and keep libgomp's full spin."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import engine.openmp
import engine.serving.scheduler
import engine.studio
import tests.support.synth as sup
from engine.openmp import loaded_libgomp
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.studio import Studio
from tests.support.paths import REPO

TEXT = "The quick brown fox jumps over the lazy dog. It was a bright cold day."


def _release_calls(monkeypatch) -> list[str]:
    """The names of the threads that release their team from now on (the release still happens)."""
    calls: list[str] = []
    real = engine.openmp.release_team

    def recorded() -> bool:
        calls.append(threading.current_thread().name)
        return real()

    for module in (engine.openmp, engine.serving.scheduler, engine.studio):
        monkeypatch.setattr(module, "release_team", recorded)
    return calls


def _synthesize(scheduler: bool, stream: bool, calls: list[str]) -> None:
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp: PyTorch's OpenMP on Linux")
def test_release_team_ends_the_calling_threads_openmp_workers() -> None:
    """In a fresh process: a thread that ran a parallel region on 2 threads holds one worker; after
    release_team it holds none, and the next region starts a new team."""
    if not loaded_libgomp():
        pytest.skip("this PyTorch build does not use libgomp")
    code = (
        "import os, torch\n"
        "from engine.openmp import release_team\n"
        "torch.set_num_threads(2)\n"
        "count = lambda: len(os.listdir('/proc/self/task'))\n"
        "x = torch.ones(1 << 22)\n"
        "x.mul_(2).sum(); before = count()\n"
        "assert release_team(); after = count()\n"
        "x.mul_(2).sum(); again = count()\n"
        "print(before - after, again - after)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["1", "1"]
