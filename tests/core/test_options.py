"""SynthesisOptions: official defaults, validation naming the field, and the mode rules of the official TTS.run."""

from __future__ import annotations

import dataclasses

import pytest

from engine.data import load_json
from engine.errors import OptionsError
from engine.options import EngineSettings, SynthesisOptions, option_names, resolve_plan


def test_defaults_are_the_official_tts_run_defaults():
    official = load_json("model_configs.json")["TTS.run defaults"]
    opts = SynthesisOptions()
    for name, value in official.items():
        assert getattr(opts, name) == value, name
    ours_only = set(option_names()) - set(official)
    assert ours_only == {"early_stop_num"}  # our one addition (None = the checkpoint's value)
    assert opts.early_stop_num is None


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SynthesisOptions().top_k = 3  # type: ignore[misc]


@pytest.mark.parametrize("field,value", [
    ("text_split_method", "cut9"), ("batch_size", 0), ("batch_size", 1.5), ("batch_threshold", 1.5),
    ("top_k", 0), ("top_k", True), ("top_p", 0.0), ("top_p", 1.2), ("temperature", -0.1),
    ("temperature", float("nan")), ("repetition_penalty", 0), ("speed_factor", 0.0), ("speed_factor", 100),
    ("fragment_interval", -1), ("seed", -2), ("seed", 2**32), ("seed", "7"), ("sample_steps", 0),
    ("overlap_length", 0), ("min_chunk_length", 0), ("streaming_mode", 1), ("parallel_infer", "yes"),
    ("split_bucket", None), ("early_stop_num", 0),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(OptionsError, match=field):
        SynthesisOptions(**{field: value})


def test_replace_and_from_mapping():
    opts = SynthesisOptions().replace(top_k=5, seed=3)
    assert (opts.top_k, opts.seed) == (5, 3)
    with pytest.raises(OptionsError, match="top_kk"):
        SynthesisOptions().replace(top_kk=5)
    with pytest.raises(OptionsError, match="batch_size"):
        SynthesisOptions().replace(batch_size=-1)
    api = load_json("model_configs.json")["api_v2.py TTS_Request defaults"]
    from_api = SynthesisOptions.from_mapping(api, ignore=("media_type", "prompt_text"))
    assert from_api.text_split_method == "cut5" and from_api.top_k == 15
    assert SynthesisOptions.from_mapping({"top_k": None}).top_k == 15  # None keeps the default
    with pytest.raises(OptionsError, match="media_type"):
        SynthesisOptions.from_mapping({"media_type": "wav"})


# (options, version) -> expected plan, read off the official rules (the flag rewrites at the start of TTS.run)
PLAN_CASES = [
    ({}, "v2", dict(t2s_loop="batch", streaming=False, return_fragment=False, split_bucket=True, parallel_infer=True)),
    ({"parallel_infer": False}, "v2", dict(t2s_loop="naive", split_bucket=True)),
    ({"streaming_mode": True}, "v2",
     dict(t2s_loop="stream", streaming=True, parallel_infer=False, split_bucket=False)),
    ({"streaming_mode": True, "parallel_infer": False}, "v2Pro", dict(t2s_loop="stream", split_bucket=False)),
    ({"streaming_mode": True}, "v3",
     dict(t2s_loop="batch", streaming=False, return_fragment=True, split_bucket=False, parallel_infer=True)),
    ({"streaming_mode": True, "parallel_infer": False}, "v4",
     dict(t2s_loop="naive", streaming=False, return_fragment=True, split_bucket=False)),
    ({"streaming_mode": True, "return_fragment": True}, "v2", dict(streaming=True, return_fragment=False)),
    ({"return_fragment": True}, "v2", dict(t2s_loop="batch", return_fragment=True, split_bucket=False)),
    ({"speed_factor": 1.2}, "v2", dict(split_bucket=False)),
    ({}, "v3", dict(t2s_loop="batch", split_bucket=False)),
    ({"parallel_infer": False}, "v4", dict(t2s_loop="naive", split_bucket=True)),
    ({"split_bucket": False}, "v2", dict(split_bucket=False)),
]


@pytest.mark.parametrize("changes,version,expected", PLAN_CASES)
def test_resolve_plan_follows_the_official_rules(changes, version, expected):
    opts = SynthesisOptions(**changes)
    plan = resolve_plan(opts, version)
    for key, value in expected.items():
        assert getattr(plan, key) == value, key
    # the options themselves are never rewritten; every override is explained
    assert dataclasses.asdict(opts) == dataclasses.asdict(SynthesisOptions(**changes))
    changed = sum(getattr(plan, k) != getattr(opts, {"streaming": "streaming_mode"}.get(k, k))
                  for k in ("streaming", "return_fragment", "split_bucket", "parallel_infer"))
    assert len(plan.notes) >= (1 if changed else 0)


def test_super_sampling_is_reported_not_silently_dropped():
    plan = resolve_plan(SynthesisOptions(super_sampling=True), "v3")
    assert plan.super_sampling is False and any("super_sampling" in n for n in plan.notes)


@pytest.mark.parametrize("field,value", [
    ("reference_cache_entries", -1), ("model_pool_bytes", 1.5), ("memory_watermark", 0.0),
    ("memory_watermark", 1.5), ("on_memory_pressure", "swap"), ("memory_wait_seconds", -1),
    ("weight_roots", "/models"), ("switch_interval_ms", -1), ("switch_interval_ms", float("nan")),
    ("reference_threads", 0),
])
def test_engine_settings_validation(field, value):
    with pytest.raises(OptionsError, match=field):
        EngineSettings(**{field: value})
