"""Mandarin punctuation folding: map CJK marks onto the six g2p marks and drop everything else."""

from __future__ import annotations

import re
from functools import lru_cache

from engine.data import load_json
from engine.text.symbols import PUNCTUATION

_KEEP = "".join(PUNCTUATION)


@lru_cache(maxsize=2)
def _rep_map(module: str) -> tuple[dict[str, str], re.Pattern]:
    table = load_json("frontend_constants.json")[f"GPT_SoVITS/text/{module}.py::rep_map"]
    return table, re.compile("|".join(re.escape(k) for k in table))


def replace_punctuation(text: str, module: str = "chinese2") -> str:
    """嗯 -> 恩, 呣 -> 母, fold marks with the official rep_map, then keep only U+4E00..U+9FA5 and ``! ? … , . -``."""
    table, pattern = _rep_map(module)
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = pattern.sub(lambda m: table[m.group()], text)
    return re.sub(r"[^\u4e00-\u9fa5" + _KEEP + r"]+", "", text)


_RUNS = re.compile(f"([{''.join(re.escape(p) for p in PUNCTUATION)}])([{''.join(re.escape(p) for p in PUNCTUATION)}])+")


def replace_consecutive_punctuation(text: str) -> str:
    """A run of two or more of ``! ? … , . -`` keeps only its first mark."""
    return _RUNS.sub(r"\1", text)
