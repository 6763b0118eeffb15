"""What the page's buttons do, without gradio: each function takes plain values and calls the engine.

``webui.app`` wraps these in Gradio event handlers of a few lines (converting engine errors to
``gr.Error``). Keeping them gradio-free lets the tests call them directly.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import EngineError, ReferenceAudioError
from engine.options import MAX_SEED
from engine.versions import VOCODER_VERSIONS


@dataclass(frozen=True)
class Chunk:
    """One piece of streamed audio, or (``final``) the whole clip."""

    sample_rate: int
    pcm16: np.ndarray  # (n,) int16
    final: bool = False
    status: str = ""


def new_seed() -> int:
    return random.randint(0, MAX_SEED)


def describe_reference(path: str | None, rules) -> str:
    """The measured length of an uploaded/recorded clip, and whether the engine will accept it."""
    from engine.reference import ReferenceLengthError, read_reference

    if not path:
        return ""
    try:
        clip = read_reference(path, rules)
    except ReferenceLengthError as e:
        return f"Problem: {e.seconds:.2f} s — {'too long' if e.seconds > e.max_seconds else 'too short'}: " \
               f"references must be {e.min_seconds:g}–{e.max_seconds:g} s."
    except ReferenceAudioError as e:
        return f"Problem: {_strip_path(str(e), path)}"
    return f"✓ {clip.original_seconds:.2f} s at {clip.sample_rate} Hz (references: " \
           f"{rules.min_seconds:g}–{rules.max_seconds:g} s)"


def _strip_path(message: str, path: str) -> str:
    """Messages name the server's temporary copy of an upload; the user knows it as 'the clip'."""
    return message.replace(f"reference audio {path}", "the clip").replace(str(path), "the clip")


def synthesize(studio, text: str, text_lang: str, reference, options, gpt: str | None = None,
               sovits: str | None = None, max_tokens: int | None = None,
               on_progress: Callable[[int, int], None] | None = None) -> Iterator[Chunk]:
    """Stream the cloned voice: one chunk per engine result, then the whole clip (``final``).

    ``max_tokens`` caps ``early_stop_num`` (the server's bound on tokens per sentence). Engine errors
    propagate; every check the engine makes happens before the first chunk.
    """
    import time

    if max_tokens is not None and (options.early_stop_num is None or options.early_stop_num > max_tokens):
        options = options.replace(early_stop_num=max_tokens)
    started = time.monotonic()
    results = studio.synthesize(text, text_lang, reference, options, gpt=gpt or None, sovits=sovits or None,
                                on_progress=on_progress)
    pieces, rate, seed = [], 0, options.seed
    try:
        for r in results:
            pieces.append(r.pcm16())
            rate, seed = r.sample_rate, r.seed
            yield Chunk(r.sample_rate, pieces[-1])
    finally:  # a cancelled request (Stop, closed tab) frees its per-request state now, not at GC
        results.close()
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    seconds = audio.shape[0] / rate if rate else 0.0
    took = time.monotonic() - started
    status = f"Seed **{seed}** · {seconds:.2f} s of audio at {rate // 1000 if rate else 0} kHz · " \
             f"took {took:.1f} s ({seconds / took if took else 0:.2f}× real time)"
    yield Chunk(rate, audio, final=True, status=status)


def make_reference(audio: str | None, text: str, language: str, aux: Sequence[Any] | None):
    """The engine's Reference from the page's fields (ReferenceAudioError when no clip was given)."""
    from engine.pipeline import Reference

    if not audio:
        raise ReferenceAudioError("no reference clip: upload or record 3-10 s of the voice to clone")
    aux_paths = tuple(str(getattr(a, "name", a)) for a in (aux or ()))
    return Reference(audio=audio, text=text or "", language=language or "", aux_audio=aux_paths)


# ---- missing weights -------------------------------------------------------------------------


def missing_weights(config, weights) -> dict[str, Path]:
    """The files the configured model set needs that are not there (by what they are)."""
    missing = {k: p for k, p in config.missing_files().items()}
    version = config.active.version
    if version in VOCODER_VERSIONS:
        missing.update({"vocoder_path": p} if not (p := weights.extra("vocoder", version)).exists() else {})
    if version in ("v2Pro", "v2ProPlus"):
        missing.update({"sv_weights_path": p} if not (p := weights.extra("sv", version)).exists() else {})
    return missing


def missing_report(missing: dict[str, Path], version: str) -> str:
    if not missing:
        return ""
    rows = "\n".join(f"- `{key}`: `{path}`" for key, path in missing.items())
    return (f"### Weights are missing\nThe configured {version} model set is incomplete, so synthesis with it "
            f"will fail until these files are in place:\n{rows}\n\nPress **Download weights** to fetch the "
            f"official files into the official layout (or run `sovits-studio download --version {version}`).")


def download_weights(root: str | os.PathLike, version: str, fetch: Callable[..., Any] | None = None) -> str:
    """Fetch the official files of ``version`` under ``root``; the outcome as text (offline: what to get)."""
    from engine.loading.download import assets_for, download

    lines: list[str] = []
    try:
        (fetch or download)(root, assets_for([version]), log=lines.append)
    except EngineError as e:
        return f"Download did not complete.\n\n```\n{e}\n```"
    return "Download complete. Reload the page to use the new weights.\n\n```\n" + "\n".join(lines[-20:]) + "\n```"
