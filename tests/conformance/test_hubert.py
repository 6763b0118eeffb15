"""HuBERT SSL features against the official fixtures: every folder under the conformance root whose
``expected_meta.json`` records ``tts_prompt_path_features`` and that holds a HF Hubert folder.

Tolerance: both sides run transformers' HubertModel in float32 on the same inputs, so the only
difference can come from reduction order across builds; 1e-5 relative + 1e-5 absolute on features of
magnitude ~1-5 is ~10x float32 rounding of a few hundred-term sums, and far below any real bug.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from engine.acoustic.hubert import load_hubert, prompt_pad_samples, prompt_ssl_features, ssl_features
from engine.errors import CheckpointError
from tests.support.paths import conformance_root, fixture_folders

RTOL = ATOL = 1e-5


def _hubert_folders() -> list:
    found = []
    for folder in fixture_folders("", "expected_meta.json"):
        meta = json.loads((folder / "expected_meta.json").read_text())
        if "tts_prompt_path_features" in meta.get("shapes", {}) and _model_dir(folder) is not None:
            found.append(folder)
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no HuBERT fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in found]


def _model_dir(folder: Path) -> Path | None:
    return next((c.parent for c in sorted(folder.glob("*/config.json"))), None)


FOLDERS = _hubert_folders()


@lru_cache(maxsize=2)
def _load(folder: Path):
    model = load_hubert(_model_dir(folder))
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    expected = torch.load(folder / "expected.pt", weights_only=True)
    return model, inputs, expected


@pytest.mark.parametrize("folder", FOLDERS)
def test_prompt_path_features(folder: Path) -> None:
    model, inputs, expected = _load(folder)
    assert prompt_pad_samples(32000) == inputs["zero_pad_9600"].numel() == 9600
    got = prompt_ssl_features(model, inputs["wav16k"], sovits_sample_rate=32000)
    want = expected["tts_prompt_path_features"]
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=RTOL, atol=ATOL), (got - want).abs().max()


@pytest.mark.parametrize("folder", FOLDERS)
def test_raw_waveform_without_padding(folder: Path) -> None:
    model, inputs, expected = _load(folder)
    got = ssl_features(model, inputs["wav16k"])
    want = expected["model_direct_no_pad"]
    n = inputs["wav16k"].numel()
    assert got.shape[-1] == (n - 400) // 320 + 1 == want.shape[-1]
    assert torch.allclose(got, want, rtol=RTOL, atol=ATOL), (got - want).abs().max()


def test_missing_or_incomplete_folders_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_hubert(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json"):
        load_hubert(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "hubert"}))
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        load_hubert(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_hubert(tmp_path)
