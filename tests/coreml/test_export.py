"""Core ML export on Linux: packages are written with the documented interface, precision and metadata.

Prediction needs macOS (coremltools' runtime library is missing here), so these tests inspect the
saved spec and reload packages with ``skip_model_load=True``. Tiny vocoders keep conversion fast.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

ct = pytest.importorskip("coremltools")

# a very small BigVGAN: two upsampling stages (hop 16), one AMP block per stage
TINY_BIGVGAN = {
    "resblock": "1", "upsample_rates": [4, 4], "upsample_kernel_sizes": [8, 8], "upsample_initial_channel": 16,
    "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3]], "activation": "snakebeta",
    "snake_logscale": True, "use_tanh_at_final": False, "use_bias_at_final": False, "num_mels": 100,
    "n_fft": 1024, "hop_size": 256, "win_size": 1024, "sampling_rate": 24000, "fmin": 0, "fmax": None,
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("coreml")


@pytest.fixture(scope="module")
def bigvgan_folder(work) -> Path:
    from engine.testweights.v3v4 import write_bigvgan_folder

    return write_bigvgan_folder(work / "bigvgan", config=TINY_BIGVGAN)


@pytest.fixture(scope="module")
def bigvgan_package(work, bigvgan_folder):
    from engine.coreml.export import export_vocoder, load_vocoder_for_export

    return export_vocoder(load_vocoder_for_export("bigvgan", bigvgan_folder), work / "bigvgan.mlpackage",
                          max_frames=256, min_frames=8)


@pytest.fixture(scope="module")
def v4_package(work):
    from engine.coreml.export import export_vocoder, load_vocoder_for_export
    from engine.testweights.v3v4 import write_v4_vocoder

    path = write_v4_vocoder(work / "vocoder.pth")
    return export_vocoder(load_vocoder_for_export("v4", path), work / "v4.mlpackage")


def _input_spec(path: Path):
    model = ct.models.MLModel(str(path), skip_model_load=True)  # reloads the package without compiling it
    return model.get_spec().description


def test_bigvgan_package_interface(bigvgan_package):
    from engine.coreml.package import read_package_info

    assert bigvgan_package.path.is_dir() and bigvgan_package.size_bytes > 0
    desc = _input_spec(bigvgan_package.path)
    assert [i.name for i in desc.input] == ["mel"]
    assert [o.name for o in desc.output] == ["audio"]
    mel = desc.input[0].type.multiArrayType
    assert mel.dataType == ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    ranges = [(r.lowerBound, r.upperBound) for r in mel.shapeRange.sizeRanges]
    assert ranges == [(1, 1), (100, 100), (8, 256)]
    assert desc.output[0].type.multiArrayType.dataType == ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    info = read_package_info(bigvgan_package.path)
    assert (info.kind, info.sample_rate, info.hop, info.channels) == ("bigvgan", 24000, 16, 100)
    assert (info.min_frames, info.max_frames, info.quantize) == (8, 256, "none")
    assert "sin" in info.precision and "float16" in info.precision


def test_bigvgan_precision_plan(bigvgan_package):
    """Snake (sin/pow/mul) and the anti-aliasing filters stay float32; the learned convs are float16."""
    from engine.coreml.package import op_precisions

    ops = op_precisions(bigvgan_package.path)
    for op in ("sin", "pow", "mul", "add", "pad", "clip"):
        assert ops[op] == {"float32"}, op
    assert "float16" in ops["conv"] and "float32" in ops["conv"]  # learned convs / grouped filters
    assert "float16" in ops["conv_transpose"] and "float32" in ops["conv_transpose"]
    assert bigvgan_package.fp16_ops > 0 and bigvgan_package.fp32_ops > bigvgan_package.fp16_ops


def test_float16_rule_selects_exactly_the_learned_convs(bigvgan_folder):
    from engine.coreml.export import _is_float16_module
    from engine.loading.vocoder import load_bigvgan

    net = load_bigvgan(bigvgan_folder)
    half = {n for n, m in net.named_modules() if _is_float16_module(m)}
    assert "conv_pre" in half and "ups.0.0" in half and "resblocks.0.convs1.0" in half
    assert "conv_post" not in half  # one output channel
    assert not any("activation" in n for n in half)  # the Kaiser-sinc filters


def test_estimated_error_is_measured_and_small(bigvgan_package, v4_package):
    # simulated fp16 convs against float32 torch; zero would mean the simulation did nothing
    for report in (bigvgan_package, v4_package):
        assert 0 < report.estimated_rel_error < 0.05


def test_v4_package(v4_package):
    from engine.coreml.package import op_precisions, read_package_info

    info = read_package_info(v4_package.path)
    assert (info.kind, info.sample_rate, info.hop, info.channels) == ("v4", 48000, 480, 100)
    assert info.input_names == ("mel",) and info.output_name == "audio"
    ops = op_precisions(v4_package.path)
    assert "float16" in ops["conv"] and ops["tanh"] == {"float32"} and ops["leaky_relu"] == {"float32"}


def test_int8_quantisation_shrinks_the_package(work, v4_package):
    from engine.coreml.export import export_vocoder, load_vocoder_for_export
    from engine.coreml.package import op_precisions, read_package_info

    report = export_vocoder(load_vocoder_for_export("v4", work / "vocoder.pth"), work / "v4_int8.mlpackage",
                            quantize="int8")
    assert report.size_bytes < v4_package.size_bytes
    assert read_package_info(report.path).quantize == "int8"
    assert "constexpr_affine_dequantize" in op_precisions(report.path)
    assert 0 < report.estimated_rel_error < 0.1


def test_v2_decoder_package(work):
    from engine.coreml.export import export_vocoder, load_vocoder_for_export
    from engine.coreml.package import read_package_info

    sovits = pytest.importorskip("engine.testweights.sovits")
    path = sovits.write_sovits(work / "s2_v2.pth", "v2")
    report = export_vocoder(load_vocoder_for_export("v2", path), work / "v2.mlpackage", max_frames=128)
    from engine.loading.sovits import load_sovits

    dims = load_sovits(path).dims
    info = read_package_info(report.path)
    assert info.input_names == ("z", "ge") and info.kind == "v2" and info.sample_rate == 32000
    assert info.hop == 640 and info.channels == dims.inter_channels
    ge = _input_spec(report.path).input[1].type.multiArrayType
    assert list(ge.shape) == [1, dims.gin_channels, 1]


def test_cli_export_and_bad_inputs(work, bigvgan_folder, capsys):
    from studio.cli import main

    out = work / "cli.mlpackage"
    assert main(["export-coreml", "--vocoder", "bigvgan", "--weights", str(bigvgan_folder), "--out", str(out),
                 "--max-frames", "64", "--min-frames", "8"]) == 0
    assert "wrote" in capsys.readouterr().out and (out / "Manifest.json").is_file()
    # a missing BigVGAN folder, and a v4 file given as BigVGAN: clear errors, exit code 1
    assert main(["export-coreml", "--vocoder", "bigvgan", "--weights", str(work / "nope"), "--out", str(out)]) == 1
    assert "BigVGAN folder not found" in capsys.readouterr().err
    assert main(["export-coreml", "--vocoder", "v4", "--weights", str(bigvgan_folder), "--out", str(out)]) == 1
    assert "vocoder" in capsys.readouterr().err
    assert main(["export-coreml", "--vocoder", "v4", "--weights", str(work / "vocoder.pth"), "--out",
                 str(work / "x.zip")]) == 1
    assert ".mlpackage" in capsys.readouterr().err


def test_package_of_another_vocoder_is_refused(bigvgan_package, v4_package):
    from engine.coreml.package import check_package, read_package_info
    from engine.errors import CheckpointError

    info = read_package_info(v4_package.path)
    with pytest.raises(CheckpointError, match="exported for the 'v4' vocoder.*needs 'bigvgan'.*24000 Hz"):
        check_package(info, "bigvgan", 24000, 256, 100)
    check_package(info, "v4", 48000, 480, 100)  # the right one passes


def test_corrupt_and_foreign_packages(work, bigvgan_package):
    from engine.coreml.package import read_package_info
    from engine.errors import CheckpointError

    with pytest.raises(CheckpointError, match="not found"):
        read_package_info(work / "missing.mlpackage")
    broken = work / "broken.mlpackage"
    shutil.copytree(bigvgan_package.path, broken)
    spec = broken / "Data" / "com.apple.CoreML" / "model.mlmodel"
    spec.write_bytes(spec.read_bytes()[: 200] + b"\xff" * 50)
    with pytest.raises(CheckpointError, match="corrupt"):
        read_package_info(broken)
    (broken / "Manifest.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        read_package_info(broken)
    spec.unlink()
    (broken / "Manifest.json").unlink()
    with pytest.raises(CheckpointError, match="not a Core ML"):
        read_package_info(broken)
    # a valid ML program that SoVITS Studio did not write
    import numpy as np

    traced = torch.jit.trace(torch.nn.Conv1d(4, 4, 3, padding=1).eval(), torch.randn(1, 4, 8))
    foreign = ct.convert(traced, inputs=[ct.TensorType(name="x", shape=(1, 4, 8), dtype=np.float32)],
                         convert_to="mlprogram", minimum_deployment_target=ct.target.macOS13)
    foreign.save(str(work / "foreign.mlpackage"))
    with pytest.raises(CheckpointError, match="not exported by SoVITS Studio"):
        read_package_info(work / "foreign.mlpackage")


def test_bad_export_options(work, bigvgan_folder):
    from engine.coreml.export import export_vocoder, load_vocoder_for_export
    from engine.errors import OptionsError

    spec = load_vocoder_for_export("bigvgan", bigvgan_folder)
    with pytest.raises(OptionsError, match="quantize"):
        export_vocoder(spec, work / "q.mlpackage", quantize="int4")
    with pytest.raises(OptionsError, match="min_frames"):
        export_vocoder(spec, work / "q.mlpackage", max_frames=4, min_frames=8)
    with pytest.raises(OptionsError):
        load_vocoder_for_export("hifigan", bigvgan_folder)
