"""Random SoVITS v1/v2/v2Pro/v2ProPlus, HuBERT and speaker-verification files in the official formats.

* ``write_sovits``: the ``process_ckpt.savee`` layout: ``{"weight": fp16 state dict without enc_q,
  with weight-normed convs as weight_g/weight_v, "config": utils.HParams, "info": str}``, with the
  ``05``/``06`` header for v2Pro/v2ProPlus. Tiny files keep the sizes the official code hard-codes
  (hidden 192, MRTE, 768-d SSL, the 1024-code VQ) and shrink only what hps controls.
* ``write_hubert_folder``: a HuggingFace Hubert folder like chinese-hubert-base (float32
  ``pytorch_model.bin`` with the legacy ``weight_g``/``weight_v`` positional-conv names).
  Tiny folders keep hidden size 768, which SoVITS' ``ssl_proj`` requires.
* ``write_sv_checkpoint``: the plain ERes2NetV2 state dict. Tiny files shrink the hard-coded
  sizes, so only our loader (which reads sizes from the tensors) accepts them; they pair with tiny
  v2Pro files, whose ``sv_emb`` input then has the tiny embedding length.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from engine.data import load_json
from engine.loading.checkpoints import VERSION_HEADERS
from engine.models.sovits import SoVITSDims, SynthesizerTrn
from engine.models.sovits_modules import unfold_weight_norm, weight_norm_prefixes
from engine.models.sv import ERes2NetV2, ERes2NetV2Dims
from engine.versions import DIRECT_VERSIONS, uses_speaker_embedding

# hps.model sizes of the tiny files (like the conformance fixtures; hidden_channels stays 192: MRTE hard-codes it)
TINY_MODEL = {"inter_channels": 96, "filter_channels": 96, "n_layers": 2, "upsample_initial_channel": 64}
TINY_PRO_GIN = 64  # v1/v2 need gin 512 (MRTE adds ge to its 512 channels); v2Pro* map ge through ge_to512
TINY_SV = ERes2NetV2Dims(base_width=24, scale=2, expansion=2, m_channels=8, num_blocks=(1, 1, 1, 1))
TINY_HUBERT = {"num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 256,
               "conv_dim": [32] * 7, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
PERTURB = 0.1  # constants (norm gains, zero biases) get + PERTURB * N(0, 1), so every tensor matters


def official_hps(version: str) -> dict:
    """The training config an official file of this version carries (``s2*.json`` + WebUI additions)."""
    name = {"v2Pro": "s2v2Pro.json", "v2ProPlus": "s2v2ProPlus.json"}.get(version, "s2.json")
    hps = copy.deepcopy(load_json("model_configs.json")[f"GPT_SoVITS/configs/{name}"])
    hps["model"]["version"] = version
    hps["version"] = version
    hps["name"] = "testweights"
    hps["pretrain"] = None
    hps["resume_step"] = None
    return hps


def sovits_dims(version: str, full_size: bool = False) -> tuple[SoVITSDims, dict]:
    """(dims, hps) of a test file; full size are the official configs (checked against the manifest)."""
    if version not in DIRECT_VERSIONS:
        raise ValueError(f"write_sovits covers {DIRECT_VERSIONS}, not {version!r} (v3/v4 live in their own module)")
    hps = official_hps(version)
    if not full_size:
        hps["model"].update(TINY_MODEL)
        if uses_speaker_embedding(version):
            hps["model"]["gin_channels"] = TINY_PRO_GIN
    n_symbols = len(load_json("symbols_v1.json" if version == "v1" else "symbols_v2.json"))
    sv_dim = ERes2NetV2Dims().embedding_dim if full_size else TINY_SV.embedding_dim
    return SoVITSDims.from_hparams(hps, version, n_symbols, sv_dim), hps


def _randomise(model: torch.nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().flatten()
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(PERTURB * torch.randn(p.shape, generator=generator))
            elif name.endswith("weight") and p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=generator) / max(1, p[0].numel()) ** 0.5)


def write_sovits(path: str | Path, version: str = "v2", full_size: bool = False, seed: int = 0) -> Path:
    """Write a random SoVITS ``.pth`` of ``version`` in the official layout; returns the path."""
    from engine.testweights.pickling import save_with_official_hparams, to_hparams

    dims, hps = sovits_dims(version, full_size)
    generator = torch.Generator().manual_seed(seed)
    model = SynthesizerTrn(dims)
    _randomise(model, generator)
    with torch.no_grad():
        cb = model.quantizer.vq.layers[0]._codebook
        cb.embed.copy_(torch.randn(cb.embed.shape, generator=generator))
        cb.embed_avg.copy_(cb.embed)
        cb.cluster_size.copy_(10 * torch.rand(cb.cluster_size.shape, generator=generator))
        cb.inited.fill_(1.0)
    sd = unfold_weight_norm(model.state_dict(), weight_norm_prefixes(model))
    weight = {k: v.half() for k, v in sd.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"weight": weight, "config": to_hparams(hps), "info": "1epoch_1iteration"}
    save_with_official_hparams(obj, path, header=VERSION_HEADERS.get(version))
    return path


def write_sv_checkpoint(path: str | Path, full_size: bool = False, seed: int = 0) -> Path:
    """Write a random ERes2NetV2 state dict (float32, like ``pretrained_eres2netv2w24s4ep4.ckpt``)."""
    dims = ERes2NetV2Dims() if full_size else TINY_SV
    generator = torch.Generator().manual_seed(seed)
    model = ERes2NetV2(dims)
    _randomise(model, generator)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=generator))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=generator))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def write_hubert_folder(folder: str | Path, full_size: bool = False, seed: int = 0) -> Path:
    """Write a random chinese-hubert-base-like folder (config.json, preprocessor_config.json, weights)."""
    from transformers import HubertConfig, HubertModel

    kwargs = {} if full_size else TINY_HUBERT
    config = HubertConfig(**kwargs)  # the hubert-base architecture (hidden 768, group-norm conv stack)
    config.architectures = ["HubertModel"]
    torch.manual_seed(seed)  # transformers' own init draws from the global generator
    model = HubertModel(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.detach().flatten()
            if flat.numel() and bool((flat == flat[0]).all()):
                p.add_(PERTURB * torch.randn(p.shape, generator=generator))
    sd = {}
    for key, value in model.state_dict().items():  # legacy weight-norm names, as the original checkpoint
        key = key.replace("pos_conv_embed.conv.parametrizations.weight.original0", "pos_conv_embed.conv.weight_g")
        key = key.replace("pos_conv_embed.conv.parametrizations.weight.original1", "pos_conv_embed.conv.weight_v")
        sd[key] = value.detach().clone().float()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1,
        "padding_side": "right", "padding_value": 0, "return_attention_mask": False, "sampling_rate": 16000,
    }, indent=2) + "\n")
    torch.save(sd, folder / "pytorch_model.bin")
    return folder
