"""The official tts_infer.yaml format: parsing, fallbacks, validation; the file is never rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.config import PATH_KEYS, VERSIONS, load_config, parse_config
from engine.errors import ConfigError
from tests.support.paths import REPO

SHIPPED = REPO / "configs" / "tts_infer.yaml"


def _official_from_shipped() -> dict:
    """The official tts_infer.yaml: the shipped file with the device and is_half of the official `custom` section."""
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["custom"].update(device="cuda", is_half=True)
    return doc


def test_shipped_config_is_the_official_file_but_for_the_device(shared_dir: Path, tmp_path: Path) -> None:
    """The shipped file is the official one, except that `custom` names no device and no is_half (the engine picks
    them); the official file, unchanged, still loads and keeps its explicit device and precision."""
    official = shared_dir / "spec" / "data" / "tts_infer.yaml"
    if official.exists():
        assert _official_from_shipped() == yaml.safe_load(official.read_text())
    cfg = load_config(SHIPPED)
    assert cfg.active_name == "custom" and set(cfg.sections) == {"custom", *VERSIONS}
    assert cfg.active.version == "v2" and cfg.active.is_half is None and cfg.active.device == "auto"
    (tmp_path / "official.yaml").write_text(yaml.safe_dump(_official_from_shipped()))
    explicit = load_config(tmp_path / "official.yaml").active
    assert explicit.device == "cuda" and explicit.is_half is True


def test_the_shipped_config_picks_the_device_and_precision_itself(capsys, tmp_path: Path) -> None:
    """cuda, then mps, then cpu, with the precision to match, and no word about CUDA on a Mac or a CPU box; an
    explicit device (the official file's cuda) stays explicit: on a machine without it, a notice says so."""
    import argparse

    import torch

    from engine.runtime import DeviceProbe, runtime_for_config
    from studio.cli.bootstrap import build_studio

    h200 = DeviceProbe(cuda_count=1, cuda_capability=(9, 0), cuda_name="NVIDIA H200", cuda_bf16=True)
    f16, f32 = torch.float16, torch.float32
    active = load_config(SHIPPED).active
    for probe, device, t2s, vocoder in ((DeviceProbe(), "cpu", f32, f32), (DeviceProbe(mps=True), "mps", f16, f32),
                                        (h200, "cuda:0", f16, f16)):
        rt, notice = runtime_for_config(active.device, active.is_half, probe=probe)
        assert (str(rt.device), rt.dtype_for("t2s"), rt.dtype_for("vocoder"), notice) == (device, t2s, vocoder, "")
    rt, notice = runtime_for_config("cuda", True, probe=DeviceProbe())  # the official file on a laptop
    assert str(rt.device) == "cpu" and "asks for device 'cuda'" in notice
    assert runtime_for_config("cpu", None, probe=h200)[0].device.type == "cpu"  # a named device stays
    # the real machine (a CPU box here): nothing printed about CUDA
    studio = build_studio(load_config(SHIPPED, base_dir=tmp_path), argparse.Namespace(device=None, precision=None),
                          warmup=False, scheduler=False)
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert studio.runtime.device.type == expected and studio.device_notice == ""
    assert "cuda" not in capsys.readouterr().err.lower() or expected == "cuda"


def test_device_and_is_half_may_be_left_out_or_auto() -> None:
    base = {"version": "v2", "t2s_weights_path": "", "vits_weights_path": "", "bert_base_path": "",
            "cnhuhbert_base_path": ""}
    for section in (base, dict(base, device="auto"), dict(base, device=None, is_half=None)):
        active = parse_config({"custom": section}).active
        assert active.device in ("auto", "") and active.is_half is None
    with pytest.raises(ConfigError, match="is_half must be true/false"):
        parse_config({"custom": dict(base, is_half="yes")})


def test_loading_never_rewrites_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tts_infer.yaml"
    path.write_bytes(SHIPPED.read_bytes())
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    cfg = load_config(path, base_dir=tmp_path)
    cfg.path("t2s_weights_path")
    cfg.missing_files()
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_without_custom_the_v2_section_is_active() -> None:
    cfg = parse_config({"v3": {"device": "cpu", "is_half": False, "version": "v3", "t2s_weights_path": "a.ckpt",
                                "vits_weights_path": "b.pth", "bert_base_path": "bert", "cnhuhbert_base_path": "hub"}})
    assert cfg.active_name == "v2" and cfg.active.version == "v2"
    assert cfg.sections["v3"].t2s_weights_path == "a.ckpt"  # the file's section replaces the default one


def test_missing_paths_fall_back_to_the_version_section(tmp_path: Path) -> None:
    (tmp_path / "mine.ckpt").write_bytes(b"x")
    (tmp_path / "v2default.pth").write_bytes(b"x")
    section = {"device": "cpu", "is_half": False, "version": "v2", "bert_base_path": "",
               "cnhuhbert_base_path": "nowhere", "t2s_weights_path": "mine.ckpt", "vits_weights_path": "gone.pth"}
    v2 = dict(section, t2s_weights_path="other.ckpt", vits_weights_path="v2default.pth", bert_base_path="bert")
    cfg = parse_config({"custom": section, "v2": v2}, base_dir=tmp_path)
    assert cfg.path("t2s_weights_path") == tmp_path / "mine.ckpt"  # exists: kept
    assert cfg.path("vits_weights_path") == tmp_path / "v2default.pth"  # missing: the v2 section's
    assert cfg.path("bert_base_path") == tmp_path / "bert"  # empty: the v2 section's
    missing = cfg.missing_files()
    assert set(missing) == {"bert_base_path", "cnhuhbert_base_path"}
    assert set(missing) <= set(PATH_KEYS)


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"custom": {"device": "cpu", "is_half": False, "version": "v2", "t2s_weights_path": "", "vits_weights_path": "",
                     "bert_base_path": "", "cnhuhbert_base_path": "", "devise": "cpu"}}, "devise"),
        ({"custom": {"device": "cpu", "is_half": "yes", "version": "v2", "t2s_weights_path": "",
                     "vits_weights_path": "", "bert_base_path": "", "cnhuhbert_base_path": ""}}, "is_half"),
        ({"custom": {"device": 0, "is_half": False, "version": "v2", "t2s_weights_path": "", "vits_weights_path": "",
                     "bert_base_path": "", "cnhuhbert_base_path": ""}}, "device"),
        ({"custom": {"device": "cpu", "is_half": False, "version": "v5", "t2s_weights_path": "",
                     "vits_weights_path": "", "bert_base_path": "", "cnhuhbert_base_path": ""}}, "version"),
        ({"custom": {"device": "cpu", "is_half": False, "version": "v2"}}, "t2s_weights_path"),
        ({"v9": {}}, "v9"),
        ({"custom": ["not", "a", "mapping"]}, "custom"),
        (["sections"], "mapping"),
    ],
)
def test_bad_keys_and_types_name_the_key(doc, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config(doc, "test.yaml")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("custom: [unclosed\n")
    with pytest.raises(ConfigError, match="YAML"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).active_name == "v2"  # an empty file means the built-in defaults


def test_extensions_are_validated() -> None:
    base = {"device": "cpu", "is_half": False, "version": "v3", "t2s_weights_path": "", "vits_weights_path": "",
            "bert_base_path": "", "cnhuhbert_base_path": ""}
    cfg = parse_config({"custom": dict(base, vocoder_backend="coreml", vocoder_coreml_package="v.mlpackage")})
    assert cfg.active.vocoder_backend == "coreml" and cfg.active.vocoder_coreml_package == "v.mlpackage"
    with pytest.raises(ConfigError, match="vocoder_backend"):
        parse_config({"custom": dict(base, vocoder_backend="onnx")})


def test_a_token_cap_and_the_random_weights_mark_are_checked() -> None:
    from engine.config import parse_config

    section = {"device": "cpu", "is_half": False, "version": "v2", "t2s_weights_path": "", "vits_weights_path": "",
               "bert_base_path": "", "cnhuhbert_base_path": ""}
    config = parse_config({"custom": {**section, "max_tokens_per_sentence": 50, "random_weights": True}})
    assert config.active.max_tokens_per_sentence == 50 and config.active.random_weights
    assert parse_config({"custom": section}).active.max_tokens_per_sentence == 0  # the model's own limit
    for bad in (-1, "50", True, 2.5):
        with pytest.raises(ConfigError, match="max_tokens_per_sentence must be a whole number"):
            parse_config({"custom": {**section, "max_tokens_per_sentence": bad}})
