"""The page in chromium, as a newcomer reads it: the progress line stays up for the whole of a long
synthesis (sentence n of N, elapsed and remaining time; whole-file and streamed), every label and
help text of the settings panels is shown whole in each of the page's languages, and the Advanced panel
reads in plain words and works on a phone (420 px)."""

from __future__ import annotations

import time

import pytest

from tests.support.synth import model_config
from tests.webui.test_browser import CHROMIUM, REF, REF_TEXT, browser_page
from tests.webui.test_server import running_server

if not CHROMIUM.exists():
    pytest.skip("chromium is not installed (`apt-get install chromium`; .ci/run does it)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")

MAX_TOKENS = 6
SENTENCE_S = 0.6  # each sentence is held this long: a long run on tiny weights
SENTENCES = 8
LONG_TEXT = " ".join(f"This is sentence number {n}." for n in range(1, SENTENCES + 1))


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
    synthesize = studio.synthesize

    def slowly(*args, **kwargs):  # every piece takes a while, as real sentences do on a busy CPU
        for result in synthesize(*args, **kwargs):
            time.sleep(SENTENCE_S)
            yield result

    studio.synthesize = slowly
    app = create_webui_app(studio, config, UISettings(max_tokens_per_sentence=MAX_TOKENS),
                           ServerSettings(limits=ServerLimits(max_tokens_per_sentence=MAX_TOKENS)),
                           catalog=ModelCatalog(path.parent))
    with running_server(app) as base:
        yield base


def _fill(page) -> None:
    page.wait_for_selector("#generate", timeout=60_000)
    page.locator("#ref-audio input[type=file]").set_input_files(str(REF))
    page.wait_for_selector("#ref-info:has-text('5.85 s')", timeout=90_000)
    page.locator("#ref-text textarea").fill(REF_TEXT)
    page.locator("#text textarea").fill(LONG_TEXT)
    page.get_by_label("How to split the text").click()
    page.get_by_role("option", name="cut5: at every punctuation mark").click()


# Gradio's own progress overlays (status trackers) over the outputs that can be seen: their texts
OVERLAYS = """() => [...document.querySelectorAll(
    '#stream-audio [data-testid=status-tracker], #full-audio [data-testid=status-tracker], #status [data-testid=status-tracker]')]
  .filter(w => !w.classList.contains('hide') && getComputedStyle(w).opacity !== '0' && w.getBoundingClientRect().height > 0)
  .map(w => w.innerText.trim() || w.className)"""


def _sample_progress(page, overlays: list | None = None) -> list[tuple[float, str]]:
    """(seconds since Generate, #status text) every 0.1 s until the seed of the finished run shows; the
    Gradio overlays seen meanwhile go to ``overlays``."""
    samples, start = [], time.monotonic()
    page.locator("#generate").click()
    while time.monotonic() - start < 240:
        text = page.evaluate("() => (document.querySelector('#status') || {}).innerText || ''")
        samples.append((time.monotonic() - start, text.strip()))
        if "Seed" in text:
            return samples
        if overlays is not None:
            overlays.extend(page.evaluate(OVERLAYS))
        time.sleep(0.1)
    raise AssertionError(f"the run did not finish: {samples[-5:]}")


def _seconds(clock: str) -> int:
    parts = [int(p) for p in clock.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


@pytest.mark.parametrize("streamed", [False, True], ids=["whole-file", "streamed"])
def test_progress_stays_up_for_the_whole_synthesis(url, streamed) -> None:
    with browser_page(url, "en-US") as page:
        _fill(page)
        if streamed:
            page.locator("text=Advanced").first.click()
            page.get_by_label("Play in small chunks").check()
        overlays: list = []
        samples = _sample_progress(page, overlays)
    assert overlays == []  # one progress display: no Gradio overlay came and went over the outputs
    running = [(t, s) for t, s in samples[:-1] if t > 0.3]  # the first moments: the click reaching the server
    assert len(running) >= 20, samples  # a long run: several seconds of samples
    shown = [s for _, s in running if "elapsed" in s]
    assert len(shown) >= 0.95 * len(running), [s for _, s in running if "elapsed" not in s]
    counts = [s for s in shown if f"of {SENTENCES}" in s]
    assert counts, shown
    current = [int(s.split("Sentence ")[1].split(" of")[0]) for s in counts if "Sentence " in s]
    # it counts up through the run (on a loaded machine a sample may miss a sentence or two)
    assert current == sorted(current) and len(set(current)) >= 3 and current[-1] >= SENTENCES - 1, current
    assert any("left" in s and "?" not in s for s in counts), counts  # an estimate of the time left
    elapsed = {s.split(" elapsed")[0].split("· ")[-1] for s in shown}
    assert len(elapsed) >= 3, elapsed  # the clock moves between the sentences too
    clock = [_seconds(s.split(" elapsed")[0].split("· ")[-1]) for s in shown]
    assert clock == sorted(clock), clock  # one timer for the whole run: it never starts again
    assert all(s.count("▰") + s.count("▱") == 20 for s in shown), shown  # one bar, from the first moment


# Every text of a panel, whole: not cut by an ancestor that clips, not wider than its box, not squeezed
# into a column a few characters wide (at most 4 lines), not broken inside a word.
TEXTS_SHOWN_WHOLE = """(panel) => {
  const bad = [];
  const root = document.querySelector(panel);
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const el = node.parentElement;
    if (!text || !el || el.closest('input, textarea, select, option, ul[role=listbox]')) continue;
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden' || el.offsetParent === null) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter(r => r.width > 0);
    if (!rects.length) { bad.push([text, 'not shown']); continue; }
    const lineHeight = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.3;
    const lines = new Set(rects.map(r => Math.round(r.top / (lineHeight / 2)))).size;
    if (text.length >= 12 && lines > 4) bad.push([text, `${lines} lines`]);
    if (el.scrollWidth > el.clientWidth + 1 && style.overflow !== 'visible') bad.push([text, 'overflows its box']);
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX === 'visible' && s.overflowY === 'visible') continue;
      const box = a.getBoundingClientRect();
      for (const r of rects) {
        if (r.left < box.left - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1) {
          bad.push([text, 'cut off by ' + (a.id || a.className || a.tagName)]); break;
        }
      }
    }
    const words = text.split(/\\s+/).filter(w => w.length >= 4);
    if (words.length >= 3 && lines >= words.length) bad.push([text, 'one word per line']);
  }
  return bad;
}"""


@pytest.mark.parametrize("locale", ["zh-CN", "en-US", "ja", "ko"])
def test_every_label_of_the_settings_panels_is_shown_whole(url, locale) -> None:
    from webui.i18n import normalize, text

    with browser_page(url, locale) as page:
        page.wait_for_selector("#generate", timeout=60_000)
        shown_locale = normalize(locale)
        page.wait_for_selector(f"#advanced:has-text('{text('advanced', shown_locale)}')", timeout=30_000)
        page.locator("#advanced button.label-wrap").first.click()
        page.wait_for_selector(f"#advanced:has-text('{text('super_sampling.info', shown_locale)[:12]}')",
                               timeout=30_000)
        for panel in ("#sampling", "#advanced"):
            assert page.evaluate(TEXTS_SHOWN_WHOLE, panel) == [], (locale, panel)
        expected = [text(k, shown_locale) for c in ("parallel_infer", "split_bucket", "streaming_mode",
                                                      "super_sampling") for k in (c, f"{c}.info")]
        shown = page.locator("#advanced").inner_text()
        for label in expected:
            assert label in shown, label


ADVANCED = ("batch_size", "fragment_interval", "sample_steps", "early_stop_num", "parallel_infer", "split_bucket",
            "streaming_mode", "super_sampling")


@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_the_advanced_panel_reads_in_plain_words_and_works_at_phone_width(url, locale) -> None:
    from webui.app import CONTROL_WIDTH
    from webui.i18n import normalize, text

    shown_locale = normalize(locale)
    with browser_page(url, locale, width=420) as page:
        page.wait_for_selector(f"#advanced:has-text('{text('advanced', shown_locale)}')", timeout=60_000)
        page.locator("#advanced button.label-wrap").first.click()
        page.wait_for_selector(f"#advanced:has-text('{text('super_sampling', shown_locale)}')", timeout=30_000)
        shown = page.locator("#advanced").inner_text()
        for name in ADVANCED:  # a label a user knows, the parameter's name in its help text
            assert text(name, shown_locale) in shown and "_" not in text(name, shown_locale), name
            assert text(f"{name}.info", shown_locale).startswith(name) and text(f"{name}.info", shown_locale) in shown
        assert page.evaluate("document.documentElement.scrollWidth") <= 420  # nothing to scroll sideways to
        assert page.evaluate(TEXTS_SHOWN_WHOLE, "#advanced") == [], locale
        widths = page.evaluate("() => [...document.querySelectorAll('#advanced .control')]"
                               ".map(e => e.getBoundingClientRect().width)")
        assert len(widths) == len(ADVANCED) and min(widths) >= CONTROL_WIDTH, widths  # stacked, not squeezed
        # it works with a finger: a switch toggles from its label, a value can be typed
        streaming = page.get_by_label(text("streaming_mode", shown_locale))
        assert not streaming.is_checked()
        page.get_by_text(text("streaming_mode", shown_locale), exact=True).click()
        assert streaming.is_checked()
        batch = page.locator("#advanced input[type=number]").first
        batch.fill("4")
        batch.press("Tab")
        assert batch.input_value() == "4"
        if locale == "en-US":
            _shot(page, "webui-advanced-420.png")


def _shot(page, name: str) -> None:
    from tests.webui.test_browser import OUTPUT

    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.locator("#advanced").screenshot(path=str(OUTPUT / name))
