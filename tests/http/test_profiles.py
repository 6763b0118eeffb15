"""Saved voice profiles: round trip, name validation, no paths outside a profile's folder, size caps."""

from __future__ import annotations

import json

import pytest

from engine.errors import OptionsError, ReferenceAudioError
from studio.http.profiles import ProfileExistsError, ProfileNotFoundError, ProfileStore


def _wav(seconds: float = 3.5, sr: int = 16000) -> bytes:
    """A clip that passes the reference checks (3-10 s of voiced-sounding audio)."""
    from tests.support.server import reference_wav

    return reference_wav(1, seconds=seconds, sr=sr)


def test_save_get_list_delete(tmp_path) -> None:
    store = ProfileStore(tmp_path / "voices")
    assert store.names() == []
    p = store.save("alice_01", _wav(), "你好世界。", "zh")
    assert p.audio_path.read_bytes() == _wav() and p.prompt_lang == "zh" and p.prompt_text == "你好世界。"
    assert store.get("alice_01") == p and store.names() == ["alice_01"] and store.list() == [p]
    with pytest.raises(ProfileExistsError):
        store.save("alice_01", _wav(), "x", "en")
    store.save("alice_01", _wav(4.0), "hello.", "en", overwrite=True)
    assert store.get("alice_01").prompt_lang == "en"
    store.delete("alice_01")
    with pytest.raises(ProfileNotFoundError, match="no saved voice named 'alice_01'"):
        store.get("alice_01")
    assert not any((tmp_path / "voices").iterdir())  # no staging leftovers


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x" * 65, "a b", "..", "con.", "a\\b"])
def test_bad_names_are_refused(tmp_path, name) -> None:
    store = ProfileStore(tmp_path)
    with pytest.raises(OptionsError, match="voice: .* is not a valid voice name"):
        store.get(name)
    with pytest.raises(OptionsError, match="not a valid voice name"):
        store.save(name, _wav(), "x", "en")


def test_bad_uploads_are_refused(tmp_path) -> None:
    store = ProfileStore(tmp_path, max_audio_bytes=200_000)
    with pytest.raises(OptionsError, match="audio: the clip is .* bytes; the limit is 200000"):
        store.save("big", _wav(9.0), "x", "en")
    with pytest.raises(ReferenceAudioError, match="cannot read audio") as info:
        store.save("junk", b"not audio at all", "x", "en")
    assert info.value.field == "audio"
    with pytest.raises(ReferenceAudioError, match="too short") as info:  # the reference rules, as a request's clip
        store.save("short", _wav(1.0), "x", "en")
    assert info.value.field == "audio"
    with pytest.raises(OptionsError, match="prompt_lang: 'klingon'"):
        store.save("lang", _wav(), "x", "klingon")
    assert store.names() == []
    store.save("named_oddly", _wav(), "x", "en", suffix=".exe")  # the bytes decide, as on every other door
    assert store.get("named_oddly").audio_path.name == "reference.wav"


def _with_junk(wav: bytes, junk_bytes: int) -> bytes:
    """``wav`` with a RIFF ``JUNK`` chunk of ``junk_bytes`` between its fmt and data chunks."""
    import struct

    data_at = wav.index(b"data")
    body = wav[12:data_at] + b"JUNK" + struct.pack("<I", junk_bytes) + bytes(junk_bytes) + wav[data_at:]
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def test_a_saved_voice_keeps_only_the_audio(tmp_path) -> None:
    import io

    import numpy as np

    from engine.reference import read_reference

    upload = _with_junk(_wav(), 19 << 20)  # 19 MiB of junk around a 3.5 s clip of 110 KiB
    store = ProfileStore(tmp_path / "voices")
    saved = store.save("junk", upload, "hello.", "en")
    size = sum(p.stat().st_size for p in (tmp_path / "voices" / "junk").iterdir())
    assert size < 200_000, size  # 2f66d90 stored the upload as it came: 19.1 MiB
    as_uploaded, as_saved = read_reference(io.BytesIO(upload)), read_reference(saved.audio_path)
    assert np.array_equal(as_uploaded.audio, as_saved.audio) and as_uploaded.sample_rate == as_saved.sample_rate
    stereo = io.BytesIO()  # a float stereo clip: its mono mix-down, exactly, as float
    import soundfile as sf

    left = sf.read(io.BytesIO(_wav()), dtype="float32")[0]
    sf.write(stereo, np.stack([left, left * 0.5], axis=1), 16000, format="WAV", subtype="FLOAT")
    mixed = store.save("stereo", stereo.getvalue(), "hello.", "en")
    assert np.array_equal(read_reference(mixed.audio_path).audio, read_reference(io.BytesIO(stereo.getvalue())).audio)


def test_saved_voices_have_a_quota_in_count_and_in_bytes(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = ProfileStore(tmp_path / "voices", max_profiles=3)
    with ThreadPoolExecutor(6) as pool:  # parallel saves cannot overshoot the count
        outcomes = list(pool.map(lambda i: _outcome(store.save, f"v{i}", _wav(), "hi.", "en"), range(6)))
    assert outcomes.count("saved") == 3 and len(store.names()) == 3, outcomes
    assert all("max_profiles" in o for o in outcomes if o != "saved")
    first, second = store.names()[:2]  # which three were saved depends on the threads
    store.save(first, _wav(4.0), "hello.", "en", overwrite=True)  # replacing one keeps the count
    one = sum(p.stat().st_size for p in (tmp_path / "voices" / second).iterdir())
    small = ProfileStore(tmp_path / "small", max_bytes=int(2.5 * one))
    assert [_outcome(small.save, f"s{i}", _wav(), "hi.", "en") for i in range(3)][:2] == ["saved", "saved"]
    assert "max_profiles_bytes" in _outcome(small.save, "s9", _wav(), "hi.", "en")
    assert sum(p.stat().st_size for p in (tmp_path / "small").rglob("*") if p.is_file()) <= int(2.5 * one)


def _outcome(fn, *args) -> str:
    try:
        fn(*args)
    except OptionsError as e:
        return str(e)
    return "saved"


def test_a_profile_cannot_point_outside_its_folder(tmp_path) -> None:
    secret = tmp_path / "secret.wav"
    secret.write_bytes(_wav())
    folder = tmp_path / "voices" / "evil"
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text(json.dumps({"audio": "../../secret.wav", "prompt_lang": "en"}))
    with pytest.raises(OptionsError, match="plain file name inside the profile folder"):
        ProfileStore(tmp_path / "voices").get("evil")
    (folder / "profile.json").write_text("{broken")
    with pytest.raises(OptionsError, match="not valid JSON"):
        ProfileStore(tmp_path / "voices").get("evil")
    assert ProfileStore(tmp_path / "voices").list() == []  # listings skip broken folders
