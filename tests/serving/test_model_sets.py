"""Weight selection cannot break running requests (issue 32, item 1), on the CPU with tiny random v2 weights.

A client that cycles through more model sets than the scheduler table holds (``max_schedulers``) used to
close the oldest scheduler even while it decoded: its requests failed or hung, its slots never came back.
Now a model set with requests in flight is never evicted (an idle one goes instead), and when every set is
busy a new selection gets BusyError (HTTP 503 + Retry-After). Decode steps are held on an event, so "busy"
does not depend on timing.
"""

from __future__ import annotations

import shutil
import threading

import pytest

import tests.support.synth as sup
from engine.errors import BusyError
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.studio import Studio

TEXT = "The quick brown fox jumps over the lazy dog."


def _studio(**settings) -> Studio:
    shared = sup.studio("v2")
    return Studio(shared.default_weights, shared.runtime, EngineSettings(**settings), pool=shared.pool)


def _gpts(studio: Studio, folder, n: int) -> list:
    """``n`` copies of the default GPT file: ``n`` model sets (the same numbers under other names)."""
    folder.mkdir(exist_ok=True)
    out = []
    for i in range(n):
        path = folder / f"set{i}.ckpt"
        shutil.copyfile(studio.default_weights.gpt, path)
        out.append(path)
    return out


def _run(studio: Studio, gpt, seed: int = 1) -> list:
    options = SynthesisOptions(seed=seed, text_split_method="cut5", early_stop_num=20)
    reference = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    return [r.tokens for r in studio.synthesize(TEXT, "en", reference, options, gpt=gpt)]


class Held:
    """A request on ``gpt`` whose decode steps wait for :attr:`release`: its scheduler stays busy."""

    def __init__(self, studio: Studio, gpt) -> None:
        self.sched = studio.scheduler(studio.cloner(gpt).models)
        self.release, self.entered = threading.Event(), threading.Event()
        real = self.sched.decoder.step

        def step(n: int):
            self.entered.set()
            self.release.wait(60)
            return real(n)

        self.sched.decoder.step = step  # type: ignore[method-assign]
        self.outcome: dict = {}

        def run() -> None:
            try:
                self.outcome["tokens"] = _run(studio, gpt, seed=3)
            except BaseException as e:  # noqa: BLE001 - the test reads it
                self.outcome["error"] = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.entered.wait(60), "the held request never reached a decode step"

    def finish(self) -> dict:
        self.release.set()
        self.thread.join(60)
        return self.outcome


def test_cycling_through_more_sets_than_the_table_holds_never_closes_a_busy_scheduler(tmp_path) -> None:
    studio = _studio(scheduler_slots=2, max_schedulers=4)
    try:
        gpts = _gpts(studio, tmp_path / "w", 6)
        expected = _run(studio, gpts[0], seed=3)  # what the held request yields when nothing disturbs it
        studio.close()
        studio = _studio(scheduler_slots=2, max_schedulers=4)
        held = Held(studio, gpts[0])  # the oldest set in the table, decoding
        for gpt in gpts[1:]:  # five more sets: the table holds four
            assert _run(studio, gpt)
        assert not held.sched._closed  # before: evicted (closed) while it decoded
        outcome = held.finish()
        assert "error" not in outcome, outcome.get("error")
        assert outcome["tokens"] == expected  # its request ran to its end, unharmed
        assert held.sched.idle  # and its slot came back
        assert _run(studio, gpts[0])  # the set serves on
    finally:
        studio.close()


def test_a_new_set_when_every_set_is_busy_gets_busy_with_retry_after(tmp_path) -> None:
    studio = _studio(scheduler_slots=2, max_schedulers=2)
    try:
        gpts = _gpts(studio, tmp_path / "w", 3)
        held = [Held(studio, gpt) for gpt in gpts[:2]]
        with pytest.raises(BusyError) as caught:
            _run(studio, gpts[2])
        assert caught.value.retry_after > 0 and "max_schedulers" in str(caught.value)
        assert not any(h.sched._closed for h in held)
        for h in held:
            assert "error" not in h.finish()
        assert _run(studio, gpts[2])  # once a set is idle, the new one takes its place
        assert held[0].sched._closed  # the idle oldest went
    finally:
        studio.close()


def test_closing_idle_schedulers_under_memory_pressure_spares_busy_ones(tmp_path) -> None:
    studio = _studio(scheduler_slots=2)
    try:
        gpts = _gpts(studio, tmp_path / "w", 2)
        assert _run(studio, gpts[1])
        idle = studio.scheduler(studio.cloner(gpts[1]).models)
        held = Held(studio, gpts[0])
        studio._close_idle_schedulers()
        assert idle._closed and not held.sched._closed
        assert "error" not in held.finish()
    finally:
        studio.close()


def test_a_reloaded_set_gets_a_new_scheduler_and_the_old_one_closes_once_its_requests_are_done(tmp_path) -> None:
    import copy
    from dataclasses import replace

    studio = _studio(scheduler_slots=2)
    try:
        gpt = _gpts(studio, tmp_path / "w", 1)[0]
        held = Held(studio, gpt)
        reloaded = replace(held.sched.models, t2s=copy.deepcopy(held.sched.models.t2s))  # same id, new weights
        new = studio.scheduler(reloaded)
        assert new is not held.sched and not held.sched.closed  # before: closed while it decoded
        assert "error" not in held.finish()  # its request ran to its end
        studio.scheduler(reloaded)  # the next selection sweeps the replaced one, idle now
        assert held.sched.closed and not new.closed
    finally:
        studio.close()
