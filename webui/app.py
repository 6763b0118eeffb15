"""The page: ``build_ui(studio) -> gr.Blocks`` over an :class:`engine.studio.Studio`.

A thin layer, built part by part from the top of the page down: the header with the language
switch, the model pickers, the missing-weights panel, the reference and text columns, the settings
panels and the examples; :func:`_wire` then connects the events. Widgets map to ``SynthesisOptions``
(``webui.form``), buttons call ``webui.handlers``, engine errors become ``gr.Error`` messages in the
page's language (``webui.messages``). Models load per request through the studio's pool, so each
browser tab can pick its own weights. Nothing happens at import; ``sovits-studio webui``
(``studio.cli.webui``) serves this page and the HTTP API together.
"""

from __future__ import annotations

import asyncio
import contextvars
import html
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
from gradio.i18n import I18nData

from engine.errors import EngineError
from webui import form, handlers, i18n
from webui.messages import user_message
from webui.models_list import ModelCatalog
from webui.progress import SynthesisProgress
from webui.streaming_audio import streaming_audio
from webui.uploads import uploads_only

ASSETS = Path(__file__).resolve().parents[1] / "assets"
_t = I18nData  # _t("key"): a text the browser translates (webui/locale/*.json)
TICK_S = 1.0  # while a synthesis runs, its progress line is rewritten at least this often
CONTROL_WIDTH = 260  # px: the narrowest column a settings control gets (a row wraps what does not fit)


@dataclass(frozen=True)
class UISettings:
    """Deployment choices of the page (synthesis defaults live in SynthesisOptions)."""

    title: str = "SoVITS Studio"
    max_tokens_per_sentence: int | None = None  # server cap on early_stop_num; None: the model's own limit
    examples_file: Path = ASSETS / "examples.json"
    notice: str = ""  # shown under the title as it is (a deployment's own note)
    device_fallback: str = ""  # the config's device, which this machine lacks (said in the page's language)
    default_text: str = "Hello! This voice was cloned from a few seconds of audio."
    random_weights: bool = False  # the model set is a random-weight test set: say so at the top
    request_timeout_s: float | None = None  # one synthesis, start to last chunk; then it stops (server limit)


@dataclass
class Page:
    """The widgets the event wiring needs, by role (set as the parts are built)."""

    ui_language: gr.Radio | None = None
    notice: gr.Markdown | None = None
    gpt: gr.Dropdown | None = None
    sovits: gr.Dropdown | None = None
    rescan: gr.Button | None = None
    pair: gr.Markdown | None = None
    missing: gr.Markdown | None = None
    download: gr.Button | None = None
    download_log: gr.Markdown | None = None
    inputs: dict[str, gr.components.Component] = field(default_factory=dict)  # generate's inputs, by name
    ref_info: gr.Markdown | None = None
    text_note: gr.Markdown | None = None
    generate: gr.Button | None = None
    stop: gr.Button | None = None
    outputs: tuple = ()  # (streamed audio, full clip, status)
    new_seed: gr.Button | None = None


def page_theme() -> gr.themes.Base:
    return gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])  # no web fonts


def page_i18n() -> gr.I18n:
    """The page's translations (pass to ``launch(i18n=...)`` or ``mount_gradio_app(i18n=...)``)."""
    return gr.I18n(**i18n.translations())


def build_ui(studio, config=None, catalog: ModelCatalog | None = None, settings: UISettings = UISettings(),
             pool=None, super_sampler=None) -> gr.Blocks:
    """The web page for ``studio``; ``config`` (an InferConfig) enables the missing-weights panel.

    ``pool`` (a ``studio.http.runner.SynthesisRunner``) runs the syntheses; pass the HTTP API's so
    that page and API share one bounded set of workers. Default: a pool of one worker for this page.
    ``super_sampler`` (an ``engine.acoustic.super_sampling.SuperSamplerStore``) holds the v3 AP-BWE
    model; pass the HTTP API's so that it loads once. Default: one for this page (the official location).
    """
    from engine.acoustic.super_sampling import SuperSamplerStore
    from studio.http.limits import ServerLimits
    from studio.http.runner import SynthesisRunner

    limits = ServerLimits()
    pool = pool or SynthesisRunner(limits.workers, limits.max_inflight - limits.workers)
    super_sampler = super_sampler or SuperSamplerStore.for_weights(studio.default_weights.base_dir,
                                                                   studio.runtime.device)
    catalog = catalog or ModelCatalog(studio.default_weights.base_dir)
    missing = handlers.missing_weights(config, studio.default_weights) if config is not None else {}
    with gr.Blocks(title=settings.title, analytics_enabled=False,
                   delete_cache=(3600, 3600)) as demo:  # uploads and clips older than an hour are removed hourly
        page = Page()
        _header(page, settings, _notice(studio, settings, i18n.DEFAULT))
        _model_pickers(page, catalog, studio.default_weights)
        _missing_panel(page, handlers.missing_report(missing, config.active.version if config else "", i18n.DEFAULT,
                                                     config.base_dir if config else None))
        with gr.Row():
            with gr.Column():
                _reference_inputs(page)
            with gr.Column():
                _text_and_output(page, settings)
        _settings_panels(page, studio)
        _examples(page, settings.examples_file)
        _wire(demo, page, studio, config, catalog, settings, pool, missing, super_sampler)
    demo.i18n_instance = page_i18n()  # what launch()/mount_gradio_app() would set; both may pass it again
    return demo


# ---- the parts of the page, top to bottom ------------------------------------------------------------


def _header(page: Page, settings: UISettings, notice: str) -> None:
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            gr.Markdown(f"# {settings.title}")
            gr.Markdown(_t("intro"))
        page.ui_language = gr.Radio([(i18n.NAMES[c], c) for c in i18n.LOCALES], value=i18n.DEFAULT, scale=2,
                                    label=_t("ui_language"), elem_id="ui-language", min_width=240)
    page.notice = gr.Markdown(notice, elem_id="notice")  # rewritten in the page's language when it loads


def _model_pickers(page: Page, catalog: ModelCatalog, weights) -> None:
    with gr.Group(elem_id="models"):
        with gr.Row(equal_height=True):
            # values are short names ("v2 · s2G2333k.pth"): no path leaves the server (catalog.resolve)
            page.gpt = gr.Dropdown(catalog.picker_choices("gpt"), value=catalog.key_for(weights.gpt, "gpt"), scale=4,
                                   label=_t("gpt"), info=_t("gpt.info"), allow_custom_value=True, elem_id="gpt")
            page.sovits = gr.Dropdown(catalog.picker_choices("sovits"),
                                      value=catalog.key_for(weights.sovits, "sovits"), scale=4,
                                      label=_t("sovits"), info=_t("sovits.info"), allow_custom_value=True,
                                      elem_id="sovits")
            page.rescan = gr.Button(_t("rescan"), size="sm", scale=1, min_width=120)
    page.pair = gr.Markdown(elem_id="model-pair")


def _missing_panel(page: Page, report: str) -> None:
    with gr.Group(visible=bool(report), elem_id="missing-weights"):
        page.missing = gr.Markdown(report)
        with gr.Row():
            page.download = gr.Button(_t("download"), variant="primary", scale=0, min_width=280)
        page.download_log = gr.Markdown()


def _reference_inputs(page: Page) -> None:
    # file inputs take only what a client uploaded here (and the example clips), never a server path
    page.inputs["ref_audio"] = uploads_only(gr.Audio(sources=["upload", "microphone"], type="filepath",
                                                     elem_id="ref-audio", label=_t("ref_audio")), (ASSETS,))
    page.ref_info = gr.Markdown(elem_id="ref-info")
    page.inputs["ref_text"] = gr.Textbox(label=_t("ref_text"), info=_t("ref_text.info"), lines=2,
                                         elem_id="ref-text")
    page.inputs["ref_lang"] = gr.Dropdown(_languages(), value="en", label=_t("ref_lang"), elem_id="ref-lang")
    # any file type: a non-audio file gets a message instead of being dropped silently
    page.inputs["aux_audio"] = uploads_only(gr.File(file_count="multiple", type="filepath", label=_t("aux"),
                                                    elem_id="aux"), (ASSETS,))


def _text_and_output(page: Page, settings: UISettings) -> None:
    page.inputs["text"] = gr.Textbox(label=_t("text"), lines=5, value=settings.default_text, elem_id="text")
    page.inputs["text_lang"] = gr.Dropdown(_languages(), value="en", label=_t("text_lang"), elem_id="text-lang")
    page.text_note = gr.Markdown(elem_id="text-lang-note")
    page.inputs["text_split_method"] = _control(form.CONTROLS[0])
    with gr.Row():
        page.generate = gr.Button(_t("generate"), variant="primary", elem_id="generate", scale=3)
        page.stop = gr.Button(_t("stop"), variant="stop", scale=1)
    stream_out = streaming_audio(label=_t("stream_out"), autoplay=True, interactive=False, elem_id="stream-audio")
    full_out = gr.Audio(label=_t("full_out"), type="numpy", format="wav", interactive=False, elem_id="full-audio")
    page.outputs = (stream_out, full_out, gr.Markdown(elem_id="status"))


def _settings_panels(page: Page, studio) -> None:
    with gr.Accordion(_t("sampling"), open=True, elem_id="sampling"), gr.Row():
        for c in form.CONTROLS:
            if c.group == "sampling":
                page.inputs[c.name] = _control(c)
        page.new_seed = gr.Button(_t("new_seed"), size="sm")
    advanced = [c for c in form.CONTROLS if c.group == "advanced"]
    with gr.Accordion(_t("advanced"), open=False, elem_id="advanced"):
        # the values in one row, the switches in the next; each in a column wide enough for its label and
        # help text in every language, so that a narrow screen (a phone) stacks them instead of squeezing them
        switches = [c for c in advanced if c.widget == "checkbox"]
        for widgets in ([c for c in advanced if c not in switches], switches):
            with gr.Row(equal_height=False):
                for c in widgets:
                    with gr.Column(min_width=CONTROL_WIDTH, elem_classes="control"):
                        page.inputs[c.name] = _control(c)
    with gr.Accordion(_t("engine_stages"), open=False):
        gr.Markdown(stage_table(studio), elem_id="engine-stages")


def stage_table(studio) -> str:
    """Where each network runs, in which precision and with which backend (Studio.stage_plan), as a table."""
    rows = "\n".join(f"| {s} | `{d}` | {p} | {b} |" for s, d, p, b in studio.stage_plan())
    return f"| stage | device | precision | backend |\n|---|---|---|---|\n{rows}"


def _examples(page: Page, path: Path) -> None:
    if rows := _example_rows(path):
        fields = [page.inputs[k] for k in ("ref_audio", "ref_text", "ref_lang", "text", "text_lang")]
        # the clip and the two texts; the languages' labels are translation keys the table would show raw
        examples = gr.Examples(rows, fields, label=_t("examples"), visible_columns=[0, 1, 3])
        examples.dataset.headers = []  # the widgets' labels: translation keys too


# ---- events -------------------------------------------------------------------------------------------


def _wire(demo: gr.Blocks, page: Page, studio, config, catalog: ModelCatalog, settings: UISettings, pool,
          missing: dict, super_sampler) -> None:
    names = ["ref_audio", "ref_text", "ref_lang", "aux_audio", "text", "text_lang", "gpt_weights", "sovits_weights",
             *(c.name for c in form.CONTROLS), "ui_language"]
    widgets = {**page.inputs, "gpt_weights": page.gpt, "sovits_weights": page.sovits, "ui_language": page.ui_language}
    widen = lambda v: _super_sampler(v, studio, catalog, super_sampler)  # noqa: E731
    generate = _generate_handler(names, studio, settings, pool, widen, catalog)
    # the status line (webui.progress) is the one progress display; Gradio's overlay would cover the outputs,
    # restart its timer and come and go with each piece of audio (API clients still get gr.Progress updates)
    running = page.generate.click(generate, [widgets[n] for n in names], list(page.outputs), api_name="generate",
                                  show_progress="hidden")
    page.stop.click(None, None, None, cancels=[running])
    page.new_seed.click(handlers.new_seed, None, page.inputs["seed"], api_name="new_seed", queue=False)
    notes = _wire_notes(page, studio, catalog)
    _wire_models(page, config, catalog)
    _wire_language(demo, page, notes, studio, settings, missing, config.active.version if config else "",
                   config.base_dir if config else None)


def _wire_notes(page: Page, studio, catalog: ModelCatalog) -> dict:
    """The texts under the clip, the text and the pickers, rewritten when what they describe changes."""
    lang, ref_audio = page.ui_language, page.inputs["ref_audio"]
    describe = lambda path, locale: handlers.describe_reference(path, studio.reference_rules, locale)  # noqa: E731
    ref_audio.change(describe, [ref_audio, lang], page.ref_info, api_name="describe_reference", queue=False)
    text_inputs = [page.inputs["text"], page.inputs["text_lang"], lang]
    for trigger in (page.inputs["text"].change, page.inputs["text_lang"].change):
        trigger(handlers.language_note, text_inputs, page.text_note, queue=False, api_visibility="private")

    def pair(gpt, sovits, locale):
        return handlers.pair_note(catalog, catalog.resolve(gpt), catalog.resolve(sovits), locale)

    for trigger in (page.gpt.change, page.sovits.change):
        trigger(pair, [page.gpt, page.sovits, lang], page.pair, queue=False, api_visibility="private")
    return {"describe": describe, "pair": pair}


def _wire_models(page: Page, config, catalog: ModelCatalog) -> None:
    def rescan():
        try:
            gpt, sovits = handlers.rescan_choices(catalog)
        except EngineError as e:  # names no server path (the detail is in the log)
            raise gr.Error(str(e)) from None
        return gr.update(choices=gpt), gr.update(choices=sovits)

    page.rescan.click(rescan, None, [page.gpt, page.sovits], api_name="rescan_models")
    if config is not None:
        def download(locale, request: gr.Request, progress=gr.Progress()):  # noqa: B008 - Gradio injects the bar
            if not handlers.may_administer(getattr(request, "username", None), request.client.host
                                           if request.client else None):
                return handlers.ADMIN_ONLY
            return handlers.download_weights(config.base_dir, config.active.version, locale=locale,
                                             progress=lambda share, what: progress(share, desc=what))

        page.download.click(download, page.ui_language, page.download_log, api_name="download_weights",
                            concurrency_limit=1)


def _wire_language(demo: gr.Blocks, page: Page, notes: dict, studio, settings: UISettings, missing: dict,
                   version: str, root) -> None:
    """The switch starts at the browser's language; changing it re-translates the page in the browser and
    rewrites the texts the server wrote."""
    def page_texts(locale, gpt, sovits):  # need no engine module: back at once, even during a warm-up
        return (_notice(studio, settings, locale), handlers.missing_report(missing, version, locale, root),
                notes["pair"](gpt, sovits, locale))

    def input_notes(locale, path, text, text_lang):  # read the clip, detect the text's language
        return notes["describe"](path, locale), handlers.language_note(text, text_lang, locale)

    lang = page.ui_language
    lang.change(None, lang, None, js=i18n.SWITCH_JS, api_visibility="private")
    lang.change(page_texts, [lang, page.gpt, page.sovits], [page.notice, page.missing, page.pair], queue=False,
                api_visibility="private")
    lang.change(input_notes, [lang, page.inputs["ref_audio"], page.inputs["text"], page.inputs["text_lang"]],
                [page.ref_info, page.text_note], queue=False, api_visibility="private")
    demo.load(None, None, lang, js=i18n.DETECT_JS)  # a browser language other than the default fires .change


def _generate_handler(names: list[str], studio, settings: UISettings, pool, widen, catalog: ModelCatalog):
    async def generate(*args):
        *values, progress = args  # gradio passes the gr.Progress named in the signature last
        v = dict(zip(names, values))
        for key in ("gpt_weights", "sovits_weights"):  # the pickers hold short names
            v[key] = catalog.resolve(v[key])
        locale = v["ui_language"]
        files = {str(v["ref_audio"] or ""): "ref", **{str(getattr(a, "name", a)): "aux" for a in v["aux_audio"] or ()},
                 str(v["gpt_weights"] or ""): "gpt", str(v["sovits_weights"] or ""): "sovits"}
        yield gr.skip(), None, ""  # the previous run's clip and status go at once
        try:
            reference = handlers.make_reference(v["ref_audio"], v["ref_text"], v["ref_lang"], v["aux_audio"])
            options = form.options_from_values({c.name: v[c.name] for c in form.CONTROLS})
            if note := handlers.language_note(v["text"], v["text_lang"], locale):
                gr.Warning(note)
            sampler, note = widen(v) if options.super_sampling else (None, "")
            if note:
                gr.Warning(note)
            event = contextvars.copy_context()  # gradio finds the request's progress bar through it
            shown = SynthesisProgress()  # the page's own line: it stays up for the whole run

            def on_progress(done: int, total: int) -> None:  # called on the worker thread
                shown.update(done, total)
                event.run(progress, (done, total), unit="sentences")  # API clients read gradio's progress

            yield gr.skip(), gr.skip(), shown.line(locale)
            chunks = await pool.stream(lambda: handlers.synthesize(
                studio, v["text"], v["text_lang"], reference, options, v["gpt_weights"], v["sovits_weights"],
                settings.max_tokens_per_sentence, on_progress, locale, sampler))
            async for chunk in _until(chunks, settings.request_timeout_s):  # computed on the API's pool
                if chunk is None:  # a second without audio: the progress line's clock moves on
                    yield gr.skip(), gr.skip(), shown.line(locale)
                    continue
                audio = (chunk.sample_rate, chunk.pcm16)
                yield (None, audio, chunk.status) if chunk.final else (audio, gr.skip(), shown.line(locale))
        except TimeoutError as e:
            raise gr.Error(i18n.text("error.timeout", locale, seconds=f"{settings.request_timeout_s:g}"),
                           print_exception=False) from e
        except EngineError as e:
            raise gr.Error(user_message(e, locale, files, weights_listed=catalog.listed_any),
                           print_exception=False) from e

    generate.__signature__ = _named(names)  # API parameter names = field names
    return generate


# ---- helpers ------------------------------------------------------------------------------------------


async def _until(stream, seconds: float | None, tick: float = TICK_S):
    """The items of ``stream`` (a ``ResultStream``) until ``seconds`` have passed; then the stream is
    cancelled (its work stops at the next item) and TimeoutError is raised. Every ``tick`` seconds
    without an item, None is yielded (the caller refreshes its progress line)."""
    loop = asyncio.get_running_loop()
    deadline = None if seconds is None else loop.time() + seconds
    items = stream.__aiter__()
    pending = None
    try:
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            pending = pending or asyncio.ensure_future(items.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=tick if remaining is None else min(tick, remaining))
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        stream.cancel()
        await items.aclose()


def _super_sampler(v: dict, studio, catalog: ModelCatalog, store):
    """(the AP-BWE sampler, "") for a v3 request whose model is in place; else (None, why not)."""
    locale = v["ui_language"]
    described = catalog.describe(catalog.resolve(v["sovits_weights"]) or studio.default_weights.sovits)
    version = described.version if described is not None else "?"
    if version != "v3":
        return None, i18n.text("super_sampling.v3_only", locale, version=version)
    sampler = store.get()
    folder = handlers.shown_path(store.path.parent, studio.default_weights.base_dir)  # no server path
    return sampler, "" if sampler is not None else i18n.text("super_sampling.missing", locale, folder=folder)


def _notice(studio, settings: UISettings, locale: str) -> str:
    lines = [i18n.text("runs_on", locale, device=studio.runtime.device)]
    if settings.device_fallback:
        lines.append("> " + i18n.text("device_fallback", locale, requested=settings.device_fallback,
                                      device=studio.runtime.device))
    if settings.notice:
        lines.append(f"> {settings.notice}")
    problem, command = getattr(studio, "g2pw_fix", ("", ""))
    if problem:  # server paths never reach the page: the model folder is named, not shown
        base = str(studio.default_weights.base_dir)
        # markdown would take a bare <model folder> for an HTML tag and drop it (and the sentence after it): the
        # problem (prose) is escaped; the command is a code span, where it shows as written
        lines.append(i18n.text("g2pw_missing", locale, problem=html.escape(problem.replace(base, "<model folder>")),
                               command=command.replace(base, "<model folder>")))
    if settings.random_weights:
        tokens = settings.max_tokens_per_sentence or 0
        lines.append(i18n.text("random_weights", locale, tokens=tokens or "∞", seconds=f"{tokens / 25:g}"))
    return "\n\n".join(lines)


def _languages() -> list[tuple[str, str]]:
    from engine.text.frontend import languages

    return [(f"lang.{c}", c) for c in languages("v2")]  # browser-translated keys


def _control(c: form.Control) -> gr.components.Component:
    value, label, info = form.default(c.name), _t(c.name), _t(f"{c.name}.info")
    if c.widget == "slider":
        return gr.Slider(c.minimum, c.maximum, value=value, step=c.step, label=label, info=info, min_width=300)
    if c.widget == "checkbox":
        return gr.Checkbox(value=value, label=label, info=info, min_width=260)
    if c.widget == "dropdown":
        return gr.Dropdown(choices=list(c.choices), value=value, label=label, info=info, min_width=240)
    return gr.Number(value=value, precision=0, minimum=c.minimum, maximum=c.maximum, label=label, info=info,
                     min_width=240)


def _example_rows(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [[str(path.parent / r["audio"]), r["text"], r["language"], r["target_text"], r["target_language"]]
            for r in rows if (path.parent / r["audio"]).is_file()]


def _named(names: list[str]) -> inspect.Signature:
    """A signature of positional ``names`` plus gradio's progress tracker (its default marks it)."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    return inspect.Signature([*params, inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                         default=gr.Progress())])
