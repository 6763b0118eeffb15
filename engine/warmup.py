"""Warm-up at start: load the configured models and synthesise once per configured version.

Without it the first request pays for loading the weights, the text front end's dictionaries, the
first-call kernel choices and, on CUDA, the capture of the T2S decode-step graph: about five times
the second request on a CPU. :func:`warm_up` does that work before a server says it is ready:

* for each model set the config names (the active section, plus every other version section the
  file itself sets to other weights that exist), it runs one short synthesis through the normal
  ``Studio.synthesize`` path: a synthetic reference clip, a short sentence in the first language of
  ``WarmupSettings.languages``, a few semantic tokens;
* it synthesises that sentence again, streamed, so that the chunk decodes' first shapes are met too;
* it does the same in each other language of ``WarmupSettings.languages`` (reference and text in it), and
  runs the language check the servers apply to every text;
* it reads a short text in every language code the version accepts through the text front end alone, so
  that no first request in a language loads its dictionaries while the server waits;
* on CUDA, the decode-step graph of every batch bucket of every scheduler is captured at the end
  (:meth:`engine.studio.Studio.capture_graphs`): a capture while requests run could be invalidated by
  their device work, so serving never captures one.

:class:`Readiness` is what ``/health`` reports: ``starting`` until the warm-up ends, then ``ready``; a failed
warm-up is logged and ends in ``degraded`` with the reason (requests are still served and try again what
failed: a model set that did not load loads on first use, a slot pool that could not be allocated is tried
again, its request answered 503 meanwhile).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.readiness import Readiness

log = logging.getLogger(__name__)

WARMUP_TEXT = {"zh": "你好，欢迎。", "en": "Hello, welcome.", "ja": "こんにちは。", "ko": "안녕하세요.",
               "yue": "你好。"}
# the front end alone, every language code: numbers too, whose readers load on first use (English's inflect
# takes 2.7 s to import on a CPU, holding the GIL); the auto codes get every script, so the detector loads
READ_TEXT = {"zh": "你好，今天是2024年3月5日，气温12.5度。", "en": "Hello, it is 12:30 on March 5th, 2024, and 12.5 degrees.",
             "ja": "こんにちは、2024年3月5日、12時です。", "ko": "안녕하세요, 2024년 3월 5일 12시입니다.",
             "yue": "你好，今日係2024年3月5日，12點。"}
MIXED_TEXT = "Hello 12, 你好12。こんにちは12。안녕하세요 12."
REFERENCE_TEXT = {"zh": "今天天气很好，我们出去走走吧。", "en": "The weather is nice today, let us take a walk.",
                  "ja": "今日はいい天気ですね。", "ko": "오늘은 날씨가 좋네요.", "yue": "今日天氣好好。"}


@dataclass(frozen=True)
class WarmupSettings:
    """What the start-up warm-up does (``warmup`` in the config, ``--no-warmup`` on the command line)."""

    enabled: bool = True  # serve/webui: warm up before /health says "ready"
    languages: tuple[str, ...] = ("zh", "en")  # first: the synthesis; the others: text front end only
    max_tokens: int = 24  # semantic tokens of the warm-up sentence (about one second of speech)
    sample_steps: int = 4  # CFM steps of the v3/v4 warm-up (kernels are the same for any count)


@dataclass(frozen=True)
class WarmupReport:
    sets: tuple[str, ...]  # the versions warmed, in order
    seconds: float
    errors: tuple[str, ...] = field(default_factory=tuple)
    graphs: int = 0  # decode-step graphs captured (CUDA), so that serving never captures one


def reference_clip(seconds: float = 4.0, rate: int = 32000) -> bytes:
    """A synthetic voiced clip (harmonics with syllable-rate bursts) as WAV bytes; passes the reference rules."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(140.0 * (1 + 0.04 * np.sin(2 * np.pi * 4 * t))) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 9))
    bursts = 0.35 + 0.65 * np.sin(np.pi * 3.0 * t) ** 2
    noise = np.random.default_rng(0).standard_normal(t.size)
    x = 0.25 * voiced * bursts / np.abs(voiced).max() + 0.002 * noise
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def configured_weight_sets(config, default) -> list:
    """The default WeightSet, then one per other version section the file sets to existing other weights."""
    from dataclasses import replace

    from engine.config import default_sections

    builtin = default_sections()
    sets = [default]
    seen = {(default.gpt.resolve(), default.sovits.resolve())}
    for name, section in config.sections.items():
        if name == "custom" or name == config.active_name or section == builtin.get(name):
            continue  # the active set is the default; untouched built-in sections are not "configured"
        gpt, sovits = config.base_dir / section.t2s_weights_path, config.base_dir / section.vits_weights_path
        if not (section.t2s_weights_path and section.vits_weights_path and gpt.is_file() and sovits.is_file()):
            continue
        key = (gpt.resolve(), sovits.resolve())
        if key not in seen:
            seen.add(key)
            sets.append(replace(default, gpt=gpt, sovits=sovits))
    return sets


def warm_up(studio, weight_sets: Sequence | None = None, settings: WarmupSettings = WarmupSettings(),
            on_step: Callable[[str], None] | None = None) -> WarmupReport:
    """Load each weight set and synthesise once (see the module docstring). Errors are collected, not raised."""
    from engine.options import SynthesisOptions
    from engine.text.frontend import languages
    from engine.text.language_check import check_text_language

    start = time.monotonic()
    sets = list(weight_sets) if weight_sets is not None else [studio.default_weights]
    first, others = settings.languages[0], settings.languages[1:]
    clip = reference_clip()
    done: list[str] = []
    errors: list[str] = []
    for weights in sets:
        label = f"{weights.sovits.name}"
        try:
            cloner = studio.cloner(weights.gpt, weights.sovits)
            version = cloner.models.version
            label = f"{version} ({weights.sovits.name})"
            if on_step is not None:
                on_step(f"warming up {label}")
            options = SynthesisOptions(seed=0, early_stop_num=settings.max_tokens, sample_steps=settings.sample_steps,
                                       fragment_interval=0.0)
            # one synthesis per warm-up language, each with a reference in that language: the first request
            # finds every stage's code paths, kernels and buffers used once, whichever of them it speaks
            for lang in (first, *others):
                if lang != first and lang not in languages(version):
                    continue
                _synthesize_once(studio, weights, clip, lang, options)
                if lang == first:  # and streamed: the chunk decodes' shapes (their convolution plans) of one client
                    _synthesize_once(studio, weights, clip, lang, options.replace(streaming_mode=True))
            check_text_language(WARMUP_TEXT.get(first, WARMUP_TEXT["en"]), first)  # the servers' language note
            _read_every_language(cloner, version)
            done.append(version)
            log.info("warmed up %s", label)
        except Exception as e:  # a warm-up failure must not stop the server; requests report real errors
            errors.append(f"{label}: {type(e).__name__}: {e}")
            log.warning("warm-up of %s failed (%s: %s); the first request will load what it needs",
                        label, type(e).__name__, e)
    graphs = 0
    capture = getattr(studio, "capture_graphs", None)
    if capture is not None:  # every batch bucket of every scheduler, before the server says it is ready
        try:
            graphs = capture()
        except Exception as e:  # buckets without a graph then run eagerly until a quiet moment
            errors.append(f"graph capture: {type(e).__name__}: {e}")
            log.warning("capturing the decode-step graphs failed (%s: %s); those steps run eagerly",
                        type(e).__name__, e)
    return WarmupReport(tuple(done), round(time.monotonic() - start, 3), tuple(errors), graphs)


def _read_every_language(cloner, version: str) -> None:
    """Every language code the version accepts, through the text front end alone (no BERT, no synthesis).
    Each language loads its dictionaries and models on first use (on a CPU: 2.7 s for English numbers'
    inflect, 1.5 s for the auto codes' language detector, 0.6 s for Cantonese), holding the GIL meanwhile:
    a server would answer nothing else, /health included, while the first request in that language waits.
    A language that fails here fails its requests with their own message later; warm-up only logs it."""
    from engine.text.frontend import languages

    for code in languages(version):
        lang = code.removeprefix("all_")
        text = MIXED_TEXT if lang.startswith("auto") else READ_TEXT.get(lang, READ_TEXT["en"])
        try:
            cloner.read_text(text, code)  # in the text worker processes when the engine has them
        except Exception as e:  # noqa: BLE001 - an optional language's library may be missing
            log.warning("warm-up: the %s text front end failed (%s: %s)", code, type(e).__name__, e)


def _synthesize_once(studio, weights, clip: bytes, lang: str, options) -> None:
    from engine.reference import Reference

    reference = Reference(clip, REFERENCE_TEXT.get(lang, REFERENCE_TEXT["en"]), lang)
    results = studio.synthesize(WARMUP_TEXT.get(lang, WARMUP_TEXT["en"]), lang, reference, options,
                                gpt=weights.gpt, sovits=weights.sovits)
    for _ in results:
        pass


def warm_up_in_background(studio, readiness: Readiness, weight_sets: Sequence | None = None,
                          settings: WarmupSettings = WarmupSettings(),
                          submit: Callable[..., object] | None = None) -> threading.Thread:
    """Run :func:`warm_up` off the caller's thread and mark ``readiness`` when it ends.

    ``submit(fn)``: run it on the server's synthesis workers instead (e.g. ``SynthesisRunner.submit``), so the
    worker thread that serves the first request has done its own first-call work; the returned thread then only
    waits for that job."""

    def work() -> WarmupReport:
        return warm_up(studio, weight_sets, settings)

    def run() -> None:
        try:
            report = submit(work).result() if submit is not None else work()  # type: ignore[union-attr]
            readiness.finish("; ".join(report.errors))
            if report.errors:  # /health says "degraded" with the reason, never "ready" over a broken engine
                log.error("warm-up finished in %.1f s with errors (%s warmed); /health says degraded: %s",
                          report.seconds, ", ".join(report.sets) or "nothing", "; ".join(report.errors))
            else:
                log.info("warm-up finished in %.1f s (%s); ready", report.seconds, ", ".join(report.sets))
        except BaseException as e:  # never leave /health at "starting"
            readiness.finish(f"{type(e).__name__}: {e}")
            raise

    thread = threading.Thread(target=run, name="warm-up", daemon=True)
    thread.start()
    return thread
