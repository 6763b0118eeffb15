"""Audio decoding with a budget: what a hostile clip declares is checked before decoding, odd sample rates
resample through a bounded path, and no case grows the process by more than 200 MB or takes more than 5 s.

The memory is measured in a fresh interpreter (the peak RSS of this test process says nothing about one
case), which prepares each clip as a request would: read, then the 32 kHz spectrogram path, the 16 kHz
HuBERT path and the 16 kHz speaker-verification path.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.audio import MAX_CHANNELS, audio_format, read_audio, resample_sinc, sinc_kernel_size
from engine.errors import ReferenceAudioError
from tests.support.paths import REPO

MAX_GROWTH_MB = 200
MAX_SECONDS = 5.0


def _tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return np.repeat(mono[:, None], channels, axis=1).astype(np.float32)


def _wav_header(channels: int, rate: int, data_bytes: int, bits: int = 16) -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, bits)
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", data_bytes))


def hostile_clips(folder: Path) -> dict[str, Path]:
    clips = {}
    clips["odd_rate"] = folder / "odd_rate.wav"  # 4 s PCM16 at 16,022 Hz: gigabytes through torchaudio's kernel
    sf.write(clips["odd_rate"], _tone(4, 16022), 16022, subtype="PCM_16")
    clips["odd_rate_high"] = folder / "odd_rate_high.wav"
    sf.write(clips["odd_rate_high"], _tone(4, 47999), 47999, subtype="PCM_16")
    clips["channels_255"] = folder / "channels_255.wav"  # the header declares 255 channels
    clips["channels_255"].write_bytes(_wav_header(255, 16000, 255 * 2 * 4000) + bytes(255 * 2 * 4000))
    try:
        clips["vorbis_255"] = folder / "vorbis_255.ogg"
        sf.write(clips["vorbis_255"], _tone(0.5, 16000, 255) * 0.01, 16000, format="OGG", subtype="VORBIS")
    except (sf.LibsndfileError, RuntimeError):
        clips.pop("vorbis_255")
    clips["declared_huge"] = folder / "declared_huge.wav"  # 8 channels at 384 kHz for 3 hours, 4 KB present
    clips["declared_huge"].write_bytes(_wav_header(8, 384000, 0xFFFFFF00) + bytes(4096))
    clips["au"] = folder / "fuzzed.au"  # Sun .au: never handed to a decoder
    clips["au"].write_bytes(b".snd" + struct.pack(">IIIII", 24, 0xFFFFFFFF, 3, 8000, 200) + os.urandom(4000))
    clips["rate_absurd"] = folder / "rate_absurd.wav"
    clips["rate_absurd"].write_bytes(_wav_header(1, 2_000_000, 32000) + bytes(32000))
    return clips


_WORKER = """
import json, resource, sys, time
from engine.audio import resample_sinc, resample_soxr, to_mono
from engine.errors import ReferenceAudioError
from engine.reference import ReferenceRules, read_reference, reference_audio_32k, reference_wav16k
import torch
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
resample_sinc(torch.zeros(1, 48000), 44100, 32000)  # the libraries' first-use memory is not a clip's
base, out = peak_mb(), {}
for name, path in json.loads(sys.argv[1]).items():
    start = time.perf_counter()
    try:
        rules = ReferenceRules(fit="trim_pad", silence_dbfs=-200.0, min_active_seconds=0.001,
                               max_clipped_fraction=1.0)
        clip = read_reference(path, rules)
        a32 = reference_audio_32k(clip)
        reference_wav16k(clip)
        resample_sinc(a32, 32000, 16000)
        result = "read"
    except ReferenceAudioError as e:
        result = "refused: " + str(e)
    out[name] = [result, time.perf_counter() - start, peak_mb() - base]
print(json.dumps(out))
"""


def test_hostile_clips_stay_within_memory_and_time(tmp_path) -> None:
    clips = hostile_clips(tmp_path)
    done = subprocess.run([sys.executable, "-c", _WORKER, json.dumps({k: str(v) for k, v in clips.items()})],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (result, seconds, growth_mb) in results.items():
        assert seconds < MAX_SECONDS, (name, result, seconds)
        assert growth_mb < MAX_GROWTH_MB, (name, result, growth_mb)  # the peak only grows: each case is under it
    assert results["odd_rate"][0] == "read" and results["odd_rate_high"][0] == "read"  # resampled, not refused
    assert f"at most {MAX_CHANNELS}" in results["channels_255"][0]
    assert "refused" in results["declared_huge"][0] and "refused" in results["au"][0]
    assert "sample rate" in results["rate_absurd"][0]


def test_odd_rates_resample_through_soxr_and_agree_with_the_sinc_kernel() -> None:
    assert sinc_kernel_size(16022, 32000) > 100_000_000  # what torchaudio would build
    assert sinc_kernel_size(44100, 32000) < 200_000
    out = resample_sinc(torch.from_numpy(_tone(1, 16022)[:, 0])[None], 16022, 32000)
    assert out.shape[0] == 1 and abs(out.shape[-1] - 32000) <= 2
    # a band-limited tone comes out the same as through a standard rate's kernel, within resampler error
    ref = resample_sinc(torch.from_numpy(_tone(1, 16000)[:, 0])[None], 16000, 32000)
    n = min(out.shape[-1], ref.shape[-1]) - 200
    assert float((out[0, 100:n] - ref[0, 100:n]).abs().max()) < 0.05


def test_only_the_four_containers_reach_the_decoder(tmp_path) -> None:
    buf = io.BytesIO()
    sf.write(buf, _tone(0.1, 16000), 16000, format="FLAC")
    assert audio_format(buf.getvalue()[:16]) == "flac"
    assert audio_format(b"RIFF\x00\x00\x00\x00WAVE") == "wav" and audio_format(b"OggS") == "ogg"
    assert audio_format(b"ID3\x04") == "mp3" and audio_format(b"\xff\xfb\x90") == "mp3"
    assert audio_format(b".snd") is None and audio_format(b"FORM") is None
    aiff = tmp_path / "clip.aiff"
    sf.write(aiff, _tone(3.5, 16000), 16000, format="AIFF")
    with pytest.raises(ReferenceAudioError, match="cannot read audio"):
        read_audio(aiff)
    fifo = tmp_path / "fifo.wav"
    os.mkfifo(fifo)
    with pytest.raises(ReferenceAudioError, match="not a regular file"):
        read_audio(fifo)


def test_a_wave_module_file_still_reads(tmp_path) -> None:
    path = tmp_path / "plain.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes((np.zeros((22050, 2)) + 1000).astype("<i2").tobytes())
    audio = read_audio(path)
    assert audio.samples.shape == (2, 22050) and audio.sample_rate == 22050


# ---- issue 32 item 9: the same bytes get the same answer, whatever the file is called -------------------


def _mp3(rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, _tone(3.5, rate), rate, format="MP3", subtype="MPEG_LAYER_III")
    return buf.getvalue()


def _answer(source) -> str:
    try:
        audio = read_audio(source)
    except ReferenceAudioError as e:
        return "refused: " + str(e).split(": ", 1)[1].split(".")[0]
    return f"read {audio.samples.shape} at {audio.sample_rate}"


@pytest.mark.parametrize("case", ["mpeg1", "mpeg2", "mpeg2.5", "bad_first_header", "reserved_layer", "cut"])
def test_an_mp3_without_id3_reads_the_same_from_any_name_and_from_bytes(tmp_path, case) -> None:
    data = {"mpeg1": lambda: _mp3(32000), "mpeg2": lambda: _mp3(16000), "mpeg2.5": lambda: _mp3(8000),
            # a frame sync with a "bad" bitrate, then a whole MP3: on 2f66d90 read from a .mp3 path (libsndfile
            # tries the MP3 decoder on a .mp3 name) and refused as bytes (an upload) or under another name
            "bad_first_header": lambda: b"\xff\xfb\xf0\x00" + _mp3(32000),
            "reserved_layer": lambda: b"\xff\xf1\x50\x80" + _mp3(32000),  # an ADTS (AAC) header looks like a sync
            "cut": lambda: _mp3(32000)[101:]}[case]()
    assert data[:3] != b"ID3"
    answers = {}
    for name in ("clip.mp3", "clip.wav", "clip.bin", "clip"):
        (tmp_path / name).write_bytes(data)
        answers[name] = _answer(tmp_path / name)
    answers["bytes"] = _answer(io.BytesIO(data))
    assert len(set(answers.values())) == 1, answers
    assert answers["bytes"].startswith("read" if case.startswith("mpeg") else "refused"), answers


def test_the_page_and_the_api_agree_on_an_mp3_without_id3(tmp_path) -> None:
    from engine.reference import ReferenceRules, read_reference
    from webui.handlers import describe_reference

    path = tmp_path / "voice.mp3"
    path.write_bytes(b"\xff\xfb\xf0\x00" + _mp3(32000))
    note = describe_reference(str(path), ReferenceRules())  # the page's answer to the upload
    with pytest.raises(ReferenceAudioError):
        read_reference(io.BytesIO(path.read_bytes()))  # what the API and every synthesis decode
    assert note.startswith("⚠"), note  # 2f66d90: "3.50 s at 32000 Hz" on the page, 400 on serve


# ---- issue 32 item 3: one decoding budget for the whole process -------------------------------------------

MIB = 1 << 20


def _surround(seconds: float = 2.0) -> bytes:
    """8 channels at 384 kHz, FLAC: small as a file (a quiet tone), 8 * 4 bytes per frame once decoded."""
    buf = io.BytesIO()
    sf.write(buf, _tone(seconds, 384000, 8) * 0.1, 384000, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def test_a_read_reserves_its_samples_in_a_budget_before_decoding_and_is_refused_beyond_it() -> None:
    from engine.decode_budget import DecodeBudget, DecodeBudgetError
    from engine.errors import BusyError

    clip = _surround(2.0)
    need = 2 * 384000 * 8 * 4  # 23.4 MiB of float32
    budget = DecodeBudget(max_bytes=64 * MIB)
    with budget.reserve(48 * MIB, "another upload"):  # reads under way elsewhere in the process
        with pytest.raises(DecodeBudgetError, match="decode_budget_bytes") as refused:
            read_audio(io.BytesIO(clip), budget=budget)
        assert isinstance(refused.value, BusyError) and refused.value.retry_after > 0  # 503 + Retry-After
        assert budget.in_use == 48 * MIB and budget.peak == 48 * MIB  # refused before a sample was allocated
    fresh = DecodeBudget(max_bytes=64 * MIB)
    audio = read_audio(io.BytesIO(clip), budget=fresh)
    assert audio.samples.shape == (8, 768000) and audio.samples.flags.c_contiguous
    assert fresh.peak == need and fresh.in_use == 0  # held while decoding, given back after
    with pytest.raises(ReferenceAudioError, match="whole decoding budget"):  # can never fit: 400, not 503
        read_audio(io.BytesIO(clip), budget=DecodeBudget(max_bytes=16 * MIB))


def test_every_door_shares_the_process_budget(tmp_path) -> None:
    from engine.decode_budget import DecodeBudgetError, process_decode_budget
    from engine.reference import ReferenceRules, read_reference
    from webui.handlers import describe_reference

    path = tmp_path / "surround.flac"
    path.write_bytes(_surround(4.0))
    budget = process_decode_budget()
    assert budget is process_decode_budget()  # one per process
    with budget.reserve(budget.max_bytes - 16 * MIB, "other uploads"):
        with pytest.raises(DecodeBudgetError):  # the API's and every synthesis's read (bytes)
            read_reference(io.BytesIO(path.read_bytes()), ReferenceRules())
        note = describe_reference(str(path), ReferenceRules())  # the page's read (a path)
        assert "busy" in note, note
    assert budget.in_use == 0
    assert "3.99" in describe_reference(str(path), ReferenceRules()) or "4.00" in describe_reference(
        str(path), ReferenceRules())


# ---- issue 32 item 6: the resampler memo is bounded in bytes ----------------------------------------------


def _live_kernel_bytes() -> int:
    """Bytes of every torchaudio sinc kernel alive in this process (whoever holds it)."""
    import gc

    import torchaudio.transforms as AT

    gc.collect()
    return sum(b.numel() * b.element_size() for m in gc.get_objects() if type(m) is AT.Resample
               for b in m.buffers())


def test_many_odd_rates_keep_at_most_the_resampler_cache_bound(monkeypatch) -> None:
    from engine import audio

    assert audio.RESAMPLER_CACHE_BYTES == 32 << 20  # the default; this test bounds the memo at 8 MiB
    monkeypatch.setattr(audio, "RESAMPLER_CACHE_BYTES", 8 << 20)
    audio.resampler_cache.cache_clear()  # a fresh memo under the test's bound
    near_max = [r for r in range(8000, 96000)
                if audio.MAX_SINC_KERNEL * 0.9 < sinc_kernel_size(r, 32000) <= audio.MAX_SINC_KERNEL]
    x = torch.zeros(1, 4000)
    try:
        for rate in near_max[:4]:  # each kernel about 4 MiB, on the sinc path (under MAX_SINC_KERNEL)
            assert resample_sinc(x, rate, 32000).shape[-1] == math.ceil(4000 * 32000 / rate)
        held = _live_kernel_bytes()
        assert held <= 8 << 20, held / 2**20  # 2f66d90 kept 16 kernels whatever their size (16 MiB here)
        assert audio.resampler_cache().nbytes <= 8 << 20 and len(audio.resampler_cache()) == 2
        assert resample_sinc(x, 44100, 32000).shape[-1] > 0 and (44100, 32000, "cpu") in audio.resampler_cache()
    finally:
        audio.resampler_cache.cache_clear()  # later tests get a memo under the default bound
