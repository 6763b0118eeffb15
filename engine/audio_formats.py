"""Audio encoders for the HTTP responses: mono int16 PCM in, bytes of a media type out.

The api_v2 media types are ``wav raw ogg aac`` (official ``api_v2.py`` ``check_params``); the OpenAI
endpoint adds ``mp3 opus flac pcm``. Every function here is pure (no state outside its arguments), so
one request's audio can never reach another's response. Streaming follows the official server: a WAV
stream is one header with zero frames followed by raw PCM; every other type encodes each chunk as a
self-contained stream (chained Ogg, concatenated ADTS frames), which players accept.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Iterable, Iterator

import numpy as np

from engine.errors import OptionsError

API_V2_MEDIA_TYPES = ("wav", "raw", "ogg", "aac")
OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = tuple(dict.fromkeys(API_V2_MEDIA_TYPES + OPENAI_FORMATS))

_CONTENT_TYPES = {
    "wav": "audio/wav",
    "raw": "audio/raw",
    "ogg": "audio/ogg",
    "aac": "audio/aac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Ogg/Opus, as OpenAI returns it
    "flac": "audio/flac",
    "pcm": "audio/pcm",
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the only rates Opus encodes
AAC_BITRATE = 192_000  # the official server's ffmpeg `-b:a 192k`
_OGG_BLOCK = 32768  # frames per libsndfile write: large single writes can overflow its stack (upstream #1199)


def content_type(media_type: str) -> str:
    """The HTTP ``Content-Type`` for a media type (api_v2 sends ``audio/<media_type>``)."""
    check_media_type(media_type, MEDIA_TYPES)
    return _CONTENT_TYPES[media_type]


def check_media_type(media_type: str, allowed: tuple[str, ...], field: str = "media_type") -> str:
    if media_type not in allowed:
        raise OptionsError(f"{field}: {media_type!r} is not supported; use one of {', '.join(allowed)}")
    return media_type


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    """Mono int16 samples. int16 passes through; float audio in [-1, 1] becomes ``x * 32768`` as in
    TTS.py, but clipped to the int16 range (the official cast wraps a sample of exactly +1.0)."""
    a = np.asarray(audio)
    if a.ndim == 2 and 1 in a.shape:
        a = a.reshape(-1)
    if a.ndim != 1:
        raise OptionsError(f"audio must be mono (1-D), found shape {a.shape}")
    if a.dtype == np.int16:
        return a
    if not np.issubdtype(a.dtype, np.floating):
        raise OptionsError(f"audio must be int16 or float, found {a.dtype}")
    # x * 32768 is exact in the input's own float type (a power of two), so float32 audio stays float32: one
    # scaled copy, clipped and cleaned in place (NaN -> 0; the clip bounds the infinities), then the cast
    x = np.multiply(a, 32768.0, dtype=np.float64 if a.dtype == np.float64 else np.float32)
    np.clip(x, -32768, 32767, out=x)
    np.copyto(x, 0, where=np.isnan(x))
    return x.astype(np.int16)


def wav_stream_header(sample_rate: int, channels: int = 1, sample_width: int = 2) -> bytes:
    """A WAV header with zero frames: the first chunk of a streamed WAV (raw PCM follows)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(sample_width)
        w.setframerate(sample_rate)
        w.writeframes(b"")
    return buf.getvalue()


def _soundfile(pcm: np.ndarray, sample_rate: int, fmt: str, subtype: str | None = None) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    with sf.SoundFile(buf, mode="w", samplerate=sample_rate, channels=1, format=fmt, subtype=subtype) as f:
        for start in range(0, max(len(pcm), 1), _OGG_BLOCK):
            f.write(pcm[start:start + _OGG_BLOCK])
    return buf.getvalue()


def _resample_pcm16(pcm: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    if sr_in == sr_out:
        return pcm
    from engine.audio import resample_soxr

    return to_pcm16(resample_soxr(pcm.astype(np.float32) / 32768.0, sr_in, sr_out))


def encode_aac(pcm: np.ndarray, sample_rate: int, bit_rate: int = AAC_BITRATE) -> bytes:
    """AAC-LC in ADTS frames: PyAV (its wheels ship FFmpeg), else an ``ffmpeg`` binary on PATH."""
    try:
        import av
    except ImportError:
        av = None
    if av is not None:
        buf = io.BytesIO()
        with av.open(buf, "w", format="adts") as container:
            stream = container.add_stream("aac", rate=sample_rate)
            stream.bit_rate = bit_rate
            stream.layout = "mono"
            if len(pcm):
                frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
                frame.sample_rate = sample_rate
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
        return buf.getvalue()
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise OptionsError("media_type: aac needs PyAV (`pip install av`) or an ffmpeg binary on PATH")
    cmd = [ffmpeg, "-loglevel", "error", "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
           "-c:a", "aac", "-b:a", str(bit_rate), "-vn", "-f", "adts", "pipe:1"]
    done = subprocess.run(cmd, input=pcm.astype("<i2").tobytes(), capture_output=True, check=False)
    if done.returncode != 0:
        raise OptionsError(f"media_type: aac encoding failed: {done.stderr.decode(errors='replace')[-300:]}")
    return done.stdout


def encode(audio: np.ndarray, sample_rate: int, media_type: str) -> bytes:
    """The whole clip as one file of ``media_type`` (one of :data:`MEDIA_TYPES`)."""
    check_media_type(media_type, MEDIA_TYPES)
    pcm = to_pcm16(audio)
    if media_type in ("raw", "pcm"):
        return pcm.astype("<i2").tobytes()
    if media_type == "wav":
        return _soundfile(pcm, sample_rate, "WAV", "PCM_16")
    if media_type == "ogg":
        return _soundfile(pcm, sample_rate, "OGG", "VORBIS")
    if media_type == "opus":
        rate = sample_rate if sample_rate in OPUS_RATES else 48000
        return _soundfile(_resample_pcm16(pcm, sample_rate, rate), rate, "OGG", "OPUS")
    if media_type == "flac":
        return _soundfile(pcm, sample_rate, "FLAC", "PCM_16")
    if media_type == "mp3":
        return _soundfile(pcm, sample_rate, "MP3", "MPEG_LAYER_III")
    return encode_aac(pcm, sample_rate)


def encode_stream(chunks: Iterable[tuple[int, np.ndarray]], media_type: str) -> Iterator[bytes]:
    """Encode ``(sample_rate, audio)`` chunks as they come, as the official streaming response does:
    ``wav`` sends a zero-frame header (at the first chunk's rate) then raw PCM; other types encode
    each chunk on its own."""
    check_media_type(media_type, MEDIA_TYPES)
    first = True
    for sample_rate, audio in chunks:
        if media_type == "wav":
            if first:
                yield wav_stream_header(sample_rate)
            yield encode(audio, sample_rate, "raw")
        else:
            yield encode(audio, sample_rate, media_type)
        first = False
