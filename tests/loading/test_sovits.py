"""load_sovits and the SoVITS test-weight writer: official layout, versions, full-size shapes vs the
manifest, and clear errors for files of another kind."""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import as_plain_dict, load_torch_file, read_header
from engine.loading.sovits import load_sovits
from engine.models.sovits import SynthesizerTrn
from engine.models.sovits_modules import unfold_weight_norm, weight_norm_prefixes
from engine.testweights.sovits import sovits_dims, write_hubert_folder, write_sovits
from engine.versions import DIRECT_VERSIONS as VERSIONS
from engine.versions import uses_speaker_embedding
from tests.support.paths import conformance_root

HEADERS = {"v1": b"PK", "v2": b"PK", "v2Pro": b"05", "v2ProPlus": b"06"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sovits")
    return {v: write_sovits(d / f"{v}.pth", v) for v in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_written_files_have_the_official_layout(files, version: str) -> None:
    path = files[version]
    assert read_header(path) == HEADERS[version]
    archive = zipfile.ZipFile(io.BytesIO(b"PK" + path.read_bytes()[2:]))
    pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
    assert b"utils\nHParams" in archive.read(pkl)  # the config pickles as the official utils.HParams
    obj = load_torch_file(path)
    assert set(obj) == {"weight", "config", "info"}
    weight = obj["weight"]
    assert all(v.dtype == torch.float16 for v in weight.values())
    assert not any("enc_q" in k for k in weight)
    assert "dec.ups.0.weight_g" in weight and "dec.ups.0.weight_v" in weight and "dec.ups.0.weight" not in weight
    assert obj["config"]["model"]["version"] == version


@pytest.mark.parametrize("version", VERSIONS)
def test_load_and_decode(files, version: str) -> None:
    loaded = load_sovits(files[version])
    assert loaded.model_version == version
    assert loaded.symbol_version == ("v1" if version == "v1" else "v2")
    assert loaded.needs_sv_embedding == uses_speaker_embedding(version)
    assert loaded.sampling_rate == 32000 and loaded.unexpected_keys == ()
    model = loaded.module
    assert not model.training and next(model.parameters()).dtype == torch.float32
    n_tokens, spec = 9, torch.rand(1, 1025, 120)
    codes = torch.randint(0, 1024, (1, 1, n_tokens))
    phones = torch.randint(1, loaded.dims.n_symbols, (1, 7))
    sv = [torch.randn(1, loaded.dims.sv_dim)] if loaded.needs_sv_embedding else None
    with torch.no_grad():
        audio = model.decode(codes, phones, [spec], noise_scale=0.5, sv_emb=sv, generator=torch.Generator().manual_seed(0))
        fast = model.decode(codes, phones, [spec], speed=1.25, sv_emb=sv, generator=torch.Generator().manual_seed(0))
    assert audio.shape == (1, 1, n_tokens * 1280) and torch.isfinite(audio).all()
    assert fast.shape == (1, 1, (int(2 * n_tokens / 1.25) + 1) * 640)
    if sv is not None:
        with pytest.raises(ValueError, match="SV embedding"):
            model.decode(codes, phones, [spec])


def _manifest(version: str) -> dict | None:
    path = conformance_root() / "manifest" / f"s2_{version}.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.parametrize("version", VERSIONS)
def test_full_size_layout_matches_manifest(version: str) -> None:
    manifest = _manifest(version)
    if manifest is None:
        pytest.skip("no SoVITS manifest")
    dims, hps = sovits_dims(version, full_size=True)
    for key, value in manifest["config"]["model"].items():
        if key in hps["model"] and key != "version":
            assert hps["model"][key] == value, key
    model = SynthesizerTrn(dims)
    sd = unfold_weight_norm(model.state_dict(), weight_norm_prefixes(model))
    assert list(sd) == manifest["keys_in_official_weight_file"]
    for key in sd:
        assert list(sd[key].shape) == manifest["state_dict"][key]["shape"], key
    assert sum(t.numel() for t in sd.values()) == manifest["n_elements_in_official_weight_file"]


def test_hubert_writer_full_size_config_matches_manifest(tmp_path: Path) -> None:
    path = conformance_root() / "manifest" / "hubert_base_architecture.json"
    if not path.exists():
        pytest.skip("no hubert manifest")
    from transformers import HubertConfig

    manifest = json.loads(path.read_text())
    ours = HubertConfig().to_dict()  # what write_hubert_folder(full_size=True) builds
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "conv_dim",
                "conv_kernel", "conv_stride", "conv_bias", "feat_extract_norm", "do_stable_layer_norm",
                "num_conv_pos_embeddings", "num_conv_pos_embedding_groups", "feat_proj_layer_norm", "layer_norm_eps"):
        assert ours[key] == manifest["config"][key], key
    folder = write_hubert_folder(tmp_path / "hubert")
    assert {p.name for p in folder.iterdir()} == {"config.json", "preprocessor_config.json", "pytorch_model.bin"}
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert "encoder.pos_conv_embed.conv.weight_g" in sd and "encoder.pos_conv_embed.conv.weight_v" in sd
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 768  # what ssl_proj needs


# ---- errors ----------------------------------------------------------------------------------


def _rewrite(src: Path, dst: Path, edit, header: bool = True) -> Path:
    """Load a written file, edit it as plain dicts, save it back with the official HParams pickling."""
    from engine.testweights.pickling import save_with_official_hparams, to_hparams

    obj = load_torch_file(src)
    obj["config"] = as_plain_dict(obj["config"])
    edit(obj)
    obj["config"] = to_hparams(obj["config"])
    keep = header and read_header(src) != b"PK"
    save_with_official_hparams(obj, dst, header=read_header(src) if keep else None)
    return dst


def test_missing_essential_weights_fail_clearly(files, tmp_path: Path) -> None:
    def drop_decoder(obj):
        obj["weight"] = {k: v for k, v in obj["weight"].items() if not k.startswith("dec.")}

    with pytest.raises(CheckpointError, match="no dec weights"):
        load_sovits(_rewrite(files["v2"], tmp_path / "nodec.pth", drop_decoder))

    def drop_one(obj):
        obj["weight"].pop("flow.flows.2.post.weight")

    with pytest.raises(CheckpointError, match="lack 1 tensors.*flow.flows.2.post.weight"):
        load_sovits(_rewrite(files["v2"], tmp_path / "one.pth", drop_one))


def test_shape_mismatch_names_the_tensor(files, tmp_path: Path) -> None:
    def bigger(obj):
        obj["config"]["model"]["upsample_initial_channel"] = 128

    with pytest.raises(CheckpointError, match="dec.conv_pre.weight.*shape"):
        load_sovits(_rewrite(files["v2"], tmp_path / "shape.pth", bigger))


def test_unexpected_keys_are_reported(files, tmp_path: Path) -> None:
    def extra(obj):
        obj["weight"]["mystery.weight"] = torch.zeros(3, dtype=torch.float16)
        obj["weight"]["enc_q.pre.weight"] = torch.zeros(3, dtype=torch.float16)  # training-only: not reported

    loaded = load_sovits(_rewrite(files["v2"], tmp_path / "extra.pth", extra))
    assert loaded.unexpected_keys == ("mystery.weight",)


def test_pro_weights_without_the_header(files, tmp_path: Path) -> None:
    plain = _rewrite(files["v2ProPlus"], tmp_path / "plain.pth", lambda obj: None, header=False)
    assert read_header(plain) == b"PK"  # plain zip: the size rule alone would say v1
    loaded = load_sovits(plain)
    assert loaded.model_version == "v2ProPlus" and loaded.notes


def test_files_of_other_kinds(tmp_path: Path) -> None:
    from engine.testweights.t2s import write_t2s

    with pytest.raises(CheckpointError, match="GPT"):
        load_sovits(write_t2s(tmp_path / "gpt.ckpt"))
    (tmp_path / "junk.pth").write_bytes(b"\x00" * 300)
    with pytest.raises(CheckpointError):
        load_sovits(tmp_path / "junk.pth")
    torch.save({"a": torch.zeros(2)}, tmp_path / "dict.pth")
    with pytest.raises(CheckpointError, match="no 'weight'"):
        load_sovits(tmp_path / "dict.pth")


def test_v3_files_are_delegated(monkeypatch) -> None:
    path = conformance_root() / "v3v4" / "fixture_v3_e8_s64.pth"
    if not path.exists():
        pytest.skip("no v3 fixture")
    monkeypatch.setitem(sys.modules, "engine.loading.sovits_v3", None)  # as if the v3/v4 loader were absent
    with pytest.raises(CheckpointError, match="v3/v4 is not supported yet"):
        load_sovits(path)
    monkeypatch.undo()
    pytest.importorskip("engine.loading.sovits_v3")
    loaded = load_sovits(path)
    assert loaded.model_version == "v3" and type(loaded.module).__name__ == "SynthesizerTrnV3"
