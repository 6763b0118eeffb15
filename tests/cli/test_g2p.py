"""`sovits-studio g2p`: JSON with phones, phone_ids, word2ph and norm_text, equal to the frontend's answer."""

from __future__ import annotations

import argparse
import json

import pytest

from engine.errors import UnsupportedLanguageError
from engine.text.cleaner import clean_text
from engine.text.symbols import cleaned_text_to_sequence
from studio.cli import g2p


def _run(argv, capsys):
    parser = argparse.ArgumentParser()
    g2p.add_arguments(parser)
    assert g2p.run(parser.parse_args(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_g2p_english_prints_clean_text_result(capsys):
    text = "Hello world, this is a quick test."
    out = _run(["--lang", "en", text], capsys)
    phones, _, norm = clean_text(text, "en", "v2")
    assert out["phones"] == phones and out["norm_text"] == norm and out["word2ph"] is None
    assert out["phone_ids"] == cleaned_text_to_sequence(phones, "v2")


def test_g2p_mandarin_has_word2ph(capsys):
    text = "你好，欢迎使用语音合成系统。"
    out = _run(["--lang", "all_zh", "--version", "v1", text], capsys)
    phones, word2ph, norm = clean_text(text, "zh", "v1")
    assert (out["phones"], out["word2ph"], out["norm_text"]) == (phones, word2ph, norm)


def test_g2p_sentences_mode(capsys):
    out = _run(["--lang", "all_zh", "--sentences", "cut5", "今天天气很好，我们出去玩吧。好的呀，走吧。"], capsys)
    assert isinstance(out, list) and len(out) >= 2 and all(o["phones"] for o in out)


def test_g2p_unsupported_language(capsys):
    parser = argparse.ArgumentParser()
    g2p.add_arguments(parser)
    with pytest.raises(UnsupportedLanguageError):
        g2p.run(parser.parse_args(["--lang", "fr", "bonjour"]))


def test_cli_registers_g2p():
    from studio.cli import SUBCOMMANDS

    assert SUBCOMMANDS["g2p"][0] == "studio.cli.g2p"
