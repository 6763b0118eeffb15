"""Mandarin frontend: `normalize(text)` then `g2p(norm_text, version)` -> (phones, word2ph).

`TextNormalizer` (also used by the Cantonese frontend) lives in `engine.text.chinese.textnorm`.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

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


def make_g2p(
    version: str = "v2",
    g2pw_dir: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
    require_g2pw: bool = False,
) -> ChineseG2P:
    """A Mandarin converter for a model version: with G2PW when ``g2pw_dir`` holds the model (and onnxruntime and
    opencc are installed), otherwise the pypinyin path. ``require_g2pw`` turns a missing model or package into a
    CheckpointError instead of the fallback (with a warning)."""
    from engine.errors import CheckpointError
    from engine.text.symbols import table_name

    erhua = table_name(version) != "v1"
    if g2pw_dir is None:
        if require_g2pw:
            raise CheckpointError("G2PW was requested but no G2PW model folder was given")
        return ChineseG2P(erhua=erhua)
    from .g2pw import G2PWConverter

    try:
        return ChineseG2P(erhua=erhua, g2pw=G2PWConverter.from_folder(g2pw_dir, tokenizer_dir))
    except CheckpointError as e:
        if require_g2pw:
            raise
        warnings.warn(f"G2PW unavailable, using pypinyin for Mandarin polyphones: {e}", stacklevel=2)
        return ChineseG2P(erhua=erhua)


def g2p(norm_text: str, version: str = "v2", converter: ChineseG2P | None = None) -> tuple[list[str], list[int]]:
    """Normalised Mandarin text -> (phones, word2ph). ``converter`` overrides the default (e.g. one with G2PW)."""
    return (converter or default_g2p("v1" if version == "v1" else "v2"))(norm_text)


__all__ = ["ChineseG2P", "TextNormalizer", "default_g2p", "g2p", "make_g2p", "normalize"]
