"""Random v3/v4 SoVITS, BigVGAN and v4-vocoder files in the official formats (for tests and benchmarks).

* ``write_sovits_v3``: ``process_ckpt.savee`` layout: ``{"weight": fp16 state dict (wns1 with
  weight_g/weight_v, linear_mel included, no enc_q), "config": utils.HParams, "info": ...}`` in a
  plain ``PK`` zip. With ``lora_rank`` it writes a LoRA file instead (``03``/``04`` header,
  ``"lora_rank"``, only the trainable tensors + buffers, PEFT key names) and returns the base
  model it applies to, written beside it.
* ``write_bigvgan_folder``: ``config.json`` + ``bigvgan_generator.pt`` = ``{"generator": state dict}``
  with weight norm, float32 (the layout ``BigVGAN.from_pretrained`` reads).
* ``write_v4_vocoder``: the bare float32 state dict of the v4 Generator after ``remove_weight_norm``.

Tiny dims by default; ``full_size=True`` gives the official dims (hundreds of MB).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path

import torch

from engine.data import load_json
from engine.versions import VOCODER_VERSIONS

S2_CONFIG_KEY = "GPT_SoVITS/configs/s2.json"
BIGVGAN_CONFIG_KEY = "external: NVIDIA BigVGAN configs/bigvgan_v2_24khz_100band_256x.json"
PEFT_PREFIX = "cfm.base_model.model."
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def _perturb_constants(module: torch.nn.Module, generator: torch.Generator, scale: float = 0.1) -> None:
    """Give every constant tensor (zero biases, unit norms, log-scale snakes) some spread, as the fixtures do."""
    with torch.no_grad():
        for p in module.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()) or p.numel() == 1:
                p.add_(scale * torch.randn(p.shape, generator=generator))


def _tiny_or_full_v3_dims(version: str, full_size: bool):
    from engine.models.dit import DiTDims
    from engine.models.sovits_v3 import SoVITSV3Dims

    hps = copy.deepcopy(load_json("model_configs.json")[S2_CONFIG_KEY])
    hps["model"]["version"] = version
    if full_size:
        return hps, SoVITSV3Dims.from_hparams(hps, version)
    hps["model"].update(filter_channels=96, n_layers=2, upsample_initial_channel=64)
    dit = DiTDims(dim=64, depth=1, heads=2, dim_head=64, ff_mult=2, text_dim=512, conv_layers=1)
    return hps, SoVITSV3Dims.from_hparams(hps, version, wns1_hidden=32, wns1_layers=2, dit=dit)


def _official_state_dict(model, dims) -> "OrderedDict[str, torch.Tensor]":
    """Our module's tensors in the official layout: weight norm unfolded, linear_mel before cfm, fp16."""
    from engine.models.sovits_modules import unfold_weight_norm, weight_norm_prefixes

    sd = unfold_weight_norm(model.state_dict(), weight_norm_prefixes(model))
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, value in sd.items():
        if key.startswith("cfm.") and "linear_mel.weight" not in out:
            gen = torch.Generator().manual_seed(7)
            out["linear_mel.weight"] = torch.randn(100, 512, 1, generator=gen) / 512**0.5  # training-only head
            out["linear_mel.bias"] = torch.zeros(100)
        out[key] = value
    return OrderedDict((k, v.detach().half()) for k, v in out.items())


def write_sovits_v3(path: str | Path, version: str, full_size: bool = False, lora_rank: int | None = None,
                    seed: int = 0) -> Path:
    """Write a random v3/v4 SoVITS file; with ``lora_rank``, a LoRA file plus its base ``<stem>_base.pth``.

    Returns the path of the base model for LoRA files, else ``path``.
    """
    from engine.loading.checkpoints import LORA_HEADERS
    from engine.models.sovits_v3 import SynthesizerTrnV3
    from engine.testweights.pickling import save_with_official_hparams, to_hparams

    if version not in VOCODER_VERSIONS:
        raise ValueError(f"write_sovits_v3 writes v3/v4 files, not {version!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    hps, dims = _tiny_or_full_v3_dims(version, full_size)
    model = SynthesizerTrnV3(dims)
    _perturb_constants(model, gen)
    with torch.no_grad():  # a non-degenerate VQ codebook
        model.quantizer.vq.layers[0]._codebook.embed.normal_(generator=gen)
        model.quantizer.vq.layers[0]._codebook.embed_avg.copy_(model.quantizer.vq.layers[0]._codebook.embed)
        model.quantizer.vq.layers[0]._codebook.cluster_size.fill_(1.0)
    sd = _official_state_dict(model, dims)
    if lora_rank is None:
        save_with_official_hparams({"weight": sd, "config": to_hparams(hps), "info": "8epoch_64iteration"}, path)
        return path

    base = path.with_name(path.stem + "_base.pth")
    save_with_official_hparams({"weight": sd, "config": to_hparams(hps), "info": "pretrained"}, base)
    hps_lora = copy.deepcopy(hps)
    hps_lora["train"]["lora_rank"] = str(lora_rank)
    lora: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, value in sd.items():
        if key.startswith(("enc_p.", "ssl_proj.")):
            continue  # frozen during LoRA training: not saved
        if key.startswith("quantizer."):
            lora[key] = value  # buffers are always saved
        elif key.startswith("cfm."):
            inner = key[len("cfm.") :]
            stem = key[: -len(".weight")] if key.endswith(".weight") else None
            if key.endswith("rotary_embed.inv_freq"):
                lora[PEFT_PREFIX + inner] = value
            elif stem is not None and stem.endswith(LORA_TARGETS):
                out_f, in_f = value.shape
                peft = PEFT_PREFIX + inner[: -len(".weight")]
                lora[peft + ".lora_A.default.weight"] = (torch.randn(lora_rank, in_f, generator=gen) / in_f**0.5).half()
                lora[peft + ".lora_B.default.weight"] = (0.05 * torch.randn(out_f, lora_rank, generator=gen)).half()
        else:  # ref_enc, bridge, wns1, linear_mel: trained in full, perturbed so the file matters
            lora[key] = (value.float() + 0.01 * torch.randn(value.shape, generator=gen)).half()
    obj = {"weight": lora, "config": to_hparams(hps_lora), "info": "2epoch_10iteration", "lora_rank": lora_rank}
    save_with_official_hparams(obj, path, header=LORA_HEADERS[version])
    return base


def _bigvgan_config(full_size: bool) -> dict:
    h = copy.deepcopy(load_json("model_configs.json")[BIGVGAN_CONFIG_KEY])
    if not full_size:
        h.update(upsample_initial_channel=64, resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3], [1, 2]])
    return h


def write_bigvgan_folder(folder: str | Path, full_size: bool = False, seed: int = 0, config: dict | None = None) -> Path:
    """Write ``config.json`` + ``bigvgan_generator.pt`` (with weight norm, float32) into ``folder``."""
    from engine.loading.vocoder import BIGVGAN_CONFIG, BIGVGAN_WEIGHTS
    from engine.models.bigvgan import BigVGAN, BigVGANDims

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    h = config if config is not None else _bigvgan_config(full_size)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    model = BigVGAN(BigVGANDims.from_config(h))
    _perturb_constants(model, gen, scale=0.3)
    with torch.no_grad():  # a zero-mean output conv keeps the positive snake DC out of the waveform
        model.conv_post.weight.sub_(model.conv_post.weight.mean())
    wn = ["conv_pre", "conv_post"] + [f"ups.{i}.0" for i in range(len(model.ups))]
    wn += [n for n, m in model.resblocks.named_modules(prefix="resblocks") if isinstance(m, torch.nn.Conv1d)]
    sd = _weight_normed(model.state_dict(), set(wn))
    (folder / BIGVGAN_CONFIG).write_text(json.dumps(h, indent=4), encoding="utf-8")
    torch.save({"generator": sd}, folder / BIGVGAN_WEIGHTS)
    return folder


def _weight_normed(sd: dict[str, torch.Tensor], prefixes: set[str]) -> "OrderedDict[str, torch.Tensor]":
    """``X.weight`` -> ``X.weight_g`` (norm over all dims but 0) + ``X.weight_v``, in the official key order."""
    out = {k: v for k, v in sd.items() if not (k.rpartition(".")[0] in prefixes and k.endswith(".weight"))}
    for base in prefixes:
        w = sd[base + ".weight"]
        out[base + ".weight_g"] = torch.linalg.vector_norm(w, dim=tuple(range(1, w.dim())), keepdim=True)
        out[base + ".weight_v"] = w.clone()
    return OrderedDict((k, out[k]) for k in _official_order(sd, prefixes))


def _official_order(sd: dict[str, torch.Tensor], prefixes: set[str]) -> list[str]:
    keys: list[str] = []
    for key in sd:
        base, _, leaf = key.rpartition(".")
        if base in prefixes and leaf == "weight":
            if base + ".bias" not in sd:
                keys += [base + ".weight_g", base + ".weight_v"]
            continue
        keys.append(key)
        if base in prefixes and leaf == "bias":
            keys += [base + ".weight_g", base + ".weight_v"]
    return keys


def write_v4_vocoder(path: str | Path, full_size: bool = False, seed: int = 0) -> Path:
    """Write the v4 vocoder's bare float32 state dict (plain ``weight`` tensors, no weight norm)."""
    from engine.loading.vocoder import V4VocoderDims, build_v4_vocoder

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    model = build_v4_vocoder(V4VocoderDims() if full_size else V4VocoderDims(upsample_initial_channel=64))
    _perturb_constants(model, gen)
    torch.save(OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items()), path)
    return path
