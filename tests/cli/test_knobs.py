"""The operating knobs: one flag per config key on serve/webui/synth, the flag over the config over the
default, and the default read from the settings dataclass that owns it."""

from __future__ import annotations

import argparse

from engine.config import ENGINE, KNOBS, WARMUP, parse_config
from engine.options import EngineSettings
from engine.warmup import WarmupSettings
from studio.cli.bootstrap import add_knob_arguments, knob_settings, knob_values

SECTION = {"device": "cpu", "is_half": False, "version": "v2", "t2s_weights_path": "", "vits_weights_path": "",
           "bert_base_path": "", "cnhuhbert_base_path": ""}


def parser(warmup: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_knob_arguments(p, warmup=warmup)
    return p


def test_flags_win_over_config_keys_over_defaults() -> None:
    config = parse_config({"custom": dict(SECTION, model_pool_mb=1024, reference_cache_entries=3, warmup=True)})
    args = parser().parse_args(["--model-pool-mb", "512", "--no-warmup", "--memory-watermark", "0.7"])
    values = knob_values(config, args)
    assert values == {"model_pool_mb": 512, "reference_cache_entries": 3, "warmup": False, "memory_watermark": 0.7}
    engine = EngineSettings(**knob_settings(ENGINE, values))
    assert engine.model_pool_bytes == 512 << 20 and engine.reference_cache_entries == 3
    assert engine.memory_watermark == 0.7 and engine.reference_cache_bytes == EngineSettings().reference_cache_bytes
    assert WarmupSettings(**knob_settings(WARMUP, values)).enabled is False


def test_defaults_come_from_the_owning_dataclass() -> None:
    by_key = {k.key: k for k in KNOBS}
    assert by_key["model_pool_mb"].default() == EngineSettings().model_pool_bytes >> 20
    assert by_key["warmup"].default() is WarmupSettings().enabled
    text = parser().format_help()
    assert f"(default {EngineSettings().memory_watermark})" in text and "--no-warmup" in text
    assert "--warmup" not in parser(warmup=False).format_help()  # synth: nothing to warm up
    assert parser().parse_args([]).model_pool_mb is None  # unset flags leave the config's value


def test_the_switch_interval_knob_sets_the_serving_process_gil_interval() -> None:
    import sys

    from engine.platform_env import set_switch_interval

    config = parse_config({"custom": dict(SECTION, switch_interval_ms=2.0)})
    values = knob_values(config, parser().parse_args(["--switch-interval-ms", "0.5"]))
    engine = EngineSettings(**knob_settings(ENGINE, values))
    assert engine.switch_interval_ms == 0.5 and EngineSettings().switch_interval_ms == 0.0
    before = sys.getswitchinterval()
    try:
        set_switch_interval(0.0)  # 0: Python's own is left as it is
        assert sys.getswitchinterval() == before
        set_switch_interval(engine.switch_interval_ms)
        assert abs(sys.getswitchinterval() - 0.0005) < 1e-9
    finally:
        sys.setswitchinterval(before)
