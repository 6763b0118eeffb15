"""Speaker-verification front end and ERes2NetV2 (v2Pro / v2ProPlus).

The SV front end is checked against every folder holding ``sv_frontend_expected.pt`` (sovits_v2Pro).
The network has no output fixture (53.5 M parameters, hard-coded sizes): its full-size key/shape
layout is checked against the official manifest, and its forward must run on the fixture's fbank.
Tolerances: resampling 1e-6 (float32 windowed-sinc of a [-1, 1] signal, ~10x the rounding of its
~25-tap sums); log-mel fbank 1e-4 (log of float32 power sums of 512-point FFTs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.audio import kaldi_fbank, read_audio, resample_sinc
from engine.errors import CheckpointError
from engine.loading.sv import load_sv_model
from engine.models.sv import ERes2NetV2, ERes2NetV2Dims
from engine.testweights.sovits import write_sovits, write_sv_checkpoint
from tests.support.paths import conformance_root, fixture_folders

RESAMPLE_ATOL = 1e-6
FBANK_ATOL = 1e-4


def _frontend_folders() -> list:
    found = fixture_folders("", "sv_frontend_expected.pt")
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no SV front-end fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in found]


@pytest.mark.parametrize("folder", _frontend_folders())
def test_sv_frontend_matches_official(folder: Path) -> None:
    want = torch.load(folder / "sv_frontend_expected.pt", weights_only=True)
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    wav16k = resample_sinc(inputs["ref0_wav"], 32000, 16000)
    assert wav16k.shape == want["ref0_resampled_16k"].shape
    assert torch.allclose(wav16k, want["ref0_resampled_16k"], rtol=0, atol=RESAMPLE_ATOL)
    fbank = torch.stack([kaldi_fbank(row) for row in wav16k])
    assert fbank.shape == want["kaldi_fbank_80"].shape
    assert torch.allclose(fbank, want["kaldi_fbank_80"], rtol=0, atol=FBANK_ATOL)
    if (folder / "ref0_32k.wav").exists():  # from the file, as TTS.py reads it
        decoded = torch.from_numpy(read_audio(folder / "ref0_32k.wav").samples)
        assert torch.allclose(resample_sinc(decoded, 32000, 16000), want["ref0_resampled_16k"], rtol=0, atol=RESAMPLE_ATOL)


def _manifest() -> dict | None:
    path = conformance_root() / "manifest" / "sv_eres2netv2w24s4ep4.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="module")
def full_sv() -> ERes2NetV2:
    return ERes2NetV2(ERes2NetV2Dims()).eval()


def test_full_size_layout_matches_manifest(full_sv: ERes2NetV2) -> None:
    manifest = _manifest()
    if manifest is None:
        pytest.skip("no SV manifest")
    sd = full_sv.state_dict()
    assert list(sd) == manifest["keys_in_official_weight_file"]
    for key, spec in manifest["state_dict"].items():
        assert list(sd[key].shape) == spec["shape"], key
    assert sum(p.numel() for p in full_sv.parameters()) == manifest["n_parameters"]
    assert ERes2NetV2Dims.from_state_dict(sd) == ERes2NetV2Dims()
    assert ERes2NetV2Dims().embedding_dim == 20480


@pytest.mark.parametrize("folder", _frontend_folders())
def test_full_size_forward_on_fixture_fbank(folder: Path, full_sv: ERes2NetV2) -> None:
    fbank = torch.load(folder / "sv_frontend_expected.pt", weights_only=True)["kaldi_fbank_80"][:, :120]
    with torch.no_grad():
        emb = full_sv.embed_frames(fbank)
    assert emb.shape == (1, 20480) and torch.isfinite(emb).all()


def test_block_activation_is_clamped_at_20() -> None:
    """The official blocks use Hardtanh(0, 20) as "ReLU": huge inputs saturate instead of growing."""
    model = ERes2NetV2(ERes2NetV2Dims(m_channels=8, expansion=2, scale=2, num_blocks=(1, 1, 1, 1))).eval()
    block = model.layer1[0]
    with torch.no_grad():
        out = block(torch.full((1, 8, 4, 4), 1e4))
    assert out.max() <= 20.0


def test_loader_reads_files_and_rejects_others(tmp_path: Path) -> None:
    sv = load_sv_model(write_sv_checkpoint(tmp_path / "sv.ckpt"))
    feats = torch.randn(2, 50, 80)
    with torch.no_grad():
        assert sv.embed_frames(feats).shape == (2, sv.dims.embedding_dim)
    with pytest.raises(CheckpointError, match="speaker-verification"):
        load_sv_model(write_sovits(tmp_path / "s.pth", "v2"))
    partial = torch.load(tmp_path / "sv.ckpt", weights_only=True)
    partial.pop("fuse34.local_att.0.weight")
    torch.save(partial, tmp_path / "partial.ckpt")
    with pytest.raises(CheckpointError, match="missing"):
        load_sv_model(tmp_path / "partial.ckpt")
