"""What is this weight file or folder? Kind, version, dimensions, size and dtype, without building it.

Reads every file through the safe loader; builds no module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import as_plain_dict, detect_sovits_version, load_torch_file, read_header, state_dict_of

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _tensor_stats(weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in weights.values() if t.is_floating_point()})
    return {"parameters": sum(t.numel() for t in weights.values() if t.is_floating_point()),
            "tensors": len(weights), "dtype": ",".join(dtypes)}


def _hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in HF_WEIGHT_FILES:
        f = folder / name
        if not f.exists():
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(f))
        return state_dict_of(load_torch_file(f, "model weights"), f, key=None)
    raise CheckpointError(f"{folder} has a config.json but no {' or '.join(HF_WEIGHT_FILES)}")


def _describe_folder(folder: Path) -> dict[str, Any]:
    cfg_file = folder / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(
            f"{folder} is a folder without config.json; expected a HuBERT, RoBERTa or BigVGAN model folder"
        )
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {e}") from e
    if (folder / "bigvgan_generator.pt").exists() or cfg.get("activation") in ("snake", "snakebeta"):
        gen_file = folder / "bigvgan_generator.pt"
        obj = load_torch_file(gen_file, "BigVGAN generator")
        weights = state_dict_of(obj, gen_file, "generator")
        dims = {k: cfg.get(k) for k in ("num_mels", "sampling_rate", "hop_size", "upsample_rates",
                                        "upsample_initial_channel", "activation", "use_tanh_at_final",
                                        "use_bias_at_final")}
        return {"kind": "bigvgan", "version": "v3 vocoder", "dims": dims,
                "weight_norm": any(k.endswith("weight_g") for k in weights), **_tensor_stats(weights)}
    model_type = cfg.get("model_type", "")
    weights = _hf_weights(folder)
    if model_type == "hubert":
        dims = {k: cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                        "intermediate_size", "conv_dim")}
        return {"kind": "hubert", "version": "cnhubert (ssl)", "dims": dims, **_tensor_stats(weights)}
    if model_type in ("bert", "roberta"):
        dims = {k: cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
        return {"kind": "bert", "version": "chinese-roberta-wwm-ext-large (text)", "dims": dims,
                **_tensor_stats(weights)}
    raise CheckpointError(f"{folder}: model_type {model_type!r} is not a GPT-SoVITS component (hubert or bert)")


def _sovits_dims(config: Mapping[str, Any], weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    model = config.get("model", {})
    dims = {k: model.get(k) for k in ("hidden_channels", "inter_channels", "filter_channels", "gin_channels",
                                      "upsample_initial_channel", "upsample_rates", "upsample_kernel_sizes")}
    emb = weights.get("enc_p.text_embedding.weight")
    dims["text_symbols"] = int(emb.shape[0]) if emb is not None else None
    dims["sampling_rate"] = config.get("data", {}).get("sampling_rate")
    return dims


def _describe_file(path: Path) -> dict[str, Any]:
    obj = load_torch_file(path)
    if isinstance(obj, Mapping) and "weight" in obj and "config" in obj:
        weights = state_dict_of(obj, path, "weight")
        if any(k.startswith("model.") for k in weights):
            from engine.loading.t2s import describe_t2s, read_t2s_checkpoint

            return describe_t2s(read_t2s_checkpoint(path))
        config = as_plain_dict(obj["config"])
        symbol, model, is_lora = detect_sovits_version(path, weights, config)
        out = {"kind": "sovits-lora" if is_lora else "sovits", "version": model, "symbols": symbol,
               "header": read_header(path).decode("latin-1"), "dims": _sovits_dims(config, weights),
               "info": str(obj.get("info", "")), **_tensor_stats(weights)}
        if is_lora:
            out["lora_rank"] = int(obj.get("lora_rank", 0))
        return out
    if isinstance(obj, Mapping) and "generator" in obj:
        weights = state_dict_of(obj, path, "generator")
        return {"kind": "bigvgan", "version": "v3 vocoder (generator file; config.json is beside it)",
                "weight_norm": any(k.endswith("weight_g") for k in weights), **_tensor_stats(weights)}
    weights = state_dict_of(obj, path, key=None)
    if "conv_pre.weight" in weights or "conv_pre.weight_v" in weights:
        ups = sorted({k.split(".")[1] for k in weights if k.startswith("ups.")}, key=int)
        conv_pre = weights.get("conv_pre.weight", weights.get("conv_pre.weight_v"))
        return {"kind": "vocoder", "version": "v4 vocoder (48 kHz)",
                "dims": {"mel_bins": int(conv_pre.shape[1]), "initial_channel": int(conv_pre.shape[0]),
                         "upsample_layers": len(ups)},
                "weight_norm": any(k.endswith("weight_g") for k in weights), **_tensor_stats(weights)}
    if "conv1.weight" in weights and any(k.startswith("layer4.") for k in weights):
        return {"kind": "sv", "version": "ERes2NetV2 speaker verification (v2Pro/v2ProPlus)",
                **_tensor_stats(weights)}
    raise CheckpointError(f"{path} holds tensors but matches no GPT-SoVITS file kind")


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """Describe a GPT-SoVITS weight file or model folder; CheckpointError if it is none of them."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"not found: {path}")
    out = _describe_folder(path) if path.is_dir() else _describe_file(path)
    return {"path": str(path), **out}


def format_description(d: Mapping[str, Any]) -> str:
    lines = [f"{d['path']}", f"  kind:       {d['kind']}", f"  version:    {d['version']}"]
    for key in ("symbols", "header", "lora_rank", "max_sec", "info", "weight_norm"):
        if key in d:
            lines.append(f"  {key + ':':<11} {d[key]}")
    lines.append(f"  parameters: {d['parameters']:,}")
    lines.append(f"  dtype:      {d['dtype']}")
    for k, v in (d.get("dims") or {}).items():
        lines.append(f"  {k}: {v}")
    return "\n".join(lines)
