"""A real browser on the page: Debian's chromium driven by playwright uploads the reference, types the
text, presses Generate, and checks that the streamed audio played and the full clip plays with a
plausible length; the page speaks the browser's language and switches on request; the model pickers
flag a GPT and a SoVITS file that do not belong together; text in another language than the chosen
one is flagged. Saves screenshots to $SOVITS_TEST_OUTPUT (default test-output/) and, with
SOVITS_UPDATE_DOCS=1, to docs/webui.png and docs/webui-zh.png. `.ci/run` installs chromium; the
browser only talks to 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.synth import model_config
from tests.webui.test_server import running_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REF = REPO / "assets" / "en_slt_01.wav"
REF_TEXT = "A good reference clip should be clear and calm, with no music or noise in the background."
TEXT = "Hello there. Nice to meet you! How are you today?"
MAX_TOKENS = 10  # per sentence (0.4 s); random weights rarely stop by themselves
OUTPUT = Path(os.environ.get("SOVITS_TEST_OUTPUT", REPO / "test-output"))

if not CHROMIUM.exists():
    pytest.skip("chromium is not installed (`apt-get install chromium`; .ci/run does it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def url():
    from engine.config import load_config
    from engine.studio import Studio
    from studio.http.context import ServerSettings
    from studio.http.limits import ServerLimits
    from webui.app import UISettings
    from webui.models_list import ModelCatalog
    from webui.server import create_webui_app

    path = model_config("v2")
    config = load_config(path, base_dir=path.parent)
    studio = Studio.from_config(config, device="cpu", precision="fp32")
    v1 = model_config("v1").parent / "GPT_SoVITS" / "pretrained_models"  # a GPT that does not fit v2's SoVITS
    app = create_webui_app(studio, config, UISettings(max_tokens_per_sentence=MAX_TOKENS),
                           ServerSettings(limits=ServerLimits(max_tokens_per_sentence=MAX_TOKENS)),
                           catalog=ModelCatalog(path.parent, extra_dirs=(v1,)))
    with running_server(app) as base:
        yield base


@pytest.fixture()
def page(url):
    with browser_page(url, "en-US") as page:
        yield page


@contextmanager
def browser_page(url: str, locale: str, width: int = 1280):
    """A fresh chromium profile whose browser language is ``locale``, on the page, ``width`` px wide."""
    profile = tempfile.mkdtemp(prefix="sovits-chromium-")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True,
                                                       args=CHROMIUM_FLAGS, viewport={"width": width, "height": 1000},
                                                       locale=locale)
        try:  # launch_persistent_context passes the fresh profile folder as --user-data-dir
            page = browser.new_page()
            outside: list[str] = []

            def only_loopback(route):  # the page's CDN/font links never leave the machine
                if route.request.url.startswith(url):
                    return route.continue_()
                outside.append(route.request.url)
                return route.abort()

            page.route("**/*", only_loopback)
            page.goto(url + "/")
            yield page
        finally:
            browser.close()
            shutil.rmtree(profile, ignore_errors=True)


def test_upload_type_generate_and_hear_the_clip(page) -> None:
    page.wait_for_selector("#generate", timeout=60_000)
    page.locator("#ref-audio input[type=file]").set_input_files(str(REF))
    page.wait_for_selector("#ref-info:has-text('5.85 s')", timeout=90_000)
    page.locator("#ref-text textarea").fill(REF_TEXT)
    page.locator("#text textarea").fill(TEXT)
    page.wait_for_selector("#ui-language input[value='en'][aria-checked='true']", timeout=30_000)
    page.get_by_label("How to split the text").click()
    page.get_by_role("option", name="cut5: at every punctuation mark").click()
    page.locator("#generate").click()

    page.wait_for_selector("#status:has-text('Seed')", timeout=240_000)
    # the streamed chunks went to an <audio> element through Gradio's HLS player
    streamed = page.evaluate("() => { const a = document.querySelector('#stream-audio audio');"
                             " return a ? [a.src, a.duration] : null; }")
    assert streamed is not None and streamed[0].startswith("blob:") and streamed[1] > 0
    href = page.locator("#full-audio a[download]").first.get_attribute("href")
    assert href and href.endswith(".wav")
    duration, played = page.evaluate("""async (href) => {
        const a = new Audio(href);
        await new Promise((ok, fail) => { a.onloadedmetadata = ok; a.onerror = () => fail(a.error); });
        await a.play();
        await new Promise(r => setTimeout(r, 400));
        const t = a.currentTime; a.pause();
        return [a.duration, t];
    }""", href)
    sentences = 3
    assert sentences * 0.3 <= duration <= sentences * (MAX_TOKENS * 0.04 + 0.3) + 0.05  # 0.3 s pause each
    assert played > 0  # it really plays
    _screenshot(page, "webui-after-synthesis.png", "webui.png")


def test_an_example_fills_the_form(page) -> None:
    page.wait_for_selector("#generate", timeout=60_000)
    page.get_by_text("en_kumo_01.wav").click()
    page.wait_for_selector("#ref-info:has-text('5.02 s')", timeout=30_000)
    assert page.locator("#ref-text textarea").input_value().startswith("Voice cloning needs only")


def test_the_page_speaks_the_browsers_language_and_switches(url) -> None:
    with browser_page(url, "zh-CN") as page:
        page.wait_for_selector("#generate:has-text('合成')", timeout=60_000)
        page.wait_for_selector("#ui-language input[value='zh-CN'][aria-checked='true']", timeout=30_000)
        assert "要合成的文本" in page.locator("#text").inner_text()
        page.wait_for_selector("#notice:has-text('模型运行于')", timeout=30_000)  # server-written texts too
        page.locator("#ui-language").get_by_text("English").click()
        page.wait_for_selector("#generate:has-text('Generate')", timeout=30_000)
        assert "Text to speak" in page.locator("#text").inner_text()
        page.wait_for_selector("#notice:has-text('Models run on')", timeout=30_000)
        page.locator("#ui-language").get_by_text("日本語").click()
        page.wait_for_selector("#generate:has-text('生成')", timeout=30_000)
        assert page.evaluate("document.documentElement.lang") == "ja"
        page.locator("#ui-language").get_by_text("中文").click()
        page.wait_for_selector("#generate:has-text('合成')", timeout=30_000)
        _screenshot(page, "webui-zh.png", "webui-zh.png")


def test_gradios_own_texts_and_the_clip_prompts_follow_the_switch(url) -> None:
    """Gradio writes its own texts (upload prompts, the recorder's buttons, the players' button titles) once, in
    the language the page opened with; the switch re-words them, also in widgets made after it."""
    with browser_page(url, "en-US") as page:
        page.wait_for_selector("#ref-audio:has-text('Drop Audio Here')", timeout=60_000)
        page.locator("#ref-audio input[type=file]").set_input_files(str(REF))
        page.wait_for_selector("#ref-info:has-text('5.85 s at')", timeout=90_000)
        assert page.locator("#ref-audio button[aria-label='Download']").count() == 1
        page.locator("#ui-language").get_by_text("中文").click()
        page.wait_for_selector("#aux:has-text('将文件拖放到此处')", timeout=30_000)
        aux = page.locator("#aux").inner_text()
        assert "- 或 -" in aux and "点击上传" in aux and "Drop" not in aux and "Click" not in aux, aux
        page.wait_for_selector("#ref-info:has-text('5.85 秒')", timeout=30_000)  # the clip's prompt (server-written)
        assert page.locator("#ref-audio button[aria-label='下载']").count() == 1  # the player's buttons
        page.locator("#ref-audio button[aria-label='清除']").click()
        page.wait_for_selector("#ref-audio:has-text('将音频拖放到此处')", timeout=30_000)  # made again, after the switch
        assert "Drop Audio Here" not in page.locator("#ref-audio").inner_text()
        page.locator("#ref-audio button[aria-label='Record audio']").click()  # the recorder: made after the switch
        page.wait_for_selector("#ref-audio button.record-button:has-text('录制')", timeout=30_000)
        page.locator("#ui-language").get_by_text("English").click()
        page.wait_for_selector("#ref-audio button.record-button:has-text('Record')", timeout=30_000)
        page.wait_for_selector("#aux:has-text('Drop File Here')", timeout=30_000)
        page.locator("#ui-language").get_by_text("日本語").click()
        page.wait_for_selector("#ref-audio button.record-button:has-text('録音')", timeout=30_000)
        page.wait_for_selector("#aux:has-text('ファイルをここにドロップ')", timeout=30_000)
        _screenshot(page, "webui-ja-switched.png", "webui-ja-switched.png")


def test_model_pickers_list_short_names_and_flag_a_pair_that_does_not_belong(page) -> None:
    page.wait_for_selector("#generate", timeout=60_000)
    assert page.locator("#gpt input").input_value().startswith("v2 · ")
    assert page.locator("#sovits input").input_value() == "v2 · s2G2333k.pth"  # no folder, no long path
    assert page.locator("#model-pair").inner_text().strip() == ""
    page.locator("#gpt input").click()
    options = page.get_by_role("option").all_inner_texts()
    assert any("v1 · " in o for o in options) and any("v2 · " in o for o in options)  # (the chosen one has a ✓)
    page.get_by_role("option").filter(has_text="v1 · ").first.click()
    page.wait_for_selector("#model-pair:has-text('do not belong together')", timeout=30_000)
    assert "v1" in page.locator("#model-pair").inner_text()


def test_text_in_another_language_than_the_chosen_one_is_flagged(page) -> None:
    page.wait_for_selector("#generate", timeout=60_000)
    page.locator("#text textarea").fill("你好，欢迎使用语音合成系统。今天天气很好。")
    page.wait_for_selector("#text-lang-note:has-text('looks like')", timeout=30_000)
    note = page.locator("#text-lang-note").inner_text()
    assert "English (en)" in note and "Chinese (all_zh)" in note and "0%" in note
    page.get_by_label("Language of the text").click()
    page.get_by_role("option", name="Chinese (all_zh)").click()
    page.wait_for_function("() => !document.querySelector('#text-lang-note').innerText.trim()", timeout=30_000)


def _screenshot(page, name: str, docs_name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("SOVITS_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, REPO / "docs" / docs_name)
