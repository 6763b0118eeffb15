"""Vocoder backend choice (torch / Core ML) with the platform, coremltools and the package faked."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.acoustic.vocoder_backend import decide_backend, relative_error, select_vocoder
from engine.errors import CheckpointError, ConfigError

HOP = 4


def torch_vocoder(mel: torch.Tensor) -> torch.Tensor:  # a stand-in: (1, C, T) -> (1, 1, T * HOP)
    return torch.tanh(mel.mean(1, keepdim=True)).repeat_interleave(HOP, dim=-1)


class FakePackage:
    def __init__(self, offset: float = 0.0, quantize: str = "none", fail: bool = False):
        self.offset, self.fail = offset, fail
        self.info = type("Info", (), {"quantize": quantize})()

    def __call__(self, mel):
        if self.fail:
            raise RuntimeError("Core ML prediction failed")
        return torch_vocoder(mel) + self.offset


def loader_returning(pkg):
    calls = []

    def load(path, **expected):
        calls.append((path, expected))
        return pkg

    load.calls = calls
    return load


COMMON = dict(kind="bigvgan", sample_rate=24000, hop=HOP, channels=100)


@pytest.mark.parametrize(
    "requested,system,ct_ok,package,backend,reason",
    [
        ("torch", "Darwin", True, "x.mlpackage", "torch", ""),
        ("torch", "Linux", False, None, "torch", ""),
        ("coreml", "Darwin", True, "x.mlpackage", "coreml", ""),
        ("coreml", "Linux", True, "x.mlpackage", "torch", "needs macOS (this is Linux)"),
        ("coreml", "Windows", True, "x.mlpackage", "torch", "needs macOS (this is Windows)"),
        ("coreml", "Darwin", False, "x.mlpackage", "torch", "needs coremltools"),
        ("coreml", "Darwin", True, None, "torch", "needs a package"),
    ],
)
def test_decision_table(requested, system, ct_ok, package, backend, reason):
    d = decide_backend(requested, system, ct_ok, package)
    assert d.backend == backend
    assert (reason in d.reason) if reason else d.reason == ""


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="vocoder_backend must be one of torch, coreml"):
        decide_backend("onnx", "Darwin", True, "x.mlpackage")
    with pytest.raises(ConfigError):
        select_vocoder("metal", torch_vocoder, **COMMON)


def test_coreml_off_macos_falls_back_with_one_clear_message(caplog):
    load = loader_returning(FakePackage())
    with caplog.at_level(logging.WARNING, logger="engine.acoustic.vocoder_backend"):
        sel = select_vocoder("coreml", torch_vocoder, package="x.mlpackage", system="Linux", coremltools_ok=True,
                             load_package=load, **COMMON)
    assert sel.backend == "torch" and sel.vocoder is torch_vocoder
    assert load.calls == []  # nothing is even loaded
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "needs macOS" in warnings[0]


def test_coreml_on_macos_is_used_when_it_matches_torch():
    load = loader_returning(FakePackage(offset=1e-3))
    sel = select_vocoder("coreml", torch_vocoder, package="v.mlpackage", system="Darwin", coremltools_ok=True,
                         load_package=load, **COMMON)
    assert sel.backend == "coreml" and sel.reason == ""
    assert 0 < sel.probe_error < 0.05
    assert load.calls == [("v.mlpackage", COMMON)]  # the package is checked against this vocoder


def test_coreml_too_different_falls_back(caplog):
    with caplog.at_level(logging.WARNING, logger="engine.acoustic.vocoder_backend"):
        sel = select_vocoder("coreml", torch_vocoder, package="v.mlpackage", system="Darwin", coremltools_ok=True,
                             load_package=loader_returning(FakePackage(offset=0.5)), **COMMON)
    assert sel.backend == "torch" and sel.probe_error > 0.05
    assert "differs from the torch vocoder" in sel.reason and caplog.records


def test_int8_packages_get_a_wider_tolerance():
    pkg = FakePackage(offset=0.07, quantize="int8")  # above the fp16 limit, within the int8 one
    sel = select_vocoder("coreml", torch_vocoder, package="v.mlpackage", system="Darwin", coremltools_ok=True,
                         load_package=loader_returning(pkg), **COMMON)
    ref = torch_vocoder(torch.full((1, 100, 4), -5.0))
    assert sel.backend == "coreml", (sel.reason, relative_error(ref + 0.07, ref))


def test_prediction_failure_falls_back():
    sel = select_vocoder("coreml", torch_vocoder, package="v.mlpackage", system="Darwin", coremltools_ok=True,
                         load_package=loader_returning(FakePackage(fail=True)), **COMMON)
    assert sel.backend == "torch" and "test prediction failed" in sel.reason


def test_wrong_or_corrupt_package_falls_back():
    def load(path, **expected):
        raise CheckpointError(f"Core ML package {path} does not fit: it was exported for the 'v4' vocoder")

    sel = select_vocoder("coreml", torch_vocoder, package="v4.mlpackage", system="Darwin", coremltools_ok=True,
                         load_package=load, **COMMON)
    assert sel.backend == "torch" and "exported for the 'v4' vocoder" in sel.reason


def test_real_loader_rejects_a_missing_package_before_loading(tmp_path):
    sel = select_vocoder("coreml", torch_vocoder, package=str(tmp_path / "none.mlpackage"), system="Darwin",
                         coremltools_ok=True, **COMMON)
    assert sel.backend == "torch" and "not found" in sel.reason


def test_coreml_wrapper_feeds_pads_and_windows(tmp_path):
    """The macOS wrapper's own logic, with Core ML's predict() faked by a torch function."""
    import numpy as np

    from engine.coreml.package import CoreMLVocoder, PackageInfo

    calls = []

    class FakeModel:
        def predict(self, feed):
            calls.append({k: v.shape for k, v in feed.items()})
            mel = torch.from_numpy(feed["mel"])
            return {"audio": torch_vocoder(mel).numpy().astype(np.float32)}

    info = PackageInfo(path=tmp_path / "p.mlpackage", kind="bigvgan", sample_rate=24000, hop=HOP, channels=100,
                       min_frames=8, max_frames=200, input_names=("mel",), output_name="audio", quantize="none",
                       precision="", metadata={})
    voc = CoreMLVocoder.__new__(CoreMLVocoder)  # skip __init__: no Core ML runtime off macOS
    voc.info, voc._model = info, FakeModel()
    mel = torch.randn(1, 100, 450) - 5
    assert torch.allclose(voc(mel), torch_vocoder(mel), atol=1e-6)  # three windows, context discarded
    assert all(c["mel"][-1] <= 200 for c in calls) and len(calls) > 1
    short = torch.randn(1, 100, 3) - 5
    out = voc(short)  # padded to min_frames, extra audio cut
    assert out.shape == (1, 1, 3 * HOP) and calls[-1]["mel"] == (1, 100, 8)
    assert torch.allclose(out, torch_vocoder(short), atol=1e-6)


def test_v2_decoder_is_probed_with_a_style_vector():
    seen = []

    def dec(z, ge):  # the v2 HiFi-GAN decoder signature
        seen.append((tuple(z.shape), tuple(ge.shape)))
        return torch.tanh(z.mean(1, keepdim=True) + ge.mean()).repeat_interleave(HOP, dim=-1)

    sel = select_vocoder("coreml", dec, kind="v2", sample_rate=32000, hop=HOP, channels=192, gin_channels=512,
                         package="v2.mlpackage", system="Darwin", coremltools_ok=True, load_package=loader_returning(dec))
    assert sel.backend == "coreml" and sel.probe_error == 0.0
    assert seen[0] == ((1, 192, 32), (1, 512, 1))
