"""Engine errors as the page's user should read them: in the page's language, naming the file as the
user knows it (the upload's name, not the server's temporary copy), pointing to the page's own tools,
and free of Python reprs and API names. No gradio here.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.errors import BusyError, CheckpointError, EngineError, OptionsError, ReferenceAudioError, TextError
from engine.text.limits import TextLimitError
from webui.i18n import text

_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")
_AUX = re.compile(r"reference\.aux_audio\[(\d+)\]")
_API = re.compile(r"\s*\(?ReferenceRules\([^)]*\)\)?")


def user_message(error: EngineError, locale: str, files: dict[str, str] | None = None,
                 weights_listed: bool = True) -> str:
    """The message for ``error``; ``files`` maps each path of the request to its role
    (``ref``, ``aux``, ``gpt``, ``sovits``), so a message names the file it is about. ``weights_listed``:
    whether the model pickers list any file (a missing file's message points to the list only then)."""
    from engine.reference import ReferenceLengthError, SilentReferenceError

    files = files or {}
    message = str(error)
    path, role = _named_file(message, error.field, files)
    name = Path(path).name if path else ""
    if isinstance(error, ReferenceLengthError):
        key = "ref.too_long" if error.seconds > error.max_seconds else "ref.too_short"
        return text(key, locale, seconds=f"{error.seconds:.2f}", min=f"{error.min_seconds:g}",
                    max=f"{error.max_seconds:g}")
    if isinstance(error, SilentReferenceError) or (isinstance(error, ReferenceAudioError) and " silent" in message):
        return text("ref.silent", locale)
    if isinstance(error, ReferenceAudioError):
        if "no reference clip" in message:
            return text("ref.missing", locale)
        if ("NaN" in message or "audio samples lie within" in message
                or "only" in message and "samples were decoded" in message):
            return text("ref.damaged", locale, name=name or "?")
        return text("ref.unreadable", locale, name=name or "?")
    if isinstance(error, TextLimitError):  # says what to change (a number too long...): shown as it is
        return text("error.other", locale, message=clean(message, files))
    if isinstance(error, TextError):
        return text("text.empty" if "empty" in message else "text.nothing", locale)
    if isinstance(error, CheckpointError):
        if "does not exist" in message:
            key = "weights.not_found" if weights_listed else "weights.not_found_none"
            return text(key, locale, name=name or _quoted(message))
        if "GPT (.ckpt)" in message:  # the GPT loader refused the file (the pickers may hold one file twice)
            role = "gpt"
        elif any(m in message for m in ("SoVITS (.pth)", "SoVITS model", "SoVITS weights")):
            role = "sovits"
        if role == "gpt":
            return text("weights.not_gpt", locale, name=name)
        if role == "sovits":
            return text("weights.not_sovits", locale, name=name)
        return text("weights.unreadable", locale, name=name or "?", reason=clean(message, files))
    if isinstance(error, BusyError):  # the workers, the scheduler or the decoding budget: retry later
        return text("busy", locale)
    if isinstance(error, OptionsError):
        return text("error.options", locale, message=clean(message, files))
    return text("error.other", locale, message=clean(message, files))


def clean(message: str, files: dict[str, str]) -> str:
    """Paths shortened to file names, reprs and API names removed."""
    for path in sorted(files, key=len, reverse=True):
        message = message.replace(repr(path), repr(Path(path).name)).replace(path, Path(path).name)
    message = _API.sub("", _REPR.sub("the file", message))
    return message.strip()


def _named_file(message: str, field: str | None, files: dict[str, str]) -> tuple[str, str]:
    """The request file that ``message`` is about, with its role: the longest path it contains; else,
    for a clip read from memory, the extra clip that the error's field numbers, or the reference clip."""
    for path in sorted(files, key=len, reverse=True):
        if path and path in message:
            return path, files[path]
    clips = {role: [p for p, r in files.items() if r == role and p] for role in ("ref", "aux")}
    if (found := _AUX.fullmatch(field or "")) and int(found.group(1)) < len(clips["aux"]):
        return clips["aux"][int(found.group(1))], "aux"
    if "audio" in message and clips["ref"]:
        return clips["ref"][0], "ref"
    return "", ""


def _quoted(message: str) -> str:
    found = re.search(r"'([^']+)'", message)
    return Path(found.group(1)).name if found else "?"
