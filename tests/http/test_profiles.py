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
    with pytest.raises(OptionsError, match="not accepted"):
        store.save("exe", _wav(), "x", "en", suffix=".exe")
    assert store.names() == []


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
