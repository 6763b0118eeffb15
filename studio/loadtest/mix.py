"""The product workload (``loadtest --mix``): what a shared demo link or an API deployment sees.

Each client uploads its own reference clip, made from a clip of a reference folder (``manifest.json``
gives each clip's exact transcript and language) by appending ``serial + 1`` zero samples, so that no
two clients of a run upload the same bytes and the server's content-keyed reference cache
(sha256 of the clip's bytes) cannot serve one client's features to another; the client keeps its
clip for all of its requests, as a user keeps their voice. Requests rotate through the texts
(Mandarin, English, Japanese: through the server's real text front end) and the modes (token-chunk
streams, ``streaming_mode=2``, and whole files, ``streaming_mode=0``), so every level holds each
(mode, language) pair in equal shares.
"""

from __future__ import annotations

import io
import json
import wave
from dataclasses import dataclass, field
from pathlib import Path

from studio.loadtest.errors import LoadTestError

# A medium sentence or two per language, for the real text front end (numbers, punctuation, mixed case).
TEXTS: dict[str, str] = {
    "zh": "这是一个用于测试语音合成速度的句子。我们希望它听起来自然流畅，并且在很多人同时使用的时候依然足够快。",
    "en": "This sentence measures how fast the speech engine answers many listeners at once. "
          "We hope it sounds natural, and that every stream arrives faster than real time.",
    "ja": "これは音声合成の速さを確かめるための文章です。たくさんの人が同時に使っても、自然で滑らかに聞こえることを願っています。",
}
MODES = (2, 0)  # api_v2 streaming_mode: token-chunk streams and whole files
MODE_NAMES = {0: "whole file", 1: "per sentence", 2: "stream", 3: "fixed chunks"}
DEFAULT_REF_DIR = "../shared/refset"


@dataclass(frozen=True)
class RefClip:
    """A reference clip of the folder: its file name, WAV bytes, exact transcript and language."""

    name: str
    wav: bytes = field(repr=False)
    text: str
    language: str


@dataclass(frozen=True)
class Job:
    """What one request of the mix asks for."""

    text: str
    text_lang: str
    streaming_mode: int

    @property
    def tag(self) -> str:
        return f"{MODE_NAMES[self.streaming_mode]}/{self.text_lang}"


@dataclass(frozen=True)
class MixWorkload:
    """Clips to derive each client's upload from, texts per language and the modes to rotate through."""

    clips: tuple[RefClip, ...]
    texts: tuple[tuple[str, str], ...] = tuple(TEXTS.items())  # (language, text)
    modes: tuple[int, ...] = MODES
    source: str = ""  # where the clips came from (for the report)

    def __post_init__(self) -> None:
        if not self.clips:
            raise LoadTestError("mix: no reference clips")
        if not self.texts:
            raise LoadTestError("mix: no texts")
        if not self.modes or any(m not in MODE_NAMES for m in self.modes):
            raise LoadTestError(f"mix: modes must be api_v2 streaming modes (0-3), got {self.modes!r}")

    def job(self, n: int) -> Job:
        """The ``n``-th request of a level: languages rotate fastest, then modes, so any
        ``len(texts) * len(modes)`` consecutive requests hold each pair once."""
        lang, text = self.texts[n % len(self.texts)]
        return Job(text, lang, self.modes[(n // len(self.texts)) % len(self.modes)])

    def clip(self, serial: int) -> tuple[RefClip, bytes]:
        """Client ``serial``'s clip (numbered across the whole run) and its own bytes: the folder's clip
        ``serial % len(clips)`` with ``serial + 1`` zero samples appended (unique bytes per client)."""
        if serial < 0:
            raise ValueError("serial must be >= 0")
        base = self.clips[serial % len(self.clips)]
        return base, append_silence(base.wav, serial + 1)

    def describe(self) -> dict:
        return {"clips": [{"file": c.name, "language": c.language, "text": c.text} for c in self.clips],
                "source": self.source, "texts": dict(self.texts), "modes": list(self.modes),
                "uniqueness": "each client uploads its folder clip with (client serial + 1) zero samples appended: "
                              "no two clients of the run send the same bytes"}


def append_silence(wav_bytes: bytes, samples: int) -> bytes:
    """``wav_bytes`` (PCM WAV) with ``samples`` zero frames appended, rewritten as a plain WAV."""
    try:
        with wave.open(io.BytesIO(wav_bytes), "rb") as r:
            params = r.getparams()
            frames = r.readframes(r.getnframes())
    except (wave.Error, EOFError) as e:
        raise LoadTestError(f"mix: a reference clip is not a PCM WAV file ({e})") from None
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(params.nchannels)
        w.setsampwidth(params.sampwidth)
        w.setframerate(params.framerate)
        w.writeframes(frames + b"\x00" * (samples * params.nchannels * params.sampwidth))
    return out.getvalue()


def load_mix(ref_dir: str | Path, languages: tuple[str, ...] | None = None,
             modes: tuple[int, ...] = MODES) -> MixWorkload:
    """The mix over the clips of ``ref_dir`` (its ``manifest.json``: ``clips`` with ``file``, ``text``,
    ``language``), speaking ``languages`` (default: every language of :data:`TEXTS`)."""
    folder = Path(ref_dir)
    manifest = folder / "manifest.json"
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))["clips"]
    except FileNotFoundError:
        raise LoadTestError(f"--ref-dir: {manifest} does not exist; give a folder of WAV clips with a "
                            f"manifest.json (clips: file, text, language), e.g. --ref-dir ../shared/refset") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LoadTestError(f"--ref-dir: cannot read the clips of {manifest} ({type(e).__name__}: {e})") from None
    clips = []
    for entry in entries:
        try:
            name, text, lang = entry["file"], entry["text"], entry["language"]
            wav = (folder / name).read_bytes()
        except (KeyError, TypeError):
            raise LoadTestError(f"--ref-dir: each clip of {manifest} needs file, text and language; got {entry!r}") \
                from None
        except OSError as e:
            raise LoadTestError(f"--ref-dir: cannot read {folder / name} ({e.strerror or e})") from None
        append_silence(wav, 0)  # checks it is a PCM WAV now, not at the first request
        clips.append(RefClip(name, wav, text, lang))
    languages = tuple(TEXTS) if languages is None else languages
    unknown = [lang for lang in languages if lang not in TEXTS]
    if unknown:
        raise LoadTestError(f"mix: no text for {', '.join(unknown)}; choose among {', '.join(TEXTS)}")
    return MixWorkload(tuple(clips), tuple((lang, TEXTS[lang]) for lang in languages), tuple(modes), str(folder))
