"""Precision per stage from the config section: the `precision` key (a name or a mapping of stages),
`is_half` on MPS meaning the auto policy, and the command line over both (devices faked)."""

from __future__ import annotations

import pytest
import torch

from engine.config import parse_config
from engine.errors import ConfigError
from engine.runtime import DeviceProbe, runtime_for_config

MAC = DeviceProbe(mps=True)
H200 = DeviceProbe(cuda_count=1, cuda_capability=(9, 0), cuda_name="NVIDIA H200", cuda_bf16=True)
F16, F32 = torch.float16, torch.float32
SECTION = {"device": "mps", "is_half": True, "version": "v2", "t2s_weights_path": "", "vits_weights_path": "",
           "bert_base_path": "", "cnhuhbert_base_path": ""}


def runtime(section: dict, probe: DeviceProbe = MAC, **override):
    active = parse_config({"custom": section}).active
    rt, _ = runtime_for_config(active.device, active.is_half, probe=probe, precision=active.precision or None,
                               stage_precisions=dict(active.stage_precisions), **override)
    return rt


def test_is_half_on_mps_keeps_the_vocoders_in_fp32() -> None:
    rt = runtime(SECTION)
    assert rt.dtype_for("vocoder") == F32 and rt.dtype_for("t2s") == F16 and rt.dtype_for("sovits") == F16
    assert runtime(dict(SECTION, device="cuda"), H200).dtype_for("vocoder") == F16  # CUDA: official is_half
    assert set(runtime(dict(SECTION, is_half=False)).stage_dtypes.values()) == {F32}


def test_a_stage_key_says_otherwise() -> None:
    rt = runtime(dict(SECTION, precision={"vocoder": "fp16", "bert": "fp32"}))
    assert rt.dtype_for("vocoder") == F16 and rt.dtype_for("bert") == F32 and rt.dtype_for("t2s") == F16
    rt = runtime(dict(SECTION, precision={"default": "fp32", "t2s": "fp16"}))
    assert rt.dtype_for("t2s") == F16 and rt.dtype_for("sovits") == F32 and rt.dtype_for("vocoder") == F32
    assert set(runtime(dict(SECTION, precision="fp32")).stage_dtypes.values()) == {F32}


def test_the_command_line_sets_the_base_and_stage_keys_still_apply() -> None:
    rt = runtime(dict(SECTION, precision={"vocoder": "fp32"}), override_precision="fp16")
    assert rt.dtype_for("t2s") == F16 and rt.dtype_for("vocoder") == F32
    rt = runtime(SECTION, override_precision="fp16")
    assert rt.dtype_for("vocoder") == F16  # no stage key: the command line's fp16 everywhere
    assert set(runtime(SECTION, H200, override_device="cpu").stage_dtypes.values()) == {F32}


@pytest.mark.parametrize("value, words", [
    ("fp8", "precision is 'fp8'"), ({"decoder": "fp16"}, "unknown stage"), ({"t2s": "auto"}, "precision.t2s"),
    (["fp16"], "mapping of stages"),
])
def test_bad_precision_keys_name_the_key(value, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config({"custom": dict(SECTION, precision=value)})


def test_knobs_parse_with_their_types() -> None:
    active = parse_config({"custom": dict(SECTION, model_pool_mb=2048, memory_watermark=0.85, warmup=False,
                                          slots=4)}).active
    assert active.knob_values == {"model_pool_mb": 2048, "memory_watermark": 0.85, "warmup": False, "slots": 4}
    for key, bad in (("model_pool_mb", "2GB"), ("warmup", "no"), ("memory_watermark", True), ("slots", 1.5)):
        with pytest.raises(ConfigError, match=key):
            parse_config({"custom": dict(SECTION, **{key: bad})})
