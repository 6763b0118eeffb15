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


def missing_g2pw_packages() -> list[str]:
    """G2PW's runtime packages that are not installed (the ``g2pw`` extra, part of ``[server]``/``[webui]``)."""
    import importlib.util

    return [p for p in ("onnxruntime", "opencc") if importlib.util.find_spec(p) is None]


def g2pw_problem(folder: str | Path) -> str:
    """Why the G2PW model in ``folder`` cannot be used ("" when it can): an absent or incomplete folder, or a
    missing runtime package (onnxruntime, opencc: the ``[webui]`` and ``[server]`` extras bring them)."""
    from .g2pw import REQUIRED_FILES

    folder = Path(folder)
    if not folder.is_dir():
        return f"no G2PW model at {folder}"
    missing = [f for f in REQUIRED_FILES if not (folder / f).is_file()]
    if not any((folder / n).is_file() for n in ("g2pW.onnx", "g2pw.onnx")):
        missing.append("g2pW.onnx")
    if missing:
        return f"the G2PW folder {folder} lacks {', '.join(missing)}"
    packages = missing_g2pw_packages()
    if packages:
        return f"G2PW needs {' and '.join(packages)} (pip install onnxruntime opencc, or the [webui] extra)"
    return ""


def g2pw_fetch_command(root: str | Path) -> str:
    """The command that puts the G2PW model where the engine looks for it by default."""
    return f"sovits-studio download --g2pw --root {root}"


def g2pw_fix(version: str, folder: str | Path, root: str | Path) -> tuple[str, str]:
    """(why v2+ Mandarin runs without G2PW here, the command that fetches it); ("", "") when G2PW runs, and for v1
    (the official v1 frontend never uses G2PW). Every front door (synth, serve, webui, cluster) says it from this."""
    if version == "v1":
        return "", ""
    problem = g2pw_problem(folder)
    return (problem, g2pw_fetch_command(root)) if problem else ("", "")


def g2pw_notice(problem: str, root: str | Path) -> str:
    """The one-time notice of a front door whose v2+ Mandarin runs without G2PW (``problem``: see g2pw_problem)."""
    return (f"Mandarin polyphones are read with pypinyin, not G2PW as the official v2+ frontend does ({problem}); "
            f"fetch G2PW with `{g2pw_fetch_command(root)}`")


def g2pw_converter(folder: str | Path, tokenizer_dir: str | Path) -> ChineseG2P | None:
    """The v2+ converter with the G2PW model of ``folder`` (tokenizer: the chinese-roberta folder), or None
    when it cannot run here (the reason is logged)."""
    import logging

    from engine.errors import CheckpointError

    from .g2pw import G2PWConverter

    problem = g2pw_problem(folder)
    try:
        if not problem:
            return ChineseG2P(erhua=True, g2pw=G2PWConverter.from_folder(folder, tokenizer_dir))
    except CheckpointError as e:
        problem = str(e)
    logging.getLogger(__name__).warning("Mandarin polyphones come from pypinyin: %s", problem)
    return None


def g2p(norm_text: str, version: str = "v2", converter: ChineseG2P | None = None) -> tuple[list[str], list[int]]:
    """Normalised Mandarin text -> (phones, word2ph). ``converter`` overrides the default (e.g. one with G2PW)."""
    return (converter or default_g2p("v1" if version == "v1" else "v2"))(norm_text)


__all__ = ["ChineseG2P", "TextNormalizer", "default_g2p", "g2p", "g2pw_converter", "g2pw_fetch_command", "g2pw_notice", "g2pw_problem",
           "make_g2p", "missing_g2pw_packages", "normalize"]
