"""`make-test-weights` writes complete model sets that our loaders and `inspect` recognise."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import load_config
from engine.loading.inspection import describe
from engine.testweights import LAYOUT, PRETRAINED, VERSIONS, make_test_weights
from engine.versions import uses_speaker_embedding
from studio.cli import main

KINDS = {"t2s_weights_path": "gpt", "vits_weights_path": "sovits", "bert_base_path": "bert",
         "cnhuhbert_base_path": "hubert"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_is_complete_and_recognised(tmp_path: Path, version: str) -> None:
    config = load_config(make_test_weights(tmp_path, version))
    assert config.active.version == version and config.missing_files() == {}
    for key, kind in KINDS.items():
        d = describe(config.path(key))
        assert d["kind"] == kind, key
        if kind == "gpt":
            assert d["version"] == ("v1" if version == "v1" else "v2")
        if kind == "sovits":
            assert d["version"] == version and d["dtype"] == "float16"
    # official file names and folders
    for rel in LAYOUT[version].values():
        assert (tmp_path / PRETRAINED / rel).exists(), rel
    extra = {"v3": "bigvgan", "v4": "vocoder"}.get(version)
    if extra:
        assert describe(config.active.vocoder_path)["kind"] == extra
    if uses_speaker_embedding(version):
        assert describe(config.active.sv_weights_path)["kind"] == "sv"


def test_cli_writes_a_set(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["make-test-weights", str(tmp_path / "set"), "--version", "v2"]) == 0
    assert "tts_infer.yaml" in capsys.readouterr().out
    assert (tmp_path / "set" / "tts_infer.yaml").exists()
    with pytest.raises(SystemExit):
        main(["make-test-weights", str(tmp_path / "x"), "--version", "v9"])


def test_cli_gpt_shape_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from engine.loading.t2s import load_t2s

    assert main(["make-test-weights", str(tmp_path / "set"), "--version", "v2",
                 "--t2s-width", "40", "--t2s-heads", "5", "--t2s-layers", "1"]) == 0
    model, _ = load_t2s(load_config(tmp_path / "set" / "tts_infer.yaml").path("t2s_weights_path"))
    d = model.dims
    assert (d.hidden_dim, d.embedding_dim, d.n_head, d.head_dim, d.n_layer, d.ffn_dim) == (40, 40, 5, 8, 1, 160)
    assert main(["make-test-weights", str(tmp_path / "bad"), "--version", "v2", "--t2s-width", "30",
                 "--t2s-heads", "4"]) == 2
    assert "multiple of the head count" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "tts_infer.yaml").exists()
