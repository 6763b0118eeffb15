"""The Core ML switch, end to end with the platform faked: the v2 HiFi-GAN package runs in place of the
torch decoder (or visibly does not), each version finds its own vocoder and package in one config,
misconfiguration is reported, and coremltools' import noise stays off Linux consoles."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from engine.acoustic.vocoder_backend import use_coreml_decoder
from engine.config import parse_config
from engine.coreml.package import CoreMLDecoder
from engine.loading.model_pool import WeightSet
from tests.support.synth import model_config


def _tiny_sovits():
    from engine.config import load_config
    from engine.loading.sovits import load_sovits

    config = load_config(model_config("v2"))
    loaded = load_sovits(config.path("vits_weights_path"))
    return loaded.module, loaded.sampling_rate


class Package:
    """A stand-in for a Core ML package of a decoder: the torch decoder's math (plus an offset)."""

    def __init__(self, decoder: torch.nn.Module, offset: float = 0.0) -> None:
        self.decoder, self.offset, self.calls = decoder, offset, 0
        self.info = type("Info", (), {"quantize": "none"})()

    def __call__(self, z: torch.Tensor, ge: torch.Tensor | None = None) -> torch.Tensor:
        self.calls += 1
        with torch.no_grad():
            return self.decoder(z, g=ge) + self.offset


def test_the_v2_decoder_package_replaces_the_torch_decoder_on_macos() -> None:
    sovits, rate = _tiny_sovits()
    torch_dec = sovits.dec
    package = Package(torch_dec)
    chosen = use_coreml_decoder(sovits, "dec.mlpackage", rate, system="Darwin", coremltools_ok=True,
                                load_package=lambda path, **identity: package)
    assert chosen.backend == "coreml" and isinstance(sovits.dec, CoreMLDecoder)
    z, g = torch.randn(1, sovits.dims.inter_channels, 6), torch.randn(1, sovits.dims.gin_channels, 1)
    with torch.no_grad():
        assert torch.allclose(sovits.dec(z, g=g), torch_dec(z, g=g), atol=1e-6)
    assert package.calls == 2  # the probe, then the call above


def test_a_package_of_other_weights_keeps_the_torch_decoder(caplog: pytest.LogCaptureFixture) -> None:
    sovits, rate = _tiny_sovits()
    torch_dec = sovits.dec
    with caplog.at_level(logging.WARNING, logger="engine.acoustic.vocoder_backend"):
        chosen = use_coreml_decoder(sovits, "other.mlpackage", rate, system="Darwin", coremltools_ok=True,
                                    load_package=lambda path, **identity: Package(torch_dec, offset=0.5))
    assert chosen.backend == "torch" and sovits.dec is torch_dec
    assert "differs from the torch vocoder" in caplog.text
    with caplog.at_level(logging.WARNING, logger="engine.acoustic.vocoder_backend"):
        off_mac = use_coreml_decoder(sovits, "dec.mlpackage", rate, system="Linux", coremltools_ok=True)
    assert off_mac.backend == "torch" and "needs macOS" in off_mac.reason


SECTION = {"device": "cpu", "is_half": False, "t2s_weights_path": "g.ckpt", "vits_weights_path": "s.pth",
           "bert_base_path": "bert", "cnhuhbert_base_path": "hubert"}


def test_v3_and_v4_each_find_their_own_vocoder(tmp_path) -> None:
    (tmp_path / "bigvgan").mkdir()
    (tmp_path / "vocoder.pth").write_bytes(b"x")
    cfg = parse_config({"custom": dict(SECTION, version="v4", vocoder_path="vocoder.pth"),
                        "v3": dict(SECTION, version="v3", vocoder_path="bigvgan",
                                   vocoder_backend="coreml", vocoder_coreml_package="v3.mlpackage")},
                       base_dir=tmp_path)
    weights = WeightSet.from_config(cfg)
    assert weights.extra("vocoder", "v4") == tmp_path / "vocoder.pth"
    assert weights.extra("vocoder", "v3") == tmp_path / "bigvgan"  # not the v4 file of the active section
    assert weights.backend("v3") == ("coreml", str(tmp_path / "v3.mlpackage"))
    assert weights.backend("v4") == ("torch", "")
    bare = WeightSet.from_config(parse_config({"custom": dict(SECTION, version="v4")}, base_dir=tmp_path))
    assert bare.extra("vocoder", "v3") == tmp_path / "GPT_SoVITS/pretrained_models/models--nvidia--bigvgan_v2_24khz_100band_256x"


def test_v2_decoder_packages_are_per_version(tmp_path) -> None:
    cfg = parse_config({"custom": dict(SECTION, version="v2", vocoder_backend="coreml",
                                       vocoder_coreml_package="dec.mlpackage")}, base_dir=tmp_path)
    assert WeightSet.from_config(cfg).coreml_decoders() == (("v2", str(tmp_path / "dec.mlpackage")),)


def test_misconfiguration_is_reported(tmp_path) -> None:
    (tmp_path / "vocoder.pth").write_bytes(b"x")
    cfg = parse_config({
        "custom": dict(SECTION, version="v3", vocoder_path="vocoder.pth"),
        "v2": dict(SECTION, version="v2", vocoder_coreml_package="dec.mlpackage"),
        "v4": dict(SECTION, version="v4", vocoder_backend="coreml"),
        "v1": dict(SECTION, version="v1", vocoder_path="x"),
    }, base_dir=tmp_path)
    problems = "\n".join(cfg.problems())
    assert "custom.vocoder_path 'vocoder.pth' is a file, but v3 needs the BigVGAN folder" in problems
    assert "v2.vocoder_coreml_package is set but v2.vocoder_backend is 'torch'" in problems
    assert "v4.vocoder_backend is 'coreml' but v4.vocoder_coreml_package is empty" in problems
    assert "v1.vocoder_path is set but v1 is a v1 section" in problems
    assert parse_config({"custom": dict(SECTION, version="v2")}).problems() == []


def test_coremltools_import_is_quiet_off_macos() -> None:
    pytest.importorskip("coremltools")
    code = "from engine.coreml import import_coremltools; import_coremltools('Linux'); print('imported')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "imported" in run.stdout
    assert "libcoremlpython" not in run.stderr and "has not been tested" not in run.stderr, run.stderr
