"""`sovits-studio inspect` on every checkpoint and model folder of the fixture root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import load_torch_file
from engine.loading.inspection import describe
from studio.cli import main
from tests.support.paths import conformance_root

DATA_FILES = {"inputs.pt", "expected.pt", "sv_frontend_expected.pt"}


def _weight_files() -> list[Path]:
    root = conformance_root()
    return sorted(p for p in root.rglob("*") if p.suffix in (".ckpt", ".pth") and p.parent.suffix == ""
                  and p.name != "bigvgan_generator.pt")


def _model_folders() -> list[Path]:
    return sorted(p.parent for p in conformance_root().rglob("config.json"))


def _expected(path: Path) -> tuple[str, str | None]:
    """(kind, version) that the fixture's own records say the file is."""
    if path.is_dir():
        cfg = json.loads((path / "config.json").read_text())
        return ("hubert", None) if cfg.get("model_type") == "hubert" else ("bigvgan", None)
    if path.suffix == ".ckpt":
        meta = json.loads((path.parent / "expected_meta.json").read_text())
        return "gpt", "v1" if meta["config"]["model"]["phoneme_vocab_size"] == 512 else "v2"
    cfg_file = path.parent / "config_as_json.json"
    if "vocoder" in path.name:
        return "vocoder", None
    cfg = json.loads(cfg_file.read_text())
    return "sovits", cfg["model"].get("version") or cfg.get("version")


CASES = _weight_files() + _model_folders()


@pytest.mark.parametrize("path", CASES or [None], ids=lambda p: p.relative_to(conformance_root()).as_posix() if p else "none")
def test_inspect_names_kind_version_and_counts(path: Path | None) -> None:
    if path is None:
        pytest.skip("no fixtures")
    kind, version = _expected(path)
    d = describe(path)
    assert d["kind"] == kind
    if version is not None:
        assert d["version"] == version
    if path.is_file():
        obj = load_torch_file(path)
        weights = obj["weight"] if "weight" in obj else obj
        assert d["parameters"] == sum(t.numel() for t in weights.values() if t.is_floating_point())
        assert d["dtype"] == ",".join(sorted({str(t.dtype)[6:] for t in weights.values() if t.is_floating_point()}))
    if kind == "gpt":
        meta = json.loads((path.parent / "expected_meta.json").read_text())
        model_cfg = meta["config"]["model"]
        assert {k: d["dims"][k] for k in ("embedding_dim", "head", "n_layer")} == \
               {k: model_cfg[k] for k in ("embedding_dim", "head", "n_layer")}


def test_cli_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if not CASES:
        pytest.skip("no fixtures")
    assert main(["inspect", "--json", str(CASES[0])]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["kind"] == _expected(CASES[0])[0]
    junk = tmp_path / "junk.pth"
    torch.save({"something": torch.zeros(1)}, junk)
    assert main(["inspect", str(junk), str(tmp_path / "absent.ckpt")]) == 1
    text = capsys.readouterr().out
    assert "junk.pth" in text and "absent.ckpt" in text and "error" in text


def test_folder_without_config_is_explained(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="config.json"):
        describe(tmp_path)
