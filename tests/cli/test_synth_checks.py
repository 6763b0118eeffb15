"""``sovits-studio synth`` checks every flag before a model loads, and its messages name flags and files
(never a Python class or an object repr); ``inspect`` reads the folder ``make-test-weights`` writes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import soundfile as sf

import tests.support.synth as sup
from studio.cli import main

PYTHON_SPEAK = re.compile(r"object at 0x|BytesIO|ReferenceRules|Traceback|Error\(")


class ModelsLoaded(Exception):
    """Raised where the engine would start loading models."""


@pytest.fixture()
def no_models(monkeypatch):
    """Fail the command if it gets as far as building the engine; the keyword arguments it was built with."""
    from engine.studio import Studio

    seen: dict = {}

    def refuse(cls, config, **kwargs):
        seen.update(kwargs)
        raise ModelsLoaded

    monkeypatch.setattr(Studio, "from_config", classmethod(refuse))
    return seen


def args_for(tmp_path, **change):
    flags = {"--text": "Nice to meet you.", "--text-lang": "en", "--ref": str(sup.ref_file(tmp_path)),
             "--ref-text": sup.REF_TEXT, "--ref-lang": "en", "--out": str(tmp_path / "out.wav"),
             "--config": str(sup.model_config("v2")), "--device": "cpu"}
    flags.update(change)
    argv = ["synth"]
    for flag, value in flags.items():
        if value is True:
            argv.append(flag)
        elif value is not None:
            argv += [flag, value]
    return argv


def test_the_flags_pass_the_checks_and_then_the_models_load(tmp_path, no_models):
    with pytest.raises(ModelsLoaded):
        main(args_for(tmp_path))
    assert no_models["reference_rules"].fit == "error"  # the official rule unless --ref-fit says otherwise


@pytest.mark.parametrize("change,expected", [
    ({"--out": "{tmp}/no/such/folder/out.wav"}, "error: --out: the folder {tmp}/no/such/folder does not exist"),
    ({"--out": "{tmp}"}, "error: --out: {tmp} is a folder"),
    ({"--text-lang": "english"}, "error: --text-lang: language 'english' is not supported; use one of"),
    ({"--ref-lang": "xx"}, "error: --ref-lang: language 'xx' is not supported"),
    ({"--ref-lang": None}, "error: --ref-lang: the transcript's language is missing"),
    ({"--ref-text": None}, "error: --ref-text: the reference clip's transcript is missing: give --ref-text"),
    ({"--ref-text": "  "}, "--ref-free"),
    ({"--ref-free": True}, "error: --ref-text: --ref-free reads no transcript"),
    ({"--gpt": "{tmp}/missing.ckpt"}, "error: --gpt: GPT weights (.ckpt) {tmp}/missing.ckpt does not exist"),
    ({"--sovits": "{tmp}"}, "error: --sovits: SoVITS weights (.pth) {tmp} is a folder"),
    ({"--text": ""}, "error: --text: text is empty"),
    ({"--text": "@{tmp}/absent.txt"}, "error: --text: cannot read the file {tmp}/absent.txt"),
    ({"--top-k": "0"}, "error: --top-k: "),
])
def test_a_bad_flag_is_named_before_any_model_loads(tmp_path, capsys, no_models, change, expected):
    change = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in change.items()}
    assert main(args_for(tmp_path, **change)) == 1  # not ModelsLoaded: refused first
    err = capsys.readouterr().err
    assert expected.format(tmp=tmp_path) in err
    assert not PYTHON_SPEAK.search(err), err
    assert not (tmp_path / "out.wav").exists()


def test_a_text_file_as_the_reference_is_named_without_python_reprs(tmp_path, capsys, no_models):
    notes = tmp_path / "notes.txt"
    notes.write_text("this is not audio\n" * 50, encoding="utf-8")
    assert main(args_for(tmp_path, **{"--ref": str(notes)})) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --ref: cannot read audio from {notes}: ") and "Use a wav" in err
    assert not PYTHON_SPEAK.search(err), err
    aux = args_for(tmp_path) + ["--aux-ref", str(sup.ref_file(tmp_path, "aux.wav")), "--aux-ref", str(notes)]
    assert main(aux) == 1
    assert capsys.readouterr().err.startswith("error: --aux-ref #2: cannot read audio from ")


def test_a_clip_too_long_names_the_flag_that_trims_it(tmp_path, capsys, no_models):
    long_clip = tmp_path / "long.wav"
    rate = 16000
    t = np.arange(rate * 14) / rate
    sf.write(long_clip, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    assert main(args_for(tmp_path, **{"--ref": str(long_clip)})) == 1
    err = capsys.readouterr().err
    assert f"error: --ref: {long_clip} is 14.00 s long (too long)" in err and "--ref-fit trim_pad" in err
    assert not PYTHON_SPEAK.search(err), err
    with pytest.raises(ModelsLoaded):  # the flag it names is accepted and reaches the engine
        main(args_for(tmp_path, **{"--ref": str(long_clip), "--ref-fit": "trim_pad"}))
    assert no_models["reference_rules"].fit == "trim_pad"


def test_the_fit_choices_are_the_engines():
    from engine.reference import FIT_MODES
    from studio.cli.synth import FIT_MODES as CLI_FIT_MODES

    assert CLI_FIT_MODES == FIT_MODES


def test_ref_free_synthesises_without_a_transcript(tmp_path, monkeypatch):
    from engine.studio import Studio

    monkeypatch.setattr(Studio, "from_config", classmethod(lambda cls, config, **kwargs: sup.studio("v2")))
    argv = args_for(tmp_path, **{"--ref-text": None, "--ref-lang": None, "--ref-free": True}) + [
        "--early-stop-num", "8", "--seed", "1"]
    assert main(argv) == 0
    assert sf.info(str(tmp_path / "out.wav")).duration > 0


def test_inspect_reads_the_folder_make_test_weights_writes(capsys):
    folder = sup.model_config("v2").parent
    assert main(["inspect", str(folder), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    kinds = {d["kind"] for d in described}
    assert "error" not in json.dumps([sorted(d) for d in described])
    assert len(described) >= 4 and {"gpt", "sovits"} <= kinds, kinds
    empty = folder.parent / "empty-for-inspect"
    empty.mkdir(exist_ok=True)
    assert main(["inspect", str(empty)]) == 1
    assert "expected a HuBERT, RoBERTa or BigVGAN model folder" in capsys.readouterr().out


@pytest.mark.slow  # a whole process: imports and model loading (about 15 s idle)
def test_synth_prints_no_library_chatter(tmp_path) -> None:
    """A real process (the libraries' settings are per process): no "Loading weights" bars, no jieba
    dictionary messages (--verbose keeps them)."""
    import os
    import subprocess
    import sys

    from tests.support.paths import REPO

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env["PYTHONPATH"] = str(REPO)
    chinese = {"--text": "你好，世界。", "--text-lang": "zh"}
    argv = [sys.executable, "-m", "studio.cli", *args_for(tmp_path, **chinese), "--early-stop-num", "5"]
    quiet = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "wrote " in quiet.stdout
    for chatter in ("Loading weights", "prefix dict", "Loading model"):
        assert chatter not in quiet.stderr, quiet.stderr


def test_saved_voices_default_to_the_users_data_folder(tmp_path, monkeypatch) -> None:
    from studio.cli.bootstrap import voices_folder

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    import sys

    default = voices_folder(None)
    if sys.platform.startswith("linux"):
        assert default == str(tmp_path / "data" / "sovits-studio" / "voices")
    assert not default.startswith(str(tmp_path / "voices")) and "sovits-studio" in default
    assert voices_folder("my-voices") == "my-voices"
