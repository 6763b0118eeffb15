"""The text front end in worker processes (engine.text.workers): the same features as on the caller's thread, the
same errors, a dead worker fails only its own read, and a Studio set to use them synthesises the same audio."""

from __future__ import annotations

import os
import pickle
import signal

import numpy as np
import pytest

from engine.errors import BusyError, EngineError, TextError, UnsupportedLanguageError
from engine.text.frontend import TextFrontend
from engine.text.workers import FrontendSpec, TextWorkers

TEXTS = [("zh", "今天天气很好，我们一起去公园散步吧。"), ("en", "It costs $3.50, doesn't it?"),
         ("ja", "こんにちは、元気ですか。"), ("zh", "我们用GPU训练了3个模型。")]


@pytest.fixture(scope="module")
def workers():
    w = TextWorkers(FrontendSpec("v2"), processes=1)
    yield w
    w.close()


@pytest.mark.parametrize(("lang", "text"), TEXTS)
def test_a_worker_reads_as_the_callers_thread_does(workers, lang, text) -> None:
    want = TextFrontend("v2").phones_and_bert(text, lang, with_bert=False)
    got = workers.read(text, lang)
    assert got == want  # phones, ids, normalised text and every segment's word2ph
    assert got.segments == want.segments and got.bert is None


def test_the_front_ends_errors_come_back_as_they_were_raised(workers) -> None:
    with pytest.raises(TextError, match="empty"):
        workers.read("   ", "en")
    with pytest.raises(UnsupportedLanguageError) as info:
        workers.read("hello", "xx")
    assert "use one of" in str(info.value)


def test_engine_errors_survive_pickling_with_their_fields() -> None:
    e = pickle.loads(pickle.dumps(TextError("the text is empty", field="text")))
    assert (type(e), str(e), e.field) == (TextError, "the text is empty", "text")
    b = pickle.loads(pickle.dumps(BusyError("busy now", retry_after=2.5, field="x")))
    assert (str(b), b.retry_after, b.field) == ("busy now", 2.5, "x")


def test_a_dead_worker_fails_only_its_read_and_the_next_read_works() -> None:
    w = TextWorkers(FrontendSpec("v2"), processes=1)
    try:
        assert w.read("Hello there.", "en").phones
        pids = list(w._pool._processes)  # the pool's worker processes
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="died"):
            w.read("Hello again.", "en")
        assert w.read("Hello again.", "en").phones  # a new pool
        assert set(w._pool._processes).isdisjoint(pids)
    finally:
        w.close()
    with pytest.raises(EngineError, match="shut down"):
        w.read("After closing.", "en")


def test_processes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TextWorkers(FrontendSpec("v2"), processes=0)


def test_a_studio_with_text_processes_synthesises_the_same_audio() -> None:
    from engine.config import load_config
    from engine.loading.model_pool import WeightSet
    from engine.options import EngineSettings, SynthesisOptions
    from engine.reference import Reference
    from engine.results import join
    from engine.runtime import resolve_runtime
    from engine.studio import Studio
    from tests.support import synth

    weights = WeightSet.from_config(load_config(synth.model_config("v2")))
    ref = Reference(synth.wav_bytes(synth.clip()), synth.REF_TEXT, "en")
    text = "Hello world, this is a test. 今天天气很好。"
    options = SynthesisOptions(seed=7)
    outputs = []
    for processes in (0, 1):
        studio = Studio(weights, resolve_runtime("cpu", "fp32"), EngineSettings(text_processes=processes))
        try:
            assert (studio._text_workers_for(studio.cloner().models) is None) == (processes == 0)
            outputs.append(join(studio.synthesize(text, "auto", ref, options))[1])
        finally:
            studio.close()
    assert outputs[0].size > 0
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_text_processes_default_to_none_on_the_cpu() -> None:
    from engine.options import EngineSettings
    from tests.support import synth

    studio = synth.studio("v2")
    assert EngineSettings().text_processes == -1
    assert studio._text_workers_for(studio.cloner().models) is None


def test_the_least_recently_used_front_end_kind_closes_first(monkeypatch) -> None:
    """Studio keeps worker pools for at most MAX_TEXT_POOLS front-end kinds; using a kind again keeps it."""
    from types import SimpleNamespace

    import torch

    import engine.studio as studio_module
    from engine.options import EngineSettings
    from engine.studio import Studio
    from tests.support import synth

    monkeypatch.setattr(studio_module, "MAX_TEXT_POOLS", 2)
    base = synth.studio("v2")
    studio = Studio(base.default_weights, base.runtime, EngineSettings(text_processes=1))
    try:
        kinds = [SimpleNamespace(frontend_spec=FrontendSpec("v2", f"/g2pw/{i}", "/bert"),
                                 device=torch.device("cpu")) for i in range(3)]
        first = studio._text_workers_for(kinds[0])
        studio._text_workers_for(kinds[1])
        assert studio._text_workers_for(kinds[0]) is first  # used again: now the most recent
        studio._text_workers_for(kinds[2])  # a third kind: kinds[1] closes, kinds[0] stays
        assert list(studio._text_workers) == [kinds[0].frontend_spec, kinds[2].frontend_spec]
        assert not first._closed
    finally:
        studio.close()
    assert first._closed


def test_a_servers_shutdown_ends_the_text_worker_processes() -> None:
    from fastapi.testclient import TestClient

    from engine.options import EngineSettings
    from engine.studio import Studio
    from studio.http.app import create_app
    from tests.support import synth

    base = synth.studio("v2")
    studio = Studio(base.default_weights, base.runtime, EngineSettings(text_processes=1))
    try:
        with TestClient(create_app(studio)):
            workers = studio._text_workers_for(studio.cloner().models)
            assert workers.read("Hello there.", "en").phones
            processes = list(workers._pool._processes.values())
        assert workers._closed and studio._text_workers == {}
        assert all(not p.is_alive() for p in processes)  # waited for: none outlives the server
    finally:
        studio.close()
