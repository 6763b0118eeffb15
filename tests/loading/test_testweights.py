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
