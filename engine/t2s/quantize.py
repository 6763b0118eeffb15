"""Optional int8 dynamic quantisation of the T2S linears for CPU decoding (reduced precision, opt-in).

Weights are stored as int8 per output channel; activations are quantised on the fly per batch.
The token agreement with float32 is measured by ``benchmarks/t2s_cpu.py`` and recorded in
``docs/benchmarks.md``; it is not exact, so it is never the default.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from engine.models.t2s import Text2SemanticModel


def quantize_t2s_int8(model: Text2SemanticModel) -> Text2SemanticModel:
    """A copy of ``model`` whose block and head linears run int8 dynamic quantised (CPU only)."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantisation runs on the CPU; move the model there first")
    q = copy.deepcopy(model).float().eval()
    for layer in q.layers:
        attn = layer.self_attn
        packed = nn.Linear(attn.in_proj_weight.shape[1], attn.in_proj_weight.shape[0])
        packed.weight, packed.bias = attn.in_proj_weight, attn.in_proj_bias
        attn.in_proj = packed
    return torch.ao.quantization.quantize_dynamic(q, {nn.Linear}, dtype=torch.qint8)
