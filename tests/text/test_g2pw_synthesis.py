"""v2+ Mandarin synthesis reads polyphones with G2PW when its model folder is there (the official chinese2.py,
``is_g2pw = True``), and every front door says once when it is not, naming the command that fetches it.

The G2PW folder is the synthetic one of tests/text/test_zh_g2pw.py, run by the same deterministic stand-in for
the ONNX model; the official chinese2 code gave the oracle phones with them (tests/assets/text_zh_g2pw_official.json)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

import tests.support.synth as sup
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.studio import Studio
from engine.text import chinese
from engine.text.chinese.g2pw import G2PWConverter, G2PWTables, correction_files, read_corrections
from engine.text.symbols import cleaned_text_to_sequence
from tests.support.paths import ASSETS
from tests.text.test_zh_g2pw import FOLDER_FILES, ORACLE, fake_scores

CASE = ORACLE["cases"][0]  # 我们一起去银行，看看行长在不在。: 行长 is xing2 chang2 for this model, hang2 zhang3 in pypinyin


@pytest.fixture
def g2pw_folder(tmp_path, monkeypatch):
    """A G2PW folder the engine accepts, with the fake ONNX model standing in for g2pW.onnx."""
    folder = tmp_path / "G2PWModel"
    folder.mkdir()
    for name, content in FOLDER_FILES.items():
        (folder / name).write_text(content, encoding="utf-8")
    shutil.copy(ASSETS / "g2pw_corrections_subset.rep", folder / "polyphonic.rep")

    def from_folder(cls, model_dir, tokenizer_dir, **options):
        from transformers import AutoTokenizer

        return cls(G2PWTables.from_folder(model_dir), AutoTokenizer.from_pretrained(str(tokenizer_dir)), fake_scores,
                   to_traditional=lambda s: s, corrections=read_corrections(correction_files(model_dir)))

    monkeypatch.setattr(G2PWConverter, "from_folder", classmethod(from_folder))
    monkeypatch.setattr(chinese, "missing_g2pw_packages", lambda: [])  # onnxruntime/opencc: the fake needs neither
    return folder


def _phones(studio: Studio) -> tuple[int, ...]:
    opts = SynthesisOptions(seed=1, early_stop_num=10, text_split_method="cut0")
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    return next(iter(studio.synthesize(CASE["text"], "zh", ref, opts))).phones


def _studio(weights) -> Studio:
    shared = sup.studio("v2")
    return Studio(weights, shared.runtime, EngineSettings(scheduler=False, warmup=False), pool=shared.pool)


def test_mandarin_v2_synthesis_reads_polyphones_with_g2pw(g2pw_folder) -> None:
    weights = dataclasses.replace(sup.studio("v2").default_weights, g2pw=g2pw_folder)
    with_g2pw = _studio(weights)
    without = _studio(dataclasses.replace(weights, g2pw=g2pw_folder.parent / "absent"))
    try:
        assert with_g2pw.cloner().models.zh_g2p is not None and without.cloner().models.zh_g2p is None
        got = _phones(with_g2pw)
        assert got == tuple(cleaned_text_to_sequence(CASE["phones"], "v2"))  # the official G2PW reading
        pinyin = _phones(without)
        assert got != pinyin  # 行长 read another way: the G2PW path really ran
        assert pinyin == tuple(cleaned_text_to_sequence(chinese.g2p(CASE["norm_text"], "v2")[0], "v2"))
    finally:
        with_g2pw.close()
        without.close()


def _config(tmp_path, g2pw: str | None, version: str = "v2"):
    """The tiny test config with its active section pointing at ``g2pw`` (None: the official location)."""
    import yaml

    from engine.config import load_config

    data = yaml.safe_load(sup.model_config("v2").read_text(encoding="utf-8"))
    active = dict(data.get("custom") or data["v2"], version=version)
    if g2pw is not None:
        active["g2pw_model_path"] = g2pw
    path = tmp_path / "tts_infer.yaml"
    path.write_text(yaml.safe_dump({"custom": active}), encoding="utf-8")
    return load_config(path, base_dir=tmp_path)


def test_without_g2pw_every_front_door_says_so_once(tmp_path, capsys) -> None:
    import argparse

    from studio.cli.bootstrap import build_studio
    from webui.app import UISettings, _notice

    config = _config(tmp_path, None)
    assert config.g2pw_folder() == tmp_path / "GPT_SoVITS/text/G2PWModel"  # where `download --g2pw` puts it
    args = argparse.Namespace(device="cpu", precision=None)
    studio = build_studio(config, args, scheduler=False, warmup=False)
    err = capsys.readouterr().err
    assert err.count("pypinyin") == 1
    assert f"sovits-studio download --g2pw --root {tmp_path}" in err
    page = _notice(studio, UISettings(), "en")
    # the page names the command but no server path (issue 24: paths never leave the server)
    assert "pypinyin" in page and "sovits-studio download --g2pw --root <model folder>" in page
    assert str(tmp_path) not in page
    assert "pypinyin" in _notice(studio, UISettings(), "zh-CN")


def test_no_notice_with_g2pw_or_for_v1(tmp_path, g2pw_folder, capsys) -> None:
    import argparse

    from studio.cli.bootstrap import build_studio

    args = argparse.Namespace(device="cpu", precision=None)
    build_studio(_config(tmp_path, str(g2pw_folder)), args, scheduler=False, warmup=False)
    build_studio(_config(tmp_path, None, version="v1"), args, scheduler=False, warmup=False)
    assert "pypinyin" not in capsys.readouterr().err


def test_an_incomplete_folder_or_missing_packages_are_named(tmp_path, monkeypatch) -> None:
    (tmp_path / "G2PWModel").mkdir()
    assert "lacks POLYPHONIC_CHARS.txt" in chinese.g2pw_problem(tmp_path / "G2PWModel")
    for name, content in FOLDER_FILES.items():
        (tmp_path / "G2PWModel" / name).write_text(content, encoding="utf-8")
    monkeypatch.setattr(chinese, "missing_g2pw_packages", lambda: ["onnxruntime"])
    assert "pip install onnxruntime" in chinese.g2pw_problem(tmp_path / "G2PWModel")
    assert chinese.g2pw_converter(tmp_path / "G2PWModel", tmp_path) is None  # pypinyin, with the reason logged
