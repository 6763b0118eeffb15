"""v3/v4 SoVITS files: test-weight formats, version resolution, LoRA merging and bad files."""

from __future__ import annotations

import json

import pytest
import torch

from engine.errors import CheckpointError
from tests.support.paths import conformance_root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from engine.testweights.v3v4 import write_sovits_v3

    d = tmp_path_factory.mktemp("v3v4")
    full = write_sovits_v3(d / "s2_v3.pth", "v3")
    base = write_sovits_v3(d / "lora_v4.pth", "v4", lora_rank=4)
    return {"full": full, "lora": d / "lora_v4.pth", "base": base, "dir": d}


def test_written_file_has_the_official_layout(files):
    from engine.loading.checkpoints import load_torch_file

    obj = load_torch_file(files["full"])
    assert open(files["full"], "rb").read(2) == b"PK"
    assert set(obj) == {"weight", "config", "info"}
    sd = obj["weight"]
    assert all(v.dtype == torch.float16 for v in sd.values())
    assert "wns1.enc.in_layers.0.weight_g" in sd and "wns1.enc.in_layers.0.weight" not in sd
    assert "linear_mel.weight" in sd and not any(k.startswith("enc_q") for k in sd)
    assert "cfm.estimator.rotary_embed.inv_freq" in sd
    # every key follows a pattern of the official full-size manifest (layer indices aside)
    manifest = conformance_root() / "manifest" / "s2_v3.json"
    if manifest.is_file():
        official = json.loads(manifest.read_text())["keys_in_official_weight_file"]

        def pattern(k: str) -> str:
            return ".".join("N" if p.isdigit() else p for p in k.split("."))

        assert {pattern(k) for k in sd} == {pattern(k) for k in official}


def test_version_resolution(files, tmp_path):
    from engine.loading.checkpoints import load_torch_file
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.testweights.pickling import save_with_official_hparams

    assert load_sovits_v3(files["full"]).dims.version == "v3"  # from hps.model.version
    assert load_sovits_v3(files["full"], version="v4").dims.version == "v4"  # the caller decides
    obj = load_torch_file(files["full"])
    cfg = obj["config"].to_dict()
    cfg["model"].pop("version")
    save_with_official_hparams({**obj, "config": cfg}, tmp_path / "anon.pth")
    with pytest.raises(CheckpointError, match="pass version='v3' or 'v4'"):
        load_sovits_v3(tmp_path / "anon.pth")
    with pytest.raises(CheckpointError, match="v3/v4 files, not 'v2'"):
        load_sovits_v3(files["full"], version="v2")


def test_issue3_loader_delegates(files):
    sovits = pytest.importorskip("engine.loading.sovits")
    loaded = sovits.load_sovits(files["full"])
    assert loaded.model_version == "v3" and type(loaded.module).__name__ == "SynthesizerTrnV3"


def test_lora_merge_is_w_plus_ba(files):
    from engine.loading.checkpoints import load_torch_file
    from engine.loading.sovits_v3 import load_sovits_v3

    assert open(files["lora"], "rb").read(2) == b"04"
    lora = load_torch_file(files["lora"])
    assert lora["lora_rank"] == 4
    merged = load_sovits_v3(files["lora"], base_path=files["base"])
    base = load_sovits_v3(files["base"], version="v4")
    assert merged.dims.version == "v4"
    sd = lora["weight"]
    prefix = "cfm.base_model.model.estimator.transformer_blocks.0.attn."
    for name in ("to_q", "to_k", "to_v", "to_out.0"):
        a = sd[prefix + name + ".lora_A.default.weight"].float()
        b = sd[prefix + name + ".lora_B.default.weight"].float()
        layer = dict(merged.cfm.estimator.transformer_blocks[0].attn.named_modules())[name]
        base_layer = dict(base.cfm.estimator.transformer_blocks[0].attn.named_modules())[name]
        assert torch.equal(layer.weight, base_layer.weight + b @ a), name
        assert torch.equal(layer.bias, base_layer.bias), name
    # trained non-LoRA tensors replace the base ones; frozen ones (enc_p) stay the base's
    assert torch.equal(merged.bridge[0].weight, sd["bridge.0.weight"].float())
    assert not torch.equal(merged.bridge[0].weight, base.bridge[0].weight)
    assert torch.equal(merged.enc_p.ssl_proj.weight, base.enc_p.ssl_proj.weight)


def test_lora_needs_its_base(files, tmp_path):
    from engine.loading.sovits_v3 import load_sovits_v3

    with pytest.raises(CheckpointError, match="LoRA file: it needs the v4 base model"):
        load_sovits_v3(files["lora"])
    with pytest.raises(CheckpointError, match="is a v4 LoRA file but v3 was requested"):
        load_sovits_v3(files["lora"], version="v3", base_path=files["base"])
    with pytest.raises(CheckpointError, match="not found"):
        load_sovits_v3(files["lora"], base_path=tmp_path / "missing.pth")


def test_truncated_and_foreign_files(files, tmp_path):
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.testweights.v3v4 import write_v4_vocoder

    data = files["full"].read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_sovits_v3(tmp_path / "cut.pth", version="v3")
    write_v4_vocoder(tmp_path / "vocoder.pth")
    with pytest.raises(CheckpointError, match="no 'weight' entry"):
        load_sovits_v3(tmp_path / "vocoder.pth", version="v4")


def test_missing_tensors_are_named(files, tmp_path):
    from engine.loading.checkpoints import load_torch_file
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.testweights.pickling import save_with_official_hparams

    obj = load_torch_file(files["full"])
    weight = {k: v for k, v in obj["weight"].items() if not k.startswith("ref_enc.")}
    save_with_official_hparams({**obj, "weight": weight}, tmp_path / "partial.pth")
    with pytest.raises(CheckpointError, match="missing .* tensors \\(e.g. ref_enc"):
        load_sovits_v3(tmp_path / "partial.pth", version="v3")


def test_tiny_model_runs_end_to_end(files, tmp_path):
    """Test weights go through the whole v3 path: prompt, sequential and batched synthesis."""
    from engine.acoustic.cfm import prepare_prompt, synthesize_batched, synthesize_sequential
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.loading.vocoder import load_bigvgan
    from engine.testweights.v3v4 import write_bigvgan_folder

    m = load_sovits_v3(files["full"])
    voc = load_bigvgan(write_bigvgan_folder(tmp_path / "bv"))
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(1, 32000, generator=gen) * 0.1
    spec = torch.rand(1, 1025, 50, generator=gen)
    prompt = prepare_prompt(m, torch.randint(0, 1024, (20,), generator=gen), torch.randint(0, 732, (12,), generator=gen),
                            spec, ref, 32000)
    tokens, phones = torch.randint(0, 1024, (10,), generator=gen), torch.randint(0, 732, (8,), generator=gen)
    audio, mel = synthesize_sequential(m, voc, prompt, tokens, phones, sample_steps=2)
    assert audio.shape[-1] == mel.shape[-1] * 256 and torch.isfinite(audio).all()
    pieces, _ = synthesize_batched(m, voc, prompt, [(tokens, phones), (tokens[:5], phones)], sample_steps=2)
    assert [p.shape[-1] for p in pieces] == [int(20 * 1.875) * 256, int(10 * 1.875) * 256]  # floor(2N * 1.875) frames
