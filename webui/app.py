"""The page: ``build_ui(studio) -> gr.Blocks`` over an :class:`engine.pipeline.Studio`, and ``main()``.

A thin layer: widgets map to ``SynthesisOptions`` (``webui.form``), buttons call ``webui.handlers``,
engine errors become ``gr.Error`` messages. Models load per request through the studio's pool, so
each browser tab can pick its own weights. Nothing happens at import; ``main`` runs the
``sovits-studio webui`` command (``webui.server``), which serves this page and the HTTP API together.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from engine.errors import EngineError
from webui import form, handlers
from webui.models_list import ModelCatalog
from webui.streaming_audio import streaming_audio

ASSETS = Path(__file__).resolve().parents[1] / "assets"
INTRO = ("Upload or record 3–10 s of a voice, give its transcript, type what it should say, and press "
         "**Generate**: the audio plays while it is made, and the whole clip is offered for download. "
         "The HTTP API runs on this server too (`/tts`, `/v1/audio/speech`, `/docs`).")


@dataclass(frozen=True)
class UISettings:
    """Deployment choices of the page (synthesis defaults live in SynthesisOptions)."""

    title: str = "SoVITS Studio"
    max_tokens_per_sentence: int | None = None  # server cap on early_stop_num; None: the model's own limit
    examples_file: Path = ASSETS / "examples.json"
    notice: str = ""  # shown under the title (e.g. a device fallback)
    default_text: str = "Hello! This voice was cloned from a few seconds of audio."


def _languages() -> list[tuple[str, str]]:
    from engine.text.frontend import languages

    return [(f"{form.LANGUAGE_LABELS.get(c, c)} ({c})", c) for c in languages("v2")]


def _control(c: form.Control) -> gr.components.Component:
    value = form.default(c.name)
    if c.widget == "slider":
        return gr.Slider(c.minimum, c.maximum, value=value, step=c.step, label=c.label, info=c.info)
    if c.widget == "checkbox":
        return gr.Checkbox(value=value, label=c.label, info=c.info)
    if c.widget == "dropdown":
        return gr.Dropdown(choices=list(c.choices), value=value, label=c.label, info=c.info)
    return gr.Number(value=value, precision=0, minimum=c.minimum, maximum=c.maximum, label=c.label, info=c.info)


def _examples(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [[str(path.parent / r["audio"]), r["text"], r["language"], r["target_text"], r["target_language"]]
            for r in rows if (path.parent / r["audio"]).is_file()]


def build_ui(studio, config=None, catalog: ModelCatalog | None = None, settings: UISettings = UISettings(),
             pool=None) -> gr.Blocks:
    """The web page for ``studio``; ``config`` (an InferConfig) enables the missing-weights panel.

    ``pool`` (an ``studio.http.runner.SynthesisRunner``) runs the syntheses; pass the HTTP API's so
    that page and API share one bounded set of workers. Default: a pool of one worker for this page.
    """
    from studio.http.limits import ServerLimits
    from studio.http.runner import SynthesisRunner

    pool = pool or SynthesisRunner(ServerLimits.workers, ServerLimits.max_queue)
    weights = studio.default_weights
    catalog = catalog or ModelCatalog(weights.base_dir)
    missing = handlers.missing_weights(config, weights) if config is not None else {}
    langs = _languages()
    controls: dict[str, gr.components.Component] = {}

    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])  # no web fonts
    with warnings.catch_warnings():  # gradio 5.50 warns that gradio 6 moves `theme` to launch(); we mount, not launch
        warnings.simplefilter("ignore", DeprecationWarning)
        demo = gr.Blocks(title=settings.title, theme=theme, analytics_enabled=False,
                         delete_cache=(3600, 3600))  # uploads and clips older than an hour are removed hourly
    with demo:
        gr.Markdown(f"# {settings.title}\n{INTRO} Models run on `{studio.runtime.device}`."
                    + (f"\n\n> {settings.notice}" if settings.notice else ""))
        with gr.Group(visible=bool(missing), elem_id="missing-weights"):
            gr.Markdown(handlers.missing_report(missing, config.active.version if config else ""))
            download_btn = gr.Button("Download weights", variant="secondary")
            download_md = gr.Markdown()
        with gr.Row():
            with gr.Column():
                ref_audio = gr.Audio(sources=["upload", "microphone"], type="filepath", elem_id="ref-audio",
                                     label="Reference clip (3–10 s)")
                ref_info = gr.Markdown(elem_id="ref-info")
                ref_text = gr.Textbox(label="Transcript of the reference clip", lines=2, elem_id="ref-text",
                                      info="exactly what is said in the clip (empty: reference-free, v1/v2 only)")
                ref_lang = gr.Dropdown(langs, value="en", label="Language of the reference")
                aux = gr.File(file_count="multiple", file_types=["audio"], type="filepath",
                              label="More clips of the same voice (optional: their style is averaged in)")
            with gr.Column():
                text = gr.Textbox(label="Text to speak", lines=5, value=settings.default_text, elem_id="text")
                text_lang = gr.Dropdown(langs, value="en", label="Language of the text")
                controls["text_split_method"] = _control(form.CONTROLS[0])
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate", scale=3)
                    stop_btn = gr.Button("Stop", variant="stop", scale=1)
                stream_out = streaming_audio(label="Playing as it is made", autoplay=True,
                                            interactive=False, elem_id="stream-audio")
                full_out = gr.Audio(label="Full clip", type="numpy", format="wav", interactive=False,
                                    elem_id="full-audio")
                status = gr.Markdown(elem_id="status")
        with gr.Accordion("Models", open=False):
            with gr.Row():
                gpt = gr.Dropdown(catalog.choices("gpt"), value=str(Path(weights.gpt).resolve()),
                                  label="GPT weights (.ckpt)", allow_custom_value=True)
                sovits = gr.Dropdown(catalog.choices("sovits"), label="SoVITS weights (.pth)", allow_custom_value=True,
                                     value=str(Path(weights.sovits).resolve()))
            refresh_btn = gr.Button("Rescan weight folders", size="sm")
        with gr.Accordion("Sampling", open=True), gr.Row():
            for c in form.CONTROLS:
                if c.group == "sampling":
                    controls[c.name] = _control(c)
            reroll = gr.Button("New seed", size="sm")
        with gr.Accordion("Advanced", open=False), gr.Row():
            for c in form.CONTROLS:
                if c.group == "advanced":
                    controls[c.name] = _control(c)
        if rows := _examples(settings.examples_file):
            gr.Examples(rows, [ref_audio, ref_text, ref_lang, text, text_lang], label="Examples (reference + text)")

        fields = {"ref_audio": ref_audio, "ref_text": ref_text, "ref_lang": ref_lang, "aux_audio": aux, "text": text,
                  "text_lang": text_lang, "gpt_weights": gpt, "sovits_weights": sovits, **controls}

        async def generate(*args):
            *values, progress = args  # gradio passes the gr.Progress named in the signature last
            v = dict(zip(fields, values))
            try:
                reference = handlers.make_reference(v["ref_audio"], v["ref_text"], v["ref_lang"], v["aux_audio"])
                options = form.options_from_values({n: v[n] for n in controls})
                event = contextvars.copy_context()  # gradio finds the request's progress bar through it

                def on_progress(done: int, total: int) -> None:  # called on the worker thread
                    event.run(progress, (done, total), unit="sentences")

                chunks = await pool.stream(lambda: handlers.synthesize(
                    studio, v["text"], v["text_lang"], reference, options, v["gpt_weights"], v["sovits_weights"],
                    settings.max_tokens_per_sentence, on_progress))
                async for chunk in chunks:  # computed on a worker of the pool the HTTP API shares
                    audio = (chunk.sample_rate, chunk.pcm16)
                    yield (None, audio, chunk.status) if chunk.final else (audio, gr.skip(), gr.skip())
            except EngineError as e:
                raise gr.Error(str(e), print_exception=False) from e

        generate.__signature__ = _named(list(fields))  # API parameter names = field names
        running = generate_btn.click(generate, list(fields.values()), [stream_out, full_out, status],
                                     api_name="generate")
        stop_btn.click(None, None, None, cancels=[running])
        ref_audio.change(lambda p: handlers.describe_reference(p, studio.reference_rules), ref_audio, ref_info,
                         api_name="describe_reference", queue=False)
        reroll.click(handlers.new_seed, None, controls["seed"], api_name="new_seed", queue=False)
        refresh_btn.click(lambda: (gr.update(choices=catalog.choices("gpt")), gr.update(choices=catalog.choices("sovits"))),
                          None, [gpt, sovits], api_name="rescan_models")
        if config is not None:
            download_btn.click(lambda: handlers.download_weights(config.base_dir, config.active.version), None,
                               download_md, api_name="download_weights", concurrency_limit=1)
    return demo


def _named(names: list[str]) -> inspect.Signature:
    """A signature of positional ``names`` plus gradio's progress tracker (its default marks it)."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    return inspect.Signature([*params, inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                         default=gr.Progress())])
