"""The T2S (GPT, "s1") model: phones + BERT features + prompt tokens -> semantic-token logits.

A decoder-only transformer with a bidirectional prefix (phones) and a causal semantic stream
(official ``GPT_SoVITS/AR/models/t2s_model.py``, ``Text2SemanticDecoder``). Module and parameter names
follow the official state dict (minus its ``model.``
prefix), so official ``.ckpt`` weights load strictly. Only nn.Modules here: decoding lives in
``engine.t2s.decoding``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BERT_DIM = 1024  # chinese-roberta-wwm-ext-large hidden size
PE_POSITIONS = 4000  # positions precomputed by the official SinePositionalEmbedding


@dataclass(frozen=True)
class T2SDims:
    """Architecture numbers, read from a checkpoint's ``config["model"]``."""

    embedding_dim: int = 512
    hidden_dim: int = 512
    n_head: int = 16
    n_layer: int = 24
    vocab_size: int = 1025  # 1024 semantic ids + EOS
    phoneme_vocab_size: int = 732  # 512 for v1
    eos: int = 1024
    bert_dim: int = BERT_DIM  # width of the BERT features (read off bert_proj; 1024 in official files)

    @property
    def ffn_dim(self) -> int:
        return 4 * self.hidden_dim  # the official code ignores config "linear_units"

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.n_head

    @classmethod
    def from_config(cls, model_cfg: Mapping[str, Any], bert_dim: int = BERT_DIM) -> T2SDims:
        try:
            dims = cls(
                embedding_dim=int(model_cfg["embedding_dim"]),
                hidden_dim=int(model_cfg["hidden_dim"]),
                n_head=int(model_cfg["head"]),
                n_layer=int(model_cfg["n_layer"]),
                vocab_size=int(model_cfg["vocab_size"]),
                phoneme_vocab_size=int(model_cfg["phoneme_vocab_size"]),
                eos=int(model_cfg["EOS"]),
                bert_dim=int(bert_dim),
            )
        except KeyError as e:
            raise ValueError(f"T2S config lacks model.{e.args[0]}") from e
        if dims.eos != dims.vocab_size - 1:
            raise ValueError(f"T2S config: EOS {dims.eos} must be vocab_size - 1 = {dims.vocab_size - 1}")
        if dims.embedding_dim != dims.hidden_dim or dims.hidden_dim % dims.n_head:
            raise ValueError("T2S config: embedding_dim must equal hidden_dim and be divisible by head")
        return dims

    def to_config(self) -> dict[str, int]:
        return {
            "embedding_dim": self.embedding_dim, "hidden_dim": self.hidden_dim, "head": self.n_head,
            "n_layer": self.n_layer, "vocab_size": self.vocab_size,
            "phoneme_vocab_size": self.phoneme_vocab_size, "EOS": self.eos,
        }


def sine_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal encodings ``[len(positions), dim]`` in float32, computed like the official table."""
    position = positions.to(torch.float32).unsqueeze(1)  # (P, 1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(positions.numel(), dim)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


class TokenEmbedding(nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids)


class ScaledPosition(nn.Module):
    """``x + alpha * PE[offset + t]`` with a learned scalar ``alpha`` (x_scale is 1)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.alpha = nn.Parameter(torch.ones(1))
        self.register_buffer("pe", sine_table(torch.arange(PE_POSITIONS), dim), persistent=False)

    def encodings(self, start: int, length: int) -> torch.Tensor:
        """PE rows ``[start, start+length)`` as ``[length, dim]`` in the table's dtype."""
        if start + length <= self.pe.shape[0]:
            return self.pe[start : start + length]
        rows = sine_table(torch.arange(start, start + length), self.dim)
        return rows.to(self.pe.device, self.pe.dtype)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        # x: (B, T, D)
        return x + self.alpha * self.encodings(offset, x.shape[1]).to(x.dtype)


class SelfAttention(nn.Module):
    """Packed-QKV multi-head attention (the official ``nn.MultiheadAttention`` tensors)."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        self.in_proj: nn.Module | None = None  # set by engine.t2s.quantize to a (quantised) Linear copy

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, 3D) packed q|k|v."""
        if self.in_proj is not None:
            return self.in_proj(x)
        return F.linear(x, self.in_proj_weight, self.in_proj_bias)


class T2SLayer(nn.Module):
    """Post-norm transformer block: ``x = LN1(x + attn(x)); x = LN2(x + FFN(x))``."""

    def __init__(self, dims: T2SDims) -> None:
        super().__init__()
        d = dims.hidden_dim
        self.self_attn = SelfAttention(d, dims.n_head)
        self.linear1 = nn.Linear(d, dims.ffn_dim)
        self.linear2 = nn.Linear(dims.ffn_dim, d)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # (B, T, D) -> 3 x (B, T, D), q first, heads are contiguous head_dim slices
        return self.self_attn.project(x).chunk(3, dim=-1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # x, attn: (B, T, D) with attn already merged over heads
        x = self.norm1(x + self.self_attn.out_proj(attn))
        return self.norm2(x + self.linear2(F.relu(self.linear1(x))))


class LayerStack(nn.Module):
    """Holds the blocks under ``h.layers`` as in the official state dict."""

    def __init__(self, dims: T2SDims) -> None:
        super().__init__()
        self.layers = nn.ModuleList(T2SLayer(dims) for _ in range(dims.n_layer))


class Text2SemanticModel(nn.Module):
    """Embeddings, the block stack and the token head. Attention is run by the decoder object."""

    def __init__(self, dims: T2SDims) -> None:
        super().__init__()
        self.dims = dims
        d = dims.embedding_dim
        self.bert_proj = nn.Linear(dims.bert_dim, d)
        self.ar_text_embedding = TokenEmbedding(d, dims.phoneme_vocab_size)
        self.ar_text_position = ScaledPosition(d)
        self.ar_audio_embedding = TokenEmbedding(d, dims.vocab_size)
        self.ar_audio_position = ScaledPosition(d)
        self.h = LayerStack(dims)
        self.ar_predict_layer = nn.Linear(dims.hidden_dim, dims.vocab_size, bias=False)

    @property
    def layers(self) -> nn.ModuleList:
        return self.h.layers

    def embed_text(self, phones: torch.Tensor, bert: torch.Tensor) -> torch.Tensor:
        """phones (B, T) ids, bert (B, bert_dim, T) -> (B, T, D) with positions 0..T-1."""
        x = self.ar_text_embedding(phones) + self.bert_proj(bert.transpose(1, 2))
        return self.ar_text_position(x)

    def embed_audio(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """tokens (B, T) -> (B, T, D) with positions offset..offset+T-1."""
        return self.ar_audio_position(self.ar_audio_embedding(tokens), offset)

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """(B, D) hidden state of the last position -> (B, vocab) logits."""
        return self.ar_predict_layer(h_last)
