"""The optional G2PW Mandarin path: model-input preparation, context windows, dedup, bopomofo -> pinyin and the
official correction dictionary, against outputs of the official chinese2 G2PW code run with the same synthetic
model folder and the same deterministic stand-in for the ONNX model (no onnxruntime needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.errors import CheckpointError
from engine.testweights.roberta import write_tokenizer_files
from engine.text import chinese
from engine.text.chinese import ChineseG2P
from engine.text.chinese.g2pw import (
    G2PWConverter,
    G2PWTables,
    correct_pronunciation,
    correction_files,
    read_corrections,
)
from tests.support.paths import ASSETS

ORACLE = json.loads((ASSETS / "text_zh_g2pw_official.json").read_text(encoding="utf-8"))

FOLDER_FILES = {
    "POLYPHONIC_CHARS.txt": "行\tㄏㄤ2\n行\tㄒㄧㄥ2\n长\tㄔㄤ2\n长\tㄓㄤ3\n重\tㄓㄨㄥ4\n重\tㄔㄨㄥ2\n得\tㄉㄜ2\n得\tㄉㄜ5\n"
    "得\tㄉㄟ3\n一\tㄧ1\n一\tㄧ2\n还\tㄏㄞ2\n还\tㄏㄨㄢ2\n了\tㄌㄜ5\n了\tㄌㄧㄠ3\n",
    "MONOPHONIC_CHARS.txt": "你\tㄋㄧ3\n们\tㄇㄣ5\n似\tㄙ4\n",
    "bopomofo_to_pinyin_wo_tune_dict.json": json.dumps({
        "ㄏㄤ": "hang", "ㄒㄧㄥ": "xing", "ㄔㄤ": "chang", "ㄓㄤ": "zhang", "ㄓㄨㄥ": "zhong", "ㄔㄨㄥ": "chong",
        "ㄉㄜ": "de", "ㄉㄟ": "dei", "ㄋㄧ": "ni", "ㄇㄣ": "men", "ㄧ": "yi", "ㄙ": "si", "ㄏㄞ": "hai",
        "ㄏㄨㄢ": "huan", "ㄌㄜ": "le", "ㄌㄧㄠ": "liao"}, ensure_ascii=False),
    "char_bopomofo_dict.json": "{}",
    "config.py": "model_source = 'bert-base-chinese'\nuse_mask = True\nuse_char_phoneme = False\nwindow_size = 32\n",
    "g2pW.onnx": "",
}


def fake_scores(inputs):
    """A deterministic stand-in for g2pW.onnx: scores from the token ids, char id, position and label index,
    masked by the phoneme mask (the same function produced the oracle through the official code)."""
    ids = inputs["input_ids"].astype(np.int64)
    base = (ids.sum(axis=1) * 31) % 97  # (b_text,)
    b = inputs["char_ids"].shape[0]
    base = np.broadcast_to(base, (b,)) if base.shape[0] == 1 else base
    j = np.arange(inputs["phoneme_mask"].shape[1])
    score = 1 + (base[:, None] + inputs["char_ids"][:, None] * 7 + inputs["position_ids"][:, None] * 13
                 + j[None] * 17) % 97
    return (inputs["phoneme_mask"] * score).astype(np.float32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("G2PWModel")
    for name, content in FOLDER_FILES.items():
        (d / name).write_text(content, encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def converter(model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    bert = write_tokenizer_files(tmp_path_factory.mktemp("roberta"))
    calls = []

    def predictor(inputs):
        calls.append({k: v.shape for k, v in inputs.items()})
        return fake_scores(inputs)

    # the official correction dictionary is the user's (not shipped); these are its entries for the oracle texts
    corrections = read_corrections([ASSETS / "g2pw_corrections_subset.rep"])
    conv = G2PWConverter(G2PWTables.from_folder(model_dir), AutoTokenizer.from_pretrained(str(bert)), predictor,
                         to_traditional=lambda s: s, corrections=corrections)
    conv.calls = calls
    return conv


@pytest.fixture(scope="module")
def zh_g2pw(converter):
    return ChineseG2P(erhua=True, g2pw=converter)


@pytest.mark.parametrize("case", ORACLE["cases"], ids=lambda c: c["text"][:10])
def test_g2pw_path_matches_official(case, zh_g2pw):
    norm = chinese.normalize(case["text"])
    assert norm == case["norm_text"]
    phones, word2ph = chinese.g2p(norm, "v2", zh_g2pw)
    assert phones == case["phones"]
    assert word2ph == case["word2ph"]


def test_identical_contexts_share_one_text_row(converter):
    converter.calls.clear()
    converter.predict(["行行行"])  # three queries, one context text
    assert converter.calls[-1]["input_ids"][0] == 1 and converter.calls[-1]["char_ids"] == (3,)


def test_tables_drop_non_polyphonic_and_non_monophonic(model_dir):
    t = G2PWTables.from_folder(model_dir)
    assert "一" not in t.polyphonic and "行" in t.polyphonic  # 一 is in the official non_polyphonic list
    assert "似" not in t.monophonic and t.monophonic["你"] == "ㄋㄧ3"
    assert t.labels == tuple(sorted(t.labels))


def test_correction_dictionary(tmp_path):
    (tmp_path / "polyphonic.rep").write_text("湖泊: ['hu2','po1']\n行: ['xing2']\n", encoding="utf-8")
    (tmp_path / "polyphonic-fix.rep").write_text("湖泊: ['hu2', 'bo2']\n", encoding="utf-8")
    table = read_corrections(correction_files(tmp_path / "G2PWModel") or correction_files(tmp_path))
    assert correct_pronunciation("湖泊", ["x", "y"], table) == ["hu2", "bo2"]  # the later file wins
    assert correct_pronunciation("行人", ["hang2", "ren2"], table) == ["xing2", "ren2"]
    assert correct_pronunciation("qq", ["a", "b"], table) == ["a", "b"]
    (tmp_path / "polyphonic.rep").write_text("湖泊 = hu2\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="polyphonic.rep:1"):
        read_corrections([tmp_path / "polyphonic.rep"])


def test_missing_model_folder_says_what_to_install(tmp_path):
    with pytest.raises(CheckpointError, match="G2PWModel_1.1.zip"):
        G2PWConverter.from_folder(tmp_path / "nope", tmp_path)
    (tmp_path / "POLYPHONIC_CHARS.txt").write_text("行\tㄏㄤ2\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="MONOPHONIC_CHARS.txt"):
        G2PWConverter.from_folder(tmp_path, tmp_path)


def test_missing_packages_are_named(model_dir, tmp_path):
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is not None:
        pytest.skip("onnxruntime is installed")
    with pytest.raises(CheckpointError, match="pip install onnxruntime"):
        G2PWConverter.from_folder(model_dir, tmp_path)


def test_make_g2p_falls_back_or_fails_as_asked(model_dir, tmp_path):
    import importlib.util

    assert chinese.make_g2p("v2").g2pw is None
    assert chinese.make_g2p("v1").erhua is False
    with pytest.warns(UserWarning, match="pypinyin"):
        assert chinese.make_g2p("v2", tmp_path / "absent", tmp_path).g2pw is None
    with pytest.raises(CheckpointError):
        chinese.make_g2p("v2", tmp_path / "absent", tmp_path, require_g2pw=True)
    if importlib.util.find_spec("onnxruntime") is None:
        with pytest.raises(CheckpointError, match="onnxruntime"):
            chinese.make_g2p("v2", model_dir, tmp_path, require_g2pw=True)


def test_cli_g2pw_option_reports_missing_model(tmp_path):
    import argparse

    from studio.cli import g2p

    parser = argparse.ArgumentParser()
    g2p.add_arguments(parser)
    with pytest.raises(CheckpointError, match="G2PW"):
        g2p.run(parser.parse_args(["--lang", "all_zh", "--g2pw", str(tmp_path), "你好"]))


def test_the_test_tokenizer_reads_every_character_as_itself(tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(write_tokenizer_files(tmp_path)))
    assert tokenizer.tokenize("我们去银行,") == ["我", "们", "去", "银", "行", ","]
