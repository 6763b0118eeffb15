"""``sovits-studio synth`` on tiny v2 weights: the wav written, streaming, options, errors."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

import tests.support.synth as sup
from engine.options import SynthesisOptions, option_names
from studio.cli import build_parser, main


@pytest.fixture()
def shared_studio(monkeypatch):
    """Skip re-loading the models in every command: ``Studio.from_config`` returns the session's v2 studio
    (test_synth_writes_the_wav runs the real loading once)."""
    from engine.studio import Studio

    monkeypatch.setattr(Studio, "from_config", classmethod(lambda cls, config, **kwargs: sup.studio("v2")))


def base_args(tmp_path, out_name="out.wav"):
    ref = sup.ref_file(tmp_path)
    return ["synth", "--config", str(sup.model_config("v2")), "--text", "Nice to meet you. See you soon.",
            "--text-lang", "en", "--ref", str(ref), "--ref-text", sup.REF_TEXT, "--ref-lang", "en",
            "--out", str(tmp_path / out_name), "--early-stop-num", "12", "--seed", "3", "--text-split-method", "cut5",
            "--device", "cpu"]


def test_every_option_is_a_flag_with_the_same_default():
    from engine.options import OPTION_HELP

    assert set(OPTION_HELP) == set(option_names())  # every option has its description, and no stale one
    parser = build_parser("synth")
    text = parser.format_help()
    flags = {a.dest: a for a in parser._actions}
    for name in option_names():
        if name == "streaming_mode":
            assert "--stream" in text
        else:
            assert "--" + name.replace("_", "-") in text, name
            assert flags[name].help.startswith(OPTION_HELP[name]), name
    args = parser.parse_args(["--text", "x", "--text-lang", "en", "--ref", "r.wav", "--out", "o.wav"])
    from studio.cli.synth import _options

    assert _options(args) == SynthesisOptions()  # no flag given: exactly the official defaults
    args = parser.parse_args(["--text", "x", "--text-lang", "en", "--ref", "r.wav", "--out", "o.wav",
                              "--top-k", "5", "--split-bucket", "false", "--stream"])
    assert _options(args) == SynthesisOptions(top_k=5, split_bucket=False, streaming_mode=True)


def test_synth_writes_the_wav(tmp_path, capsys):
    assert main(base_args(tmp_path)) == 0
    audio, rate = sf.read(tmp_path / "out.wav", dtype="int16")
    assert rate == 32000 and audio.ndim == 1 and audio.shape[0] > int(32000 * 0.3)
    out = capsys.readouterr().out
    assert "out.wav" in out and "seed 3" in out
    # the same command gives the same file (here through the session's studio: same weights)
    from engine.studio import Studio

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Studio, "from_config", classmethod(lambda cls, config, **kwargs: sup.studio("v2")))
        assert main(base_args(tmp_path, "again.wav")) == 0
    again, _ = sf.read(tmp_path / "again.wav", dtype="int16")
    np.testing.assert_array_equal(audio, again)


def test_synth_stream_writes_the_chunks(tmp_path, shared_studio):
    args = base_args(tmp_path) + ["--stream", "--min-chunk-length", "4", "--fixed-length-chunk", "true"]
    assert main(args) == 0
    audio, rate = sf.read(tmp_path / "out.wav", dtype="int16")
    assert rate == 32000 and audio.shape[0] > 0
    assert not audio[-int(32000 * 0.3):].any()  # each sentence ends with the fragment silence


@pytest.mark.parametrize("change,message", [
    (["--text-lang", "xx"], "error: --text-lang: language 'xx'"),  # the flag to change, not the engine's name
    (["--top-k", "0"], "error: --top-k: "),
    (["--gpt", "/nonexistent/model.ckpt"], "GPT weights"),
    (["--ref", "/nonexistent/ref.wav"], "not found"),
    (["--text", ""], "text is empty"),
])
def test_synth_errors_are_reported_and_leave_no_file(tmp_path, capsys, change, message, shared_studio):
    assert main(base_args(tmp_path) + change) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.wav").exists()


def test_synth_text_from_file(tmp_path, shared_studio):
    text_file = tmp_path / "text.txt"
    text_file.write_text("Hello from a file.", encoding="utf-8")
    args = base_args(tmp_path)
    args[args.index("--text") + 1] = "@" + str(text_file)
    assert main(args) == 0
    assert sf.info(str(tmp_path / "out.wav")).samplerate == 32000


def test_missing_weights_point_to_download_and_test_weights(tmp_path, capsys):
    config = tmp_path / "tts_infer.yaml"
    config.write_text(sup.model_config("v2").read_text(encoding="utf-8").replace(
        str(sup.model_config("v2").parent), str(tmp_path / "nowhere")), encoding="utf-8")
    args = base_args(tmp_path)
    args[args.index("--config") + 1] = str(config)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "sovits-studio download" in err and "make-test-weights" in err


def test_super_sampling_widens_v3_to_48k_and_says_when_it_cannot(tmp_path, capsys, monkeypatch):
    from engine.acoustic import super_sampling
    from engine.studio import Studio
    from engine.testweights.ap_bwe import write_ap_bwe

    monkeypatch.setattr(Studio, "from_config", classmethod(lambda cls, config, **kwargs: sup.studio("v3")))
    args = base_args(tmp_path) + ["--super-sampling", "true", "--sample-steps", "4"]
    args[args.index("--config") + 1] = str(sup.model_config("v3"))
    monkeypatch.setattr(super_sampling, "OFFICIAL_PATH", tmp_path / "absent" / "g_24kto48k.zip")
    assert main(args) == 0
    assert "needs the AP-BWE model" in capsys.readouterr().err and sf.info(tmp_path / "out.wav").samplerate == 24000
    short = sf.info(tmp_path / "out.wav").duration
    monkeypatch.setattr(super_sampling, "OFFICIAL_PATH", write_ap_bwe(tmp_path / "ap_bwe"))
    for stream in ([], ["--stream"]):
        assert main(args + stream) == 0
        info = sf.info(tmp_path / "out.wav")
        assert info.samplerate == 48000 and abs(info.duration - short) < 0.01, stream  # same speech, twice the rate
    monkeypatch.setattr(Studio, "from_config", classmethod(lambda cls, config, **kwargs: sup.studio("v2")))
    assert main(base_args(tmp_path) + ["--super-sampling", "true"]) == 0
    assert "v3 models only, not v2" in capsys.readouterr().err and sf.info(tmp_path / "out.wav").samplerate == 32000


def test_the_configs_token_cap_bounds_each_sentence_unless_early_stop_num_is_given(tmp_path, shared_studio):
    args = base_args(tmp_path)
    i = args.index("--early-stop-num")
    del args[i:i + 2]  # test weight sets carry max_tokens_per_sentence: 50 in their config
    assert main(args) == 0
    capped = sf.info(tmp_path / "out.wav").duration
    assert 0 < capped <= 2 * (50 / 25 + 0.3) + 0.1  # two sentences of at most 50 tokens (2 s) and their gaps
    assert main(args + ["--early-stop-num", "5"]) == 0
    assert sf.info(tmp_path / "out.wav").duration < capped  # an explicit cap wins
