"""Mandarin frontend: `normalize(text)` then `g2p(norm_text, version)` -> (phones, word2ph).

`TextNormalizer` (also used by the Cantonese frontend) lives in `engine.text.chinese.textnorm`.
"""

from __future__ import annotations

from functools import lru_cache

from .g2p import ChineseG2P
from .punctuation import replace_consecutive_punctuation, replace_punctuation
from .textnorm import TextNormalizer


def normalize(text: str) -> str:
    """The official `text_normalize`: TextNormalizer sentences, punctuation folding, then collapsed mark runs."""
    sentences = TextNormalizer().normalize(text)
    return replace_consecutive_punctuation("".join(replace_punctuation(s) for s in sentences))


@lru_cache(maxsize=2)
def default_g2p(version: str = "v2") -> ChineseG2P:
    """The shared pypinyin-based converter of a model generation (v1: no erhua). Bounded: one per generation."""
    from engine.text.symbols import table_name

    return ChineseG2P(erhua=table_name(version) != "v1")


def g2p(norm_text: str, version: str = "v2", converter: ChineseG2P | None = None) -> tuple[list[str], list[int]]:
    """Normalised Mandarin text -> (phones, word2ph). ``converter`` overrides the default (e.g. one with G2PW)."""
    return (converter or default_g2p("v1" if version == "v1" else "v2"))(norm_text)


__all__ = ["ChineseG2P", "TextNormalizer", "default_g2p", "g2p", "normalize"]
