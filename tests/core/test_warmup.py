"""Warm-up at start: readiness states, which model sets count as configured, and a real warm-up of a tiny
set that leaves its models loaded and its first request free of loading (checked by counting loads)."""

from __future__ import annotations

import threading

import yaml

from engine.config import load_config, parse_config
from engine.loading.model_pool import WeightSet
from engine.options import SynthesisOptions
from engine.reference import Reference
from engine.results import join
from engine.studio import Studio
from engine.runtime import resolve_runtime
from engine.warmup import (
    Readiness,
    WarmupSettings,
    configured_weight_sets,
    reference_clip,
    warm_up,
    warm_up_in_background,
)
from tests.support.synth import model_config


def test_readiness_says_starting_until_the_warm_up_ends() -> None:
    r = Readiness()
    assert r.status == "starting" and r.seconds is None and not r.wait(0)
    r.finish()
    assert r.status == "ready" and r.seconds is not None and r.wait(0)
    failed = Readiness()
    failed.finish("v2 (a.pth): PoolAllocationError: out of memory")
    assert failed.status == "degraded" and failed.done and "out of memory" in failed.error
    assert Readiness(ready=True).status == "ready"


def _studio(config) -> Studio:
    return Studio(WeightSet.from_config(config), resolve_runtime("cpu", "fp32"))


def test_warm_up_loads_the_configured_set_and_synthesises_once() -> None:
    config = load_config(model_config("v2"))
    studio = _studio(config)
    steps: list[str] = []
    report = warm_up(studio, configured_weight_sets(config, studio.default_weights),
                     WarmupSettings(languages=("en",), max_tokens=6), on_step=steps.append)
    assert report.sets == ("v2",) and report.errors == () and steps and "v2" in steps[0]
    loads = studio.pool.stats().loads
    assert loads >= 4  # t2s, sovits, hubert, bert
    # a request after the warm-up loads nothing more
    ref = Reference(reference_clip(), "The weather is nice today.", "en")
    _, audio = join(studio.synthesize("Hello there.", "en", ref, SynthesisOptions(early_stop_num=6, seed=1)))
    assert audio.size > 0 and studio.pool.stats().loads == loads


def test_a_failed_warm_up_ends_degraded_with_the_reason(tmp_path) -> None:
    config = load_config(model_config("v2"))
    broken = WeightSet.from_config(config).replace(sovits=tmp_path / "missing.pth")
    studio = Studio(broken, resolve_runtime("cpu", "fp32"))
    readiness = Readiness()
    thread = warm_up_in_background(studio, readiness)
    assert isinstance(thread, threading.Thread)
    assert readiness.wait(120) and readiness.status == "degraded" and "missing.pth" in readiness.error
    assert readiness.done


def test_configured_sets_are_the_active_one_and_other_sections_of_the_file(tmp_path) -> None:
    files = {}
    for name in ("a.ckpt", "a.pth", "b.ckpt", "b.pth"):
        files[name] = tmp_path / name
        files[name].write_bytes(b"x")
    base = {"device": "cpu", "is_half": False, "bert_base_path": "bert", "cnhuhbert_base_path": "hubert"}
    doc = {"custom": dict(base, version="v2", t2s_weights_path="a.ckpt", vits_weights_path="a.pth"),
           "v2": dict(base, version="v2", t2s_weights_path="a.ckpt", vits_weights_path="a.pth"),  # same set
           "v4": dict(base, version="v4", t2s_weights_path="b.ckpt", vits_weights_path="b.pth"),
           "v3": dict(base, version="v3", t2s_weights_path="gone.ckpt", vits_weights_path="gone.pth")}
    (tmp_path / "tts_infer.yaml").write_text(yaml.safe_dump(doc))
    config = load_config(tmp_path / "tts_infer.yaml", base_dir=tmp_path)
    sets = configured_weight_sets(config, WeightSet.from_config(config))
    assert [(w.gpt.name, w.sovits.name) for w in sets] == [("a.ckpt", "a.pth"), ("b.ckpt", "b.pth")]
    # the official file: its version sections are the built-in defaults, so only the active set counts
    shipped = parse_config({"custom": doc["custom"]}, base_dir=tmp_path)
    assert len(configured_weight_sets(shipped, WeightSet.from_config(shipped))) == 1


def test_warm_up_synthesises_in_each_warm_up_language_and_runs_the_language_check(monkeypatch) -> None:
    import engine.text.language_check as language_check

    config = load_config(model_config("v2"))
    studio = _studio(config)
    spoken, checked = [], []
    synthesize = studio.synthesize

    def record(text, lang, reference, options, *args, **kwargs):
        spoken.append((lang, reference.language, options.streaming_mode))
        return synthesize(text, lang, reference, options, *args, **kwargs)

    monkeypatch.setattr(studio, "synthesize", record)
    check = language_check.check_text_language
    monkeypatch.setattr(language_check, "check_text_language", lambda *a, **k: checked.append(a) or check(*a, **k))
    report = warm_up(studio, None, WarmupSettings(languages=("zh", "en"), max_tokens=4))
    # the first language streamed too: the chunk decodes' shapes are met before the first client
    assert report.errors == () and spoken == [("zh", "zh", False), ("zh", "zh", True), ("en", "en", False)]
    assert checked


def test_warm_up_reads_every_language_code_the_version_accepts(monkeypatch) -> None:
    """Each language loads its dictionaries on first use while holding the GIL (English numbers' inflect
    2.7 s, the auto codes' detector 1.5 s): warm-up reads a text with numbers in every code through the front
    end, so no request waits for that."""
    from engine.text.frontend import TextFrontend, languages

    read = []
    phones_and_bert = TextFrontend.phones_and_bert

    def record(self, text, language, with_bert=True):
        read.append((language, with_bert, text))
        return phones_and_bert(self, text, language, with_bert)

    monkeypatch.setattr(TextFrontend, "phones_and_bert", record)
    studio = _studio(load_config(model_config("v2")))
    report = warm_up(studio, None, WarmupSettings(languages=("en",), max_tokens=4))
    assert report.errors == ()
    front_end_only = {code: text for code, bert, text in read if not bert}
    assert set(front_end_only) == set(languages("v2"))
    # numbers too: their readers load on first use (English's inflect: seconds of imports under the GIL)
    assert all(any(ch.isdigit() for ch in text) for text in front_end_only.values())
