"""Random GPT (s1) checkpoints in the official ``.ckpt`` layout (``weight``/``config``/``info``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch

from engine.data import load_json
from engine.loading.checkpoints import save_torch_file
from engine.models.t2s import T2SDims, Text2SemanticModel

TINY = {"embedding_dim": 32, "hidden_dim": 32, "head": 2, "n_layer": 2}
TINY_BERT_DIM = 32  # engine.testweights.roberta.TINY_DIMS["hidden_size"]
EOS_ROW_SCALE = 3.0  # like the fixtures: makes EOS reachable within tens of steps on random weights
# config["model"] keys a caller may set (other widths follow: embedding_dim = hidden_dim, EOS = vocab_size - 1,
# and the FFN is 4 x hidden_dim, as in the official architecture)
SHAPE_KEYS = ("hidden_dim", "head", "n_layer", "vocab_size")


def official_config(version: str) -> dict:
    """The training yaml the official files carry (``s1longer.yaml`` for v1, ``s1longer-v2.yaml`` otherwise)."""
    name = "s1longer.yaml" if version == "v1" else "s1longer-v2.yaml"
    return copy.deepcopy(load_json("model_configs.json")[f"GPT_SoVITS/configs/{name}"])


def random_t2s_model(dims: T2SDims, seed: int = 0) -> Text2SemanticModel:
    """A model with random weights scaled so activations stay sane (norms near 1, EOS reachable)."""
    generator = torch.Generator().manual_seed(seed)
    model = Text2SemanticModel(dims)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            elif name.endswith("alpha"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) / max(1, p.shape[-1]) ** 0.5)
        model.ar_predict_layer.weight[-1] *= EOS_ROW_SCALE
    return model.eval()


def apply_shape(model_cfg: dict, shape: Mapping[str, int]) -> None:
    """Set the widths in ``shape`` (keys from :data:`SHAPE_KEYS`) on a config["model"], with the ones that follow."""
    unknown = sorted(set(shape) - set(SHAPE_KEYS))
    if unknown:
        raise ValueError(f"unknown T2S shape keys {unknown}; choose from {', '.join(SHAPE_KEYS)}")
    for key, value in shape.items():
        if int(value) <= 0:
            raise ValueError(f"T2S {key} must be positive, not {value}")
    model_cfg.update({k: int(v) for k, v in shape.items()})
    model_cfg["embedding_dim"] = model_cfg["hidden_dim"]
    model_cfg["EOS"] = model_cfg["vocab_size"] - 1
    if model_cfg["hidden_dim"] % model_cfg["head"]:
        raise ValueError(f"T2S width {model_cfg['hidden_dim']} must be a multiple of the head count {model_cfg['head']}")


def write_t2s(path: str | Path, version: str = "v2", full_size: bool = False, seed: int = 0,
              shape: Mapping[str, int] | None = None) -> Path:
    """Write a random GPT checkpoint; tiny dims unless ``full_size`` (the official 77.6 M model), then the
    widths in ``shape`` (e.g. ``{"hidden_dim": 384, "head": 16}``: head width 24)."""
    config = official_config(version)
    if not full_size:
        config["model"].update(TINY)
    if shape:
        apply_shape(config["model"], shape)
    # tiny sets pair with the tiny random RoBERTa, whose features are narrower than the official 1024
    bert_dim = 1024 if full_size else TINY_BERT_DIM
    model = random_t2s_model(T2SDims.from_config(config["model"], bert_dim=bert_dim), seed)
    weight = {"model." + k: v.half() for k, v in model.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_torch_file({"weight": weight, "config": config, "info": "GPT-e1"}, path)
    return path
