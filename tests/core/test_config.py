"""The official tts_infer.yaml format: parsing, fallbacks, validation; the file is never rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.config import PATH_KEYS, VERSIONS, load_config, parse_config
from engine.errors import ConfigError
from tests.support.paths import REPO

SHIPPED = REPO / "configs" / "tts_infer.yaml"


def test_shipped_config_is_the_official_file(shared_dir: Path) -> None:
    official = shared_dir / "spec" / "data" / "tts_infer.yaml"
    if official.exists():
        assert yaml.safe_load(SHIPPED.read_text()) == yaml.safe_load(official.read_text())
    cfg = load_config(SHIPPED)
    assert cfg.active_name == "custom"
    assert cfg.active.version == "v2" and cfg.active.is_half is True and cfg.active.device == "cuda"
    assert set(cfg.sections) == {"custom", *VERSIONS}


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
