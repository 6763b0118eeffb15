"""Safe loading: bad files get one clear error naming the file, and nothing inside them runs."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import (
    HParams,
    detect_sovits_version,
    load_torch_file,
    save_torch_file,
    sovits_version_from_file,
)
from engine.loading.t2s import load_t2s, read_t2s_checkpoint
from engine.testweights.pickling import save_with_official_hparams, to_hparams
from engine.testweights.t2s import write_t2s
from tests.support.paths import conformance_root


class _WritesAFile:
    """A pickle payload that would create a file when unpickled by an unsafe loader."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _malicious_checkpoint(path: Path, target: Path) -> None:
    torch.save({"weight": {"model.x": torch.zeros(1)}, "config": _WritesAFile(str(target))}, path)


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "pwned.txt"
    bad = tmp_path / "evil.ckpt"
    _malicious_checkpoint(bad, target)
    assert not target.exists()
    with pytest.raises(CheckpointError, match=r"evil\.ckpt.*allow-list"):
        load_torch_file(bad)
    with pytest.raises(CheckpointError, match="evil"):
        read_t2s_checkpoint(bad)
    assert not target.exists()


def test_malicious_pickle_behind_a_version_header_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "pwned.txt"
    bad = tmp_path / "evil.pth"
    _malicious_checkpoint(bad, target)
    data = bad.read_bytes()
    bad.write_bytes(b"05" + data[2:])
    with pytest.raises(CheckpointError, match="allow-list"):
        load_torch_file(bad)
    assert not target.exists()


def test_os_system_reduce_is_refused(tmp_path: Path) -> None:
    class Shell:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    bad = tmp_path / "shell.pth"
    torch.save({"weight": {}, "config": Shell()}, bad)
    with pytest.raises(CheckpointError):
        load_torch_file(bad)
    assert not (tmp_path / "ran").exists()


def test_missing_empty_truncated_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_torch_file(tmp_path / "absent.ckpt")
    with pytest.raises(CheckpointError, match="folder"):
        load_torch_file(tmp_path)
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_torch_file(empty)
    good = write_t2s(tmp_path / "good.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_torch_file(truncated)
    text = tmp_path / "notes.ckpt"
    text.write_text("hello, not a checkpoint")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        load_torch_file(text)
    corrupt = tmp_path / "corrupt.ckpt"
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\x00" * 64
    corrupt.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_torch_file(corrupt)


def test_wrong_kind_is_named(tmp_path: Path) -> None:
    sovits_like = tmp_path / "s2.pth"
    save_torch_file({"weight": {"enc_p.proj.weight": torch.zeros(2)}, "config": {"model": {}}, "info": ""}, sovits_like)
    with pytest.raises(CheckpointError, match="SoVITS"):
        read_t2s_checkpoint(sovits_like)
    plain = tmp_path / "vocoder.pth"
    torch.save({"conv_pre.weight": torch.zeros(1)}, plain)
    with pytest.raises(CheckpointError, match="'weight' and 'config'"):
        read_t2s_checkpoint(plain)


def test_gpt_dims_mismatch_is_reported(tmp_path: Path) -> None:
    path = write_t2s(tmp_path / "g.ckpt")
    obj = load_torch_file(path)
    obj["config"]["model"]["hidden_dim"] = obj["config"]["model"]["embedding_dim"] = 64
    save_torch_file(obj, path)
    with pytest.raises(CheckpointError, match="shape|match"):
        load_t2s(path)


def test_official_hparams_round_trip_and_headers(tmp_path: Path) -> None:
    cfg = to_hparams({"data": {"sampling_rate": 32000}, "model": {"version": "v2Pro"}})
    path = tmp_path / "pro.pth"
    save_with_official_hparams({"weight": {"enc_p.text_embedding.weight": torch.zeros(732, 4).half()},
                                "config": cfg, "info": "1epoch"}, path, header=b"05")
    assert path.read_bytes()[:2] == b"05"
    obj = load_torch_file(path)
    assert isinstance(obj["config"], HParams) and obj["config"].model.version == "v2Pro"
    assert sovits_version_from_file(path) == ("v2", "v2Pro", False)
    # the pickle names the official class, so an unrestricted unpickler would look for `utils`
    data = zipfile.ZipFile(io.BytesIO(b"PK" + path.read_bytes()[2:]))
    pkl = next(n for n in data.namelist() if n.endswith("data.pkl"))
    assert b"utils\nHParams" in data.read(pkl)


def test_sovits_version_rules(tmp_path: Path) -> None:
    small = tmp_path / "small.pth"
    save_torch_file({"weight": {}, "config": {}}, small)
    assert sovits_version_from_file(small) == ("v1", "v1", False)
    v1_weights = {"enc_p.text_embedding.weight": torch.zeros(322, 2)}
    v2_weights = {"enc_p.text_embedding.weight": torch.zeros(732, 2)}
    assert detect_sovits_version(small, v1_weights)[1] == "v1"
    assert detect_sovits_version(small, v2_weights)[1] == "v2"
    cfm = dict(v2_weights, **{"cfm.estimator.proj_out.weight": torch.zeros(1)})
    assert detect_sovits_version(small, cfm, {"model": {"version": "v4"}})[1] == "v4"
    assert detect_sovits_version(small, cfm, {})[1] == "v3"
    for header, want in ((b"03", ("v2", "v3", True)), (b"04", ("v2", "v4", True)), (b"06", ("v2", "v2ProPlus", False))):
        tagged = tmp_path / f"{header.decode()}.pth"
        tagged.write_bytes(header + small.read_bytes()[2:])
        assert sovits_version_from_file(tagged) == want
    odd = tmp_path / "odd.pth"
    odd.write_bytes(b"ZZ" + small.read_bytes()[2:])
    with pytest.raises(CheckpointError, match="unknown bytes"):
        sovits_version_from_file(odd)


def test_fixture_files_load_safely() -> None:
    root = conformance_root()
    files = [p for p in root.rglob("*") if p.suffix in (".ckpt", ".pth", ".pt") and p.name not in
             ("inputs.pt", "expected.pt", "sv_frontend_expected.pt")]
    if not files:
        pytest.skip(f"no fixtures under {root}")
    for f in files:
        assert load_torch_file(f) is not None, f


def test_legacy_format_loads_and_plain_pickles_are_not_checkpoints(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    assert torch.equal(load_torch_file(legacy)["w"], torch.ones(2))
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(CheckpointError, match="raw.pkl.*not a checkpoint"):
        load_torch_file(raw)
