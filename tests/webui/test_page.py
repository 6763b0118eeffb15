"""Web UI handlers and page building, without a server: tiny random weights (v1 and v2 sets), the
shipped example clip as the reference, bounded decoding (random weights rarely say EOS)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.support.paths import REPO
from tests.support.synth import model_config

pytest.importorskip("gradio")

from engine.errors import CheckpointError, OptionsError, ReferenceAudioError, TextError
from engine.options import SynthesisOptions
from engine.reference import ReferenceRules

REF = REPO / "assets" / "en_slt_01.wav"
REF_TEXT = "A good reference clip should be clear and calm, with no music or noise in the background."
MAX_TOKENS = 8  # per sentence: 8 tokens = 0.32 s of audio


def _pretrained(config: Path) -> Path:
    return config.parent / "GPT_SoVITS" / "pretrained_models"


@pytest.fixture(scope="module")
def sets():
    """{version: (config, gpt, sovits)} for a v2 and a v1 set."""
    from engine.testweights import LAYOUT

    out = {}
    for v in ("v2", "v1"):
        cfg = model_config(v)
        out[v] = (cfg, _pretrained(cfg) / LAYOUT[v]["gpt"], _pretrained(cfg) / LAYOUT[v]["sovits"])
    return out


@pytest.fixture(scope="module")
def studio(sets):
    from engine.studio import Studio

    return Studio.from_config(sets["v2"][0], device="cpu", precision="fp32")


def _wav(path: Path, audio: np.ndarray, rate: int = 16000) -> Path:
    sf.write(path, audio.astype(np.float32), rate, subtype="PCM_16")
    return path


def _run(studio, text="Hello there.", gpt=None, sovits=None, on_progress=None, **opts):
    from webui import handlers

    reference = handlers.make_reference(str(REF), REF_TEXT, "en", None)
    options = SynthesisOptions(seed=7, **opts)
    return list(handlers.synthesize(studio, text, "en", reference, options, gpt, sovits, MAX_TOKENS, on_progress))


# ---- the form: defaults exist once ------------------------------------------------------------


def test_every_control_shows_the_dataclass_default_and_maps_back_to_it() -> None:
    from webui import form

    values = {c.name: form.default(c.name) for c in form.CONTROLS}
    assert form.options_from_values(values) == SynthesisOptions()
    assert {c.name for c in form.CONTROLS} >= {"top_k", "top_p", "temperature", "repetition_penalty",
                                                "speed_factor", "seed", "text_split_method"}


def test_widget_values_are_coerced_and_bad_ones_name_the_field() -> None:
    from webui import form

    opts = form.options_from_values({"top_k": 5.0, "seed": 12.0, "sample_steps": "8", "early_stop_num": 0,
                                     "temperature": 1})
    assert (opts.top_k, opts.seed, opts.sample_steps, opts.early_stop_num, opts.temperature) == (5, 12, 8, None, 1.0)
    with pytest.raises(OptionsError, match="top_k"):
        form.options_from_values({"top_k": 2.5})
    with pytest.raises(OptionsError, match="top_p"):
        form.options_from_values({"top_p": 0.0})


# ---- reference clips --------------------------------------------------------------------------


def test_reference_length_is_measured_and_bad_clips_are_explained(tmp_path) -> None:
    from webui.handlers import describe_reference

    rules = ReferenceRules()
    assert describe_reference(str(REF), rules).startswith("✓ 5.85 s")
    t = np.arange(12 * 16000) / 16000
    long = _wav(tmp_path / "long.wav", 0.3 * np.sin(2 * np.pi * 220 * t))
    message = describe_reference(str(long), rules)
    assert "12.00 s long" in message and "3–10 s" in message and "✂ trim" in message  # points to the page's tool
    assert "ReferenceRules" not in message and "fit=" not in message
    assert "剪辑" in describe_reference(str(long), rules, "zh-CN")
    assert "12.00" in describe_reference(str(long), rules, "ja")
    silent = _wav(tmp_path / "silent.wav", np.zeros(4 * 16000))
    message = describe_reference(str(silent), rules)
    assert "silent" in message and "dBFS" not in message and "inf" not in message
    assert "静音" in describe_reference(str(silent), rules, "zh-CN")
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all")
    message = describe_reference(str(text), rules)
    assert "“notes.wav” is not an audio file" in message and "wav, flac, ogg or mp3" in message
    assert str(tmp_path) not in message and "<" not in message and "object at" not in message
    assert describe_reference(None, rules) == ""


def test_engine_errors_read_as_the_pages_user_needs_them() -> None:
    from engine.errors import CheckpointError, OptionsError, ReferenceAudioError, TextError
    from webui.messages import user_message

    files = {"/tmp/gradio/ab12/clip.wav": "ref", "/tmp/gradio/cd34/notes.txt": "aux", "/w/s2G.pth": "gpt",
             "/w/s1.ckpt": "sovits"}
    unreadable = ReferenceAudioError("cannot read audio /tmp/gradio/cd34/notes.txt: Error opening "
                                     "<_io.BytesIO object at 0x7f00aa>: Format not recognised.")
    assert user_message(unreadable, "en", files).startswith("“notes.txt” is not an audio file")
    from_memory = ReferenceAudioError("cannot read audio <_io.BytesIO object at 0x7f00aa>: Format not recognised.",
                                      field="reference.aux_audio[0]")  # the engine read the bytes: the field says
    assert user_message(from_memory, "en", files).startswith("“notes.txt” is not an audio file")
    japanese = user_message(unreadable, "ja", files)
    assert "notes.txt" in japanese and "ファイル" in japanese
    not_gpt = CheckpointError("/w/s2G.pth is not a GPT-SoVITS GPT (.ckpt) file")
    assert "not a GPT model" in user_message(not_gpt, "en", files)
    assert "not a SoVITS model" in user_message(CheckpointError("SoVITS weights /w/s1.ckpt start with unknown bytes"),
                                                "en", files)
    assert "does not exist" in user_message(CheckpointError("sovits_weights '/w/x.pth' does not exist"), "en", {})
    assert user_message(TextError("text is empty"), "zh-CN") == "文本为空：请输入要说的话。"
    odd = user_message(OptionsError("top_k <object object at 0xdeadbeef> out of range"), "en")
    assert "top_k" in odd and "0xdeadbeef" not in odd


def test_every_language_has_every_text_with_the_same_blanks() -> None:
    import string

    from webui import i18n

    table = i18n.translations()
    blanks = {k: {f for _, f, _, _ in string.Formatter().parse(v) if f} for k, v in table["en"].items()}
    for locale in i18n.LOCALES:
        assert set(table[locale]) == set(table["en"]), locale
        for key, value in table[locale].items():
            assert {f for _, f, _, _ in string.Formatter().parse(value) if f} == blanks[key], (locale, key)
    assert i18n.normalize("zh-TW") == "zh-CN" and i18n.normalize("ja-JP") == "ja" and i18n.normalize("fr") == "en"
    from engine.text.frontend import languages
    from webui import form

    needed = {f"lang.{c}" for c in languages("v2")} | {c.name for c in form.CONTROLS} | {
        f"{c.name}.info" for c in form.CONTROLS} | {label for c in form.CONTROLS for label, _ in c.choices
                                                     if not label.isdigit()}
    assert needed <= set(table["en"])


def test_no_reference_clip_is_a_readable_error() -> None:
    from webui.handlers import make_reference

    with pytest.raises(ReferenceAudioError, match="upload or record"):
        make_reference(None, "text", "en", None)


# ---- synthesis ----------------------------------------------------------------------------------


def test_synthesis_streams_chunks_then_the_whole_clip(studio) -> None:
    from engine.reference import Reference
    from engine.results import join

    progress: list[tuple[int, int]] = []
    chunks = _run(studio, "Hello there. Nice to meet you!", text_split_method="cut5", batch_size=1,
                  on_progress=lambda done, total: progress.append((done, total)))
    assert progress == [(1, 2), (2, 2)]  # what the page's progress bar shows
    *pieces, final = chunks
    assert final.final and not any(c.final for c in pieces) and len(pieces) == 2  # one chunk per sentence
    assert all(c.sample_rate == 32000 and c.pcm16.dtype == np.int16 for c in chunks)
    np.testing.assert_array_equal(final.pcm16, np.concatenate([c.pcm16 for c in pieces]))
    assert "Seed **7**" in final.status
    # the same request straight through the engine gives the same samples
    direct = list(studio.synthesize("Hello there. Nice to meet you!", "en", Reference(str(REF), REF_TEXT, "en"),
                                    SynthesisOptions(seed=7, text_split_method="cut5", batch_size=1,
                                                     early_stop_num=MAX_TOKENS)))
    rate, audio = join(direct)
    np.testing.assert_array_equal(final.pcm16, np.clip(audio * 32768.0, -32768, 32767).astype(np.int16))
    # each sentence: at most MAX_TOKENS tokens (640 samples each at 32 kHz for v2) + the 0.3 s pause
    assert 2 * 0.3 < final.pcm16.shape[0] / rate <= 2 * (MAX_TOKENS * 0.04 + 0.3) + 1e-6


def test_each_request_gets_the_weights_it_names(studio, sets) -> None:
    """Two tabs with different models: each request is served by its own set (no global swap)."""
    _, gpt1, sovits1 = sets["v1"]
    v2 = _run(studio)[-1].pcm16
    v1 = _run(studio, gpt=str(gpt1), sovits=str(sovits1))[-1].pcm16
    again = _run(studio)[-1].pcm16
    np.testing.assert_array_equal(v2, again)  # the v1 request changed nothing for the default set
    assert v1.shape != v2.shape or not np.array_equal(v1, v2)
    assert studio.default_weights.gpt == sets["v2"][1]


def test_bad_requests_raise_engine_errors_and_the_next_one_works(studio, sets) -> None:
    _, gpt2, sovits2 = sets["v2"]
    with pytest.raises(TextError, match="empty"):
        _run(studio, text="   ")
    with pytest.raises(CheckpointError):  # a SoVITS file picked in the GPT dropdown
        _run(studio, gpt=str(sovits2))
    with pytest.raises(CheckpointError):  # and a GPT file in the SoVITS dropdown
        _run(studio, sovits=str(gpt2))
    assert _run(studio)[-1].final


def test_a_stopped_request_frees_its_engine_iterator(studio) -> None:
    from webui import handlers

    closed = []

    class Watching:
        """The studio, with the result iterator it hands out watched for close()."""

        default_weights = studio.default_weights

        def synthesize(self, *args, **kwargs):
            results = studio.synthesize(*args, **kwargs)

            def watched():
                try:
                    yield from results
                finally:
                    closed.append(True)
            return watched()

    reference = handlers.make_reference(str(REF), REF_TEXT, "en", None)
    chunks = handlers.synthesize(Watching(), "One. Two. Three.", "en", reference,
                                 SynthesisOptions(seed=1, batch_size=1, text_split_method="cut5"), max_tokens=4)
    assert not next(chunks).final
    chunks.close()  # what Gradio does on Stop or a closed tab
    assert closed == [True]


def test_token_cap_applies_to_requests_without_one(studio) -> None:
    from webui import handlers

    reference = handlers.make_reference(str(REF), REF_TEXT, "en", None)
    chunks = list(handlers.synthesize(studio, "Hello.", "en", reference, SynthesisOptions(seed=1), max_tokens=4))
    assert chunks[-1].pcm16.shape[0] <= 4 * 1280 + int(0.3 * 32000)


# ---- model lists --------------------------------------------------------------------------------


def test_model_lists_show_short_names_with_the_version_each_file_is_for(sets, tmp_path) -> None:
    from webui.models_list import ModelCatalog

    cfg2, gpt2, sovits2 = sets["v2"]
    _, gpt1, sovits1 = sets["v1"]
    catalog = ModelCatalog(cfg2.parent, extra_dirs=(_pretrained(sets["v1"][0]),))
    gpts, sovitses = dict((v, k) for k, v in catalog.choices("gpt")), dict((v, k) for k, v in catalog.choices("sovits"))
    assert set(gpts) == {str(gpt2), str(gpt1)} and set(sovitses) == {str(sovits2), str(sovits1)}
    assert sovitses[str(sovits2)] == "v2 · s2G2333k.pth" and sovitses[str(sovits1)] == "v1 · s2G488k.pth"
    assert gpts[str(gpt1)].startswith("v1 · s1bert25hz-2kh") and gpts[str(gpt2)].startswith("v2 · s1bert25hz-5kh")
    assert [label[:2] for label, _ in catalog.choices("sovits")] == ["v1", "v2"]  # grouped by version
    # a file that is no weight file is left out
    (_pretrained(cfg2) / "broken.pth").write_bytes(b"garbage")
    try:
        assert str(_pretrained(cfg2) / "broken.pth") not in dict((v, k) for k, v in catalog.choices("sovits"))
    finally:
        (_pretrained(cfg2) / "broken.pth").unlink()


def test_a_gpt_files_version_follows_the_official_names_and_folders(sets, tmp_path) -> None:
    import shutil

    from webui.models_list import ModelCatalog, mismatch

    _, gpt2, sovits2 = sets["v2"]
    _, gpt1, _ = sets["v1"]
    (tmp_path / "GPT_weights_v4").mkdir()
    (tmp_path / "deep" / "er" / "still").mkdir(parents=True)
    for target in (tmp_path / "s1v3.ckpt", tmp_path / "GPT_weights_v4" / "mine-e15.ckpt",
                   tmp_path / "deep" / "er" / "still" / "other.ckpt"):
        shutil.copyfile(gpt2, target)
    catalog = ModelCatalog(tmp_path / "nowhere", extra_dirs=(tmp_path,))  # a folder tree, searched in depth
    labels = dict((v, k) for k, v in catalog.choices("gpt"))
    assert labels[str(tmp_path / "s1v3.ckpt")] == "v3/v4/v2Pro/v2ProPlus · s1v3.ckpt"  # not "gpt v2"
    assert labels[str(tmp_path / "GPT_weights_v4" / "mine-e15.ckpt")] == "v4 · mine-e15.ckpt"
    assert labels[str(tmp_path / "deep" / "er" / "still" / "other.ckpt")].startswith("v2/v3/v4")
    s1v3, v1_gpt, v2_sovits = (catalog.describe(p) for p in (tmp_path / "s1v3.ckpt", gpt1, sovits2))
    assert mismatch(s1v3, v2_sovits) is None  # one symbol set: they belong together
    assert mismatch(v1_gpt, v2_sovits) == ("v1",)


def test_a_pair_that_does_not_belong_together_is_named(sets) -> None:
    from webui import handlers
    from webui.models_list import ModelCatalog

    cfg2, gpt2, sovits2 = sets["v2"]
    _, gpt1, _ = sets["v1"]
    catalog = ModelCatalog(cfg2.parent, extra_dirs=(_pretrained(sets["v1"][0]),))
    assert handlers.pair_note(catalog, str(gpt2), str(sovits2)) == ""
    note = handlers.pair_note(catalog, str(gpt1), str(sovits2))
    assert "do not belong together" in note and gpt1.name in note and "s2G2333k.pth" in note
    assert "不配套" in handlers.pair_note(catalog, str(gpt1), str(sovits2), "zh-CN")
    assert handlers.pair_note(catalog, "/nowhere.ckpt", str(sovits2)) == ""


# ---- missing weights ----------------------------------------------------------------------------


def test_missing_weights_are_listed_and_the_download_explains_itself_offline(tmp_path, monkeypatch) -> None:
    from engine.config import load_config
    from engine.loading import download
    from engine.loading.model_pool import WeightSet
    from webui import handlers

    config = load_config(REPO / "configs" / "tts_infer.yaml", base_dir=tmp_path)
    missing = handlers.missing_weights(config, WeightSet.from_config(config))
    assert set(missing) == {"t2s_weights_path", "vits_weights_path", "bert_base_path", "cnhuhbert_base_path"}
    report = handlers.missing_report(missing, "v2", root=tmp_path)
    assert "`GPT_SoVITS/pretrained_models/gsv-v2final-pretrained/s2G2333k.pth`" in report
    assert "Download the official weights" in report
    assert "sovits-studio download --version v2" in report and "model folder" in report
    assert str(tmp_path) not in report and str(tmp_path.resolve()) not in report  # no server path on the page
    assert "缺少模型文件" in handlers.missing_report(missing, "v2", "zh-CN", root=tmp_path)
    assert handlers.shown_path("/elsewhere/models/s1.ckpt", tmp_path) == "…/s1.ckpt"  # outside the root: its name

    class OfflineHub:
        def hf_hub_download(self, **_):
            raise ConnectionError("no network in tests")

    monkeypatch.setattr(download, "_hub", lambda: OfflineHub())
    message = handlers.download_weights(tmp_path, "v2")
    assert message.startswith("The download did not complete") and "cannot be reached" in message
    # as the CLI says it, the weight root named, not shown
    assert "sovits-studio download --version v2 --root <model folder> --check" in message
    assert str(tmp_path) not in message and str(tmp_path.resolve()) not in message
    assert "s2G2333k.pth" in message and not (tmp_path / "GPT_SoVITS" / "pretrained_models" / "s2G2333k.pth").exists()


def test_the_page_builds_with_missing_weights(tmp_path) -> None:
    from engine.config import load_config
    from engine.studio import Studio
    from webui.app import build_ui

    config = load_config(REPO / "configs" / "tts_infer.yaml", base_dir=tmp_path)
    studio = Studio.from_config(config, device="cpu", precision="fp32")
    demo = build_ui(studio, config=config)
    page = demo.get_config_file()
    markdown = [c["props"].get("value") or "" for c in page["components"] if c["type"] == "markdown"]
    assert any("Weights are missing" in m and "s2G2333k.pth" in m for m in markdown)
    assert "generate" in {d.get("api_name") for d in page["dependencies"]}


# ---- server pieces ------------------------------------------------------------------------------


def test_auth_accepts_a_pair_or_a_file(tmp_path) -> None:
    from engine.errors import ConfigError
    from webui.server import parse_auth

    assert parse_auth("ann:secret:with:colons") == [("ann", "secret:with:colons")]
    f = tmp_path / "users.txt"
    f.write_text("# users\nann:one\n\nbob:two\n")
    assert parse_auth(str(f)) == [("ann", "one"), ("bob", "two")]
    with pytest.raises(ConfigError, match="USER:PASS"):
        parse_auth("nopassword")


def test_share_link_or_the_reason_there_is_none(monkeypatch) -> None:
    import gradio.networking

    from studio.cli.webui import _share_link

    monkeypatch.setattr(gradio.networking, "setup_tunnel", lambda *a: "https://abc.gradio.live")
    assert _share_link("127.0.0.1", 9872, protected=True) == "Public link (72 h): https://abc.gradio.live"
    assert "--auth" in _share_link("127.0.0.1", 9872, protected=False)

    def offline(*_):
        raise RuntimeError("Could not get share link from Gradio API Server.")

    monkeypatch.setattr(gradio.networking, "setup_tunnel", offline)
    message = _share_link("127.0.0.1", 9872, protected=True)
    assert message.startswith("warning: no share link") and "still served locally" in message


def test_streamed_chunks_encode_without_an_ffmpeg_program(monkeypatch) -> None:
    """One PyAV encoder per stream: chunks of any length in, whole ADTS frames out, nothing lost."""
    import av

    from webui.streaming_audio import PyAVAacStream, split_adts

    monkeypatch.setenv("PATH", "")  # no ffmpeg program can be found
    stream = PyAVAacStream(32000, 1)
    tone = (3000 * np.sin(np.arange(48000) / 10.0)).astype("<i2")
    frames = []
    for piece in np.array_split(tone, 3):  # 16000 samples each: not a multiple of the 1024 of a frame
        stream.feed(piece.tobytes())
        frames += stream.take()
    frames += stream.flush()
    assert frames and all(f[:2] == b"\xff\xf1" for f in frames)  # ADTS sync word, MPEG-4 AAC
    assert split_adts(b"".join(frames)) == frames
    assert len(frames) * stream.frame_duration == pytest.approx(48000 / 32000, abs=3 * 1024 / 32000)
    container = av.open(io.BytesIO(b"".join(frames)))
    decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert abs(len(decoded) - 48000) <= 3 * 1024 and np.abs(decoded).max() > 0.05  # the tone, not silence


def test_importing_the_ui_writes_nothing_into_the_tree() -> None:
    code = "import webui.app, webui.server"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
    assert not list((REPO / "webui").glob("*.pyi"))


def test_without_the_webui_extra_the_command_says_what_to_install(tmp_path) -> None:
    code = ("import sys; sys.modules['gradio'] = None\n"  # as if the [webui] extra were not installed
            "from studio.cli import main\n"
            f"sys.exit(main(['webui', '--config', {str(REPO / 'configs' / 'tts_infer.yaml')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and "pip install -e '.[webui]'" in done.stderr and "Traceback" not in done.stderr


def test_v3_super_sampling_widens_the_whole_clip_once(tmp_path) -> None:
    from engine.acoustic.super_sampling import SuperSamplerStore
    from engine.results import Result
    from engine.testweights.ap_bwe import write_ap_bwe
    from webui import handlers

    class TwoSentences:  # what a v3 model set yields: 24 kHz pieces
        def synthesize(self, *args, **kwargs):
            tone = (0.2 * np.sin(np.arange(12000) / 5.0)).astype(np.float32)
            return (Result(tone, 24000, "a", (), i, i, i == 1, 3) for i in range(2))

    store = SuperSamplerStore(tmp_path / "tools" / "AP_BWE_main" / "24kto48k" / "g_24kto48k.zip")
    assert store.get() is None  # not there yet: the page says where it belongs
    write_ap_bwe(store.path.parent)
    chunks = list(handlers.synthesize(TwoSentences(), "a. b.", "en", None, SynthesisOptions(super_sampling=True),
                                      super_sampler=store.get()))
    *pieces, final = chunks
    assert [c.sample_rate for c in pieces] == [24000, 24000]  # the streamed preview keeps the model's rate
    assert final.sample_rate == 48000 and abs(final.pcm16.shape[0] - 48000) <= 16 and "48 kHz" in final.status
    assert store.get() is store.get()  # loaded once


def test_make_test_weights_prints_the_webui_command_and_caps_its_sentences(tmp_path, capsys) -> None:
    import shlex

    from engine.config import load_config
    from engine.studio import Studio
    from studio.cli import main
    from webui.app import UISettings, build_ui

    assert main(["make-test-weights", str(tmp_path / "try it"), "--version", "v1"]) == 0
    out = capsys.readouterr().out
    config_path = tmp_path / "try it" / "tts_infer.yaml"
    assert f"sovits-studio webui --config {shlex.quote(str(config_path))}" in out  # the exact next step
    config = load_config(config_path)
    assert config.active.max_tokens_per_sentence == 50 and config.active.random_weights
    studio = Studio.from_config(config, device="cpu", precision="fp32")
    settings = UISettings(max_tokens_per_sentence=config.active.max_tokens_per_sentence, random_weights=True)
    page = build_ui(studio, config=config, settings=settings).get_config_file()
    notice = next(c["props"]["value"] for c in page["components"] if c["props"].get("elem_id") == "notice")
    assert "random-weight test model" in notice and "50 tokens (2 s)" in notice


def test_a_page_synthesis_stops_at_the_time_limit_and_its_work_with_it() -> None:
    import asyncio
    import threading
    import time

    from studio.http.runner import SynthesisRunner
    from webui.app import _until

    made, stopped = [], threading.Event()

    def slow(n=100):
        try:
            for i in range(n):
                time.sleep(0.05)
                made.append(i)
                yield i
        finally:
            stopped.set()

    async def read(seconds, n=100):
        got = []
        stream = await SynthesisRunner(1, 0).stream(lambda: slow(n))
        async for item in _until(stream, seconds):
            got.append(item)
        return got

    with pytest.raises(TimeoutError):
        asyncio.run(read(0.3))
    assert stopped.wait(2) and len(made) < 20  # the producer stopped soon after the limit
    assert asyncio.run(read(None, 3)) == [0, 1, 2] and asyncio.run(read(5.0, 3)) == [0, 1, 2]
