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

from engine.errors import BusyError, EngineError, ReferenceAudioError
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


def describe_reference(path: str | None, rules, locale: str = "en") -> str:
    """The measured length of an uploaded/recorded clip, or what is wrong with it, in ``locale``."""
    from engine.reference import read_reference
    from webui.i18n import text
    from webui.messages import user_message

    if not path:
        return ""
    try:
        clip = read_reference(path, rules)
    except (ReferenceAudioError, BusyError) as e:  # BusyError: the process's decoding budget is full now
        return "⚠ " + user_message(e, locale, {path: "ref"})
    return text("ref.ok", locale, seconds=f"{clip.original_seconds:.2f}", rate=clip.sample_rate,
                min=f"{rules.min_seconds:g}", max=f"{rules.max_seconds:g}")


def language_note(text_value: str, language: str, locale: str = "en") -> str:
    """A warning when ``language`` reads almost none of the text (empty when it reads it)."""
    from engine.text.language_check import check_text_language
    from webui.i18n import text

    check = check_text_language(text_value or "", language or "")
    if not check.mismatch:
        return ""
    return "⚠ " + text("text.language", locale, language=text(f"lang.{check.language}", locale),
                       percent=f"{check.readable * 100:.0f}", suggested=text(f"lang.{check.looks_like}", locale)
                       if check.looks_like != "auto" else text("lang.auto", locale))


RESCAN_FAILED = "the weight folders could not be listed again; the server log says why"


def rescan_choices(catalog) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The pickers' (GPT, SoVITS) choices listed again. A failure the listing could not skip is logged with
    its detail and reaches the page as :data:`RESCAN_FAILED`, which names no server path."""
    import logging

    try:
        return catalog.picker_choices("gpt"), catalog.picker_choices("sovits")
    except (OSError, RuntimeError, ValueError) as e:
        logging.getLogger(__name__).warning("rescan of the weight folders failed: %s", e)
        raise EngineError(RESCAN_FAILED) from None


def pair_note(catalog, gpt: str | None, sovits: str | None, locale: str = "en") -> str:
    """A warning when the picked GPT and SoVITS files do not belong together (empty when they do)."""
    from webui.i18n import text
    from webui.models_list import mismatch

    g, s = (catalog.describe(p) if p else None for p in (gpt, sovits))
    if g is None or s is None or (pairs := mismatch(g, s)) is None:
        return ""
    return text("weights.pair", locale, gpt=g.path.name, gpt_version=g.tag, sovits=s.path.name,
                sovits_version=s.tag, pairs="/".join(pairs))


def synthesize(studio, text: str, text_lang: str, reference, options, gpt: str | None = None,
               sovits: str | None = None, max_tokens: int | None = None,
               on_progress: Callable[[int, int], None] | None = None, locale: str = "en",
               super_sampler: Callable[[np.ndarray, int], tuple[np.ndarray, int]] | None = None) -> Iterator[Chunk]:
    """Stream the cloned voice: one chunk per engine result, then the whole clip (``final``).

    ``max_tokens`` caps ``early_stop_num`` (the server's bound on tokens per sentence). With a
    ``super_sampler`` (v3 super-sampling), the whole clip is widened once, as the official code does;
    the streamed pieces stay at the model's rate. Engine errors propagate; every check the engine makes
    happens before the first chunk.
    """
    import time

    from webui.i18n import text as tr

    if max_tokens is not None and (options.early_stop_num is None or options.early_stop_num > max_tokens):
        options = options.replace(early_stop_num=max_tokens)
    started = time.monotonic()
    results = studio.synthesize(text, text_lang, reference, options, gpt=gpt or None, sovits=sovits or None,
                                on_progress=on_progress)
    pieces, floats, rate, seed = [], [], 0, options.seed
    try:
        for r in results:
            pieces.append(r.pcm16())
            floats += [r.audio] if super_sampler is not None else []
            rate, seed = r.sample_rate, r.seed
            yield Chunk(r.sample_rate, pieces[-1])
    finally:  # a cancelled request (Stop, closed tab) frees its per-request state now, not at GC
        results.close()
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)
    if super_sampler is not None and floats:
        wide, rate = super_sampler(np.concatenate(floats), rate)
        audio = np.clip(wide * 32768.0, -32768, 32767).astype(np.int16)
    seconds = audio.shape[0] / rate if rate else 0.0
    took = time.monotonic() - started
    status = tr("status.done", locale, seed=seed, seconds=f"{seconds:.2f}", khz=f"{rate / 1000:g}" if rate else "0",
                  took=f"{took:.1f}", speed=f"{seconds / took if took else 0:.2f}")
    yield Chunk(rate, audio, final=True, status=status)


def make_reference(audio: str | None, text: str, language: str, aux: Sequence[Any] | None):
    """The engine's Reference from the page's fields (ReferenceAudioError when no clip was given)."""
    from engine.reference import Reference

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


MODEL_FOLDER = "<model folder>"  # what the page says instead of the weight root's path on the server


def shown_path(path: str | os.PathLike, root: str | os.PathLike | None) -> str:
    """``path`` as the page may show it: relative to the weight root ``root`` (POSIX separators), or only its
    file name when it lies elsewhere; never the server's absolute path."""
    path = Path(path)
    if root is not None:
        try:
            return path.resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix() if not path.is_absolute() else f"…/{path.name}"


def hide_root(text: str, root: str | os.PathLike) -> str:
    """``text`` with the weight root's absolute path (as given and resolved) replaced by :data:`MODEL_FOLDER`."""
    for form in sorted({str(root), str(Path(root).resolve())}, key=len, reverse=True):
        text = text.replace(form, MODEL_FOLDER)
    return text


def missing_report(missing: dict[str, Path], version: str, locale: str = "en",
                   root: str | os.PathLike | None = None) -> str:
    """The missing-weights panel: each missing file relative to the weight root ``root``."""
    from webui.i18n import text

    if not missing:
        return ""
    rows = "\n".join(f"- `{key}`: `{shown_path(path, root)}`" for key, path in missing.items())
    command = f"sovits-studio download --version {version}"
    hint = text("weights.missing_hint", locale, command=command)
    return f"{text('weights.missing', locale, version=version)}\n{rows}\n\n{hint}"


ADMIN_ONLY = ("Downloading weights is for this machine's user: open the page on this machine, or start the "
              "page with --auth and log in.")


def may_administer(username: str | None, client_host: str | None) -> bool:
    """Admin actions (downloading weights): a logged-in user, or, without --auth, a client on this machine."""
    import ipaddress

    if username:
        return True
    try:
        return client_host is not None and ipaddress.ip_address(client_host).is_loopback
    except ValueError:
        return client_host == "localhost"


def download_weights(root: str | os.PathLike, version: str, fetch: Callable[..., Any] | None = None,
                     locale: str = "en", progress: Callable[[float, str], Any] | None = None) -> str:
    """Fetch the official files of ``version`` under ``root``; the outcome as text (offline: what to get).
    ``progress(fraction, description)`` follows the bytes and files fetched (the page's progress bar)."""
    from engine.loading.download import assets_for, check_command, download
    from webui.i18n import text

    def on_progress(files: int, total_files: int, done: int, total: int) -> None:
        if progress is not None:
            share = done / total if total else files / max(1, total_files)
            progress(share, f"{files}/{total_files} files, {done / 2**20:.0f}/{total / 2**20:.0f} MiB")

    lines: list[str] = []
    try:  # the same --check command the CLI prints for this root and version
        (fetch or download)(root, assets_for([version]), log=lines.append,
                            check_command=check_command([version], root), on_progress=on_progress)
    except EngineError as e:
        return f"{text('download.failed', locale)}\n\n```\n{hide_root(str(e), root)}\n```"
    return f"{text('download.done', locale)}\n\n```\n" + hide_root("\n".join(lines[-20:]), root) + "\n```"
