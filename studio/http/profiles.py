"""Saved reference voices ("profiles"): what the OpenAI endpoint's ``voice`` names.

A profile is a folder ``<root>/<name>/`` holding one reference clip, optional auxiliary clips and a
``profile.json`` with the transcript, its language and optionally the GPT/SoVITS weights to use::

    {"audio": "reference.wav", "prompt_text": "...", "prompt_lang": "zh",
     "aux_audio": [], "gpt_weights": "", "sovits_weights": ""}

Names are validated (letters, digits, ``_ . -``; no separators), and every file a profile names must
lie inside its own folder, so a profile can never point the server at an arbitrary path.

A saved clip keeps only the audio: the upload is decoded and checked as a request's reference is, and what
is stored is that reference (mono, at its own rate, trimmed or padded as the rules say) as a WAV of 16-bit
samples when they are exactly 16-bit, else of float32 samples, so what a voice synthesises is what the
upload would have synthesised, and no chunk of the upload (a 19 MiB ``JUNK`` chunk, tags, trailing bytes)
is kept. The store holds at most ``max_profiles`` voices and ``max_bytes`` bytes in all (both checked under
the write lock, so parallel saves cannot overshoot them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError, OptionsError, ReferenceAudioError, with_field

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PROFILE_FILE = "profile.json"
MAX_PROMPT_CHARS = 1000
MAX_PROFILES = 256  # saved voices (ServerLimits.max_profiles)
MAX_STORE_BYTES = 512 << 20  # every saved voice's files together (ServerLimits.max_profiles_bytes)


class ProfileNotFoundError(EngineError, LookupError):
    """No saved voice of that name."""


class ProfileExistsError(EngineError, FileExistsError):
    """A voice of that name is already saved (delete it first, or save with overwrite)."""


@dataclass(frozen=True)
class VoiceProfile:
    """One saved voice: a reference clip with its transcript and language."""

    name: str
    audio_path: Path
    prompt_text: str
    prompt_lang: str
    aux_audio_paths: tuple[Path, ...] = ()
    gpt_weights: str = ""  # optional weight file (resolved against the server's weight folders)
    sovits_weights: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "prompt_text": self.prompt_text, "prompt_lang": self.prompt_lang,
                "aux_audio": [p.name for p in self.aux_audio_paths], "gpt_weights": self.gpt_weights,
                "sovits_weights": self.sovits_weights}


def check_name(name: str, field: str = "voice") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name.endswith("."):
        raise OptionsError(
            f"{field}: {name!r} is not a valid voice name; use 1-64 letters, digits, '_', '.' or '-', "
            f"starting with a letter or digit"
        )
    return name


def _check_language(lang: str) -> str:
    from engine.text.frontend import languages

    valid = languages("v2")  # the widest set; the model version is checked at synthesis time
    if lang not in valid:
        raise OptionsError(f"prompt_lang: {lang!r} is not a language code; use one of {', '.join(valid)}")
    return lang


def _inside(folder: Path, name: str, field: str) -> Path:
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise OptionsError(f"{field}: {name!r} must be a plain file name inside the profile folder")
    return folder / name


def _checked_audio(data: bytes, field: str, rules=None) -> bytes:
    """The clip as it will be stored: it passes exactly the checks a request's reference passes (decoding,
    length, silence, clipping: :func:`engine.reference.read_reference` under the server's rules), and
    becomes a WAV of the checked reference alone (see the module docstring)."""
    import io

    import numpy as np
    import soundfile as sf

    from engine.reference import ReferenceRules, read_reference

    try:
        clip = read_reference(io.BytesIO(data), rules if rules is not None else ReferenceRules())
    except ReferenceAudioError as e:
        raise with_field(e, field)
    pcm = np.round(clip.audio.astype(np.float64) * 32768.0)
    exact16 = bool(np.all((pcm >= -32768) & (pcm <= 32767)) and np.array_equal(pcm / 32768.0, clip.audio))
    out = io.BytesIO()
    sf.write(out, pcm.astype(np.int16) if exact16 else clip.audio, clip.sample_rate, format="WAV",
             subtype="PCM_16" if exact16 else "FLOAT")
    return out.getvalue()


def folder_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (links not followed)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


class ProfileStore:
    """The saved voices in one folder. Reads are cheap and uncached (the folder is the truth);
    writes are atomic (a finished folder is renamed into place) and serialised by a lock."""

    def __init__(self, root: str | os.PathLike, max_audio_bytes: int = 20 * 1024 * 1024,
                 max_profiles: int = MAX_PROFILES, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.root = Path(root)
        self.max_audio_bytes = max_audio_bytes  # an upload (before decoding)
        self.max_profiles = max_profiles  # saved voices
        self.max_bytes = max_bytes  # every file of every saved voice together
        self._write_lock = threading.Lock()

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and NAME_PATTERN.fullmatch(p.name) and (p / PROFILE_FILE).is_file())

    def list(self) -> list[VoiceProfile]:
        out = []
        for name in self.names():
            try:
                out.append(self.get(name))
            except EngineError:
                continue  # a broken folder is skipped in listings; get() names the problem
        return out

    def get(self, name: str) -> VoiceProfile:
        check_name(name)
        folder = self.root / name
        meta_file = folder / PROFILE_FILE
        if not meta_file.is_file():
            known = ", ".join(self.names()) or "none saved yet"
            raise ProfileNotFoundError(f"voice: no saved voice named {name!r} (known: {known})")
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise OptionsError(f"voice: the saved voice {name!r} is damaged (its {PROFILE_FILE} is not valid "
                               f"JSON); save the voice again", field="voice") from None
        if not isinstance(meta, dict):
            raise OptionsError(f"voice: the saved voice {name!r} is damaged (its {PROFILE_FILE} is not a JSON "
                               f"object); save the voice again", field="voice")
        audio = _inside(folder, meta.get("audio", ""), f"voice {name}: audio")
        if not audio.is_file():
            raise ReferenceAudioError(f"voice: the reference clip of {name!r} is missing; save the voice again",
                                      field="voice")
        aux = tuple(_inside(folder, a, f"voice {name}: aux_audio") for a in meta.get("aux_audio", []) or [])
        return VoiceProfile(
            name=name,
            audio_path=audio,
            prompt_text=str(meta.get("prompt_text", "")),
            prompt_lang=str(meta.get("prompt_lang", "")),
            aux_audio_paths=aux,
            gpt_weights=str(meta.get("gpt_weights", "") or ""),
            sovits_weights=str(meta.get("sovits_weights", "") or ""),
        )

    def save(self, name: str, audio: bytes, prompt_text: str, prompt_lang: str, *, suffix: str = ".wav",
             gpt_weights: str = "", sovits_weights: str = "", overwrite: bool = False, rules=None) -> VoiceProfile:
        """Store a new voice from the clip's bytes. The clip must be at most ``max_audio_bytes`` and pass the
        reference checks of ``rules`` (a ReferenceRules; default: the official ones); the transcript at most
        :data:`MAX_PROMPT_CHARS` characters; the store keeps its count and byte quota. ``suffix`` (the upload's
        file name) decides nothing: the clip's bytes are decoded whatever it is called, as a request's are."""
        check_name(name)
        if len(audio) > self.max_audio_bytes:
            raise OptionsError(f"audio: the clip is {len(audio)} bytes; the limit is {self.max_audio_bytes}")
        stored = _checked_audio(audio, "audio", rules)
        if len(prompt_text) > MAX_PROMPT_CHARS:
            raise OptionsError(f"prompt_text: {len(prompt_text)} characters; the limit is {MAX_PROMPT_CHARS}")
        _check_language(prompt_lang)
        meta = {"audio": "reference.wav", "prompt_text": prompt_text, "prompt_lang": prompt_lang,
                "aux_audio": [], "gpt_weights": gpt_weights, "sovits_weights": sovits_weights}
        text = json.dumps(meta, ensure_ascii=False, indent=1)
        with self._write_lock:
            target = self.root / name
            if target.exists() and not overwrite:
                raise ProfileExistsError(f"voice: {name!r} is already saved; delete it first")
            self._check_quota(target, len(stored) + len(text.encode("utf-8")))
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
            try:
                (staging / meta["audio"]).write_bytes(stored)
                (staging / PROFILE_FILE).write_text(text, encoding="utf-8")
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
        return self.get(name)

    def _check_quota(self, target: Path, new_bytes: int) -> None:
        """OptionsError when one more voice of ``new_bytes`` (replacing ``target`` if saved) would take the store
        over its count or its bytes. Called under the write lock."""
        replaced = target.is_dir()
        count = len(self.names()) - (1 if replaced else 0)
        if count >= self.max_profiles:
            raise OptionsError(f"{count} voices are saved already, the most this server keeps (max_profiles); "
                               "delete one first", field="voices")
        used = folder_bytes(self.root) - (folder_bytes(target) if replaced else 0) if self.root.is_dir() else 0
        if used + new_bytes > self.max_bytes:
            raise OptionsError(f"the saved voices hold {used} bytes; this one ({new_bytes} bytes) would take them "
                               f"over {self.max_bytes} (max_profiles_bytes); delete a voice first", field="voices")

    def delete(self, name: str) -> None:
        check_name(name)
        with self._write_lock:
            folder = self.root / name
            if not (folder / PROFILE_FILE).is_file():
                raise ProfileNotFoundError(f"voice: no saved voice named {name!r}")
            shutil.rmtree(folder)
