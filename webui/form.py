"""The synthesis controls of the page, described once: which ``SynthesisOptions`` field each widget sets,
its range and a short help text. Defaults are read from the dataclass, never written here.

Pure (no gradio): ``webui.app`` turns these specs into widgets, :func:`options_from_values` turns the
widget values back into a validated :class:`SynthesisOptions`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from engine.options import MAX_SEED, SPLIT_METHODS, SynthesisOptions

# language code -> label (codes are the official ones; the page shows both)
LANGUAGE_LABELS = {
    "auto": "Auto-detect, multilingual", "auto_yue": "Auto-detect, multilingual (Cantonese)",
    "en": "English", "all_zh": "Chinese", "zh": "Chinese + English", "all_ja": "Japanese",
    "ja": "Japanese + English", "all_yue": "Cantonese", "yue": "Cantonese + English", "all_ko": "Korean",
    "ko": "Korean + English",
}
SPLIT_LABELS = {
    "cut0": "cut0: no split", "cut1": "cut1: every 4 sentences", "cut2": "cut2: every 50 characters",
    "cut3": "cut3: at Chinese full stops (。)", "cut4": "cut4: at English full stops (.)",
    "cut5": "cut5: at every punctuation mark",
}


@dataclass(frozen=True)
class Control:
    """One widget bound to one ``SynthesisOptions`` field."""

    name: str  # the SynthesisOptions field
    label: str
    info: str  # one-line help shown under the widget
    widget: str  # "slider" | "number" | "checkbox" | "dropdown"
    minimum: float | None = None  # slider range (a UI choice; validation stays in SynthesisOptions)
    maximum: float | None = None
    step: float | None = None
    choices: tuple = ()  # dropdown: (label, value) pairs
    group: str = "sampling"  # "text" | "sampling" | "advanced"


CONTROLS: tuple[Control, ...] = (
    Control("text_split_method", "How to split the text", "long texts are synthesised piece by piece",
            "dropdown", choices=tuple((SPLIT_LABELS[m], m) for m in SPLIT_METHODS), group="text"),
    Control("top_k", "top_k", "sample among the k most likely tokens (1 = always the most likely)",
            "slider", 1, 100, 1),
    Control("top_p", "top_p", "keep the smallest token set holding this probability (1 = off)",
            "slider", 0.05, 1.0, 0.05),
    Control("temperature", "temperature", "lower: steadier and flatter; higher: livelier, riskier",
            "slider", 0.05, 2.0, 0.05),
    Control("repetition_penalty", "repetition_penalty", "discourages repeated tokens (stutters, loops)",
            "slider", 1.0, 2.0, 0.05),
    Control("speed_factor", "speed", "above 1 speaks faster", "slider", 0.6, 1.65, 0.05),
    Control("seed", "seed", "-1 draws a new random seed; the seed used is shown after each run",
            "number", -1, MAX_SEED),
    Control("batch_size", "batch_size", "sentences decoded together (faster on a GPU)", "slider", 1, 20, 1,
            group="advanced"),
    Control("parallel_infer", "parallel_infer", "decode a batch of sentences at once", "checkbox",
            group="advanced"),
    Control("split_bucket", "split_bucket", "batch sentences of similar length (order is kept)", "checkbox",
            group="advanced"),
    Control("streaming_mode", "token streaming", "play each sentence in small chunks: first sound sooner "
            "(v1/v2/v2Pro models)", "checkbox", group="advanced"),
    Control("fragment_interval", "pause between sentences (s)", "silence after each sentence", "slider",
            0.0, 1.0, 0.01, group="advanced"),
    Control("sample_steps", "sample_steps", "v3/v4 only: diffusion steps (fewer: faster, rougher)",
            "dropdown", choices=tuple((str(n), n) for n in (4, 8, 16, 32, 64)), group="advanced"),
    Control("early_stop_num", "max tokens per sentence", "0: the model's own limit (25 tokens = 1 s)",
            "number", 0, 10_000, group="advanced"),
)


def default(name: str) -> Any:
    """The ``SynthesisOptions`` default of a field, as the widget shows it (None -> 0 for the token cap)."""
    for f in fields(SynthesisOptions):
        if f.name == name:
            value = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            return 0 if name == "early_stop_num" and value is None else value
    raise KeyError(name)


def _coerce(name: str, value: Any) -> Any:
    """Widget value -> field value: whole floats become ints where the field is an int; 0 tokens -> None."""
    ref = default(name)
    if name == "early_stop_num":
        return None if value in (None, 0, 0.0) else _whole(value)
    if isinstance(ref, bool):
        return value
    if isinstance(ref, int):
        return _whole(value)
    if isinstance(ref, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value  # left for SynthesisOptions to refuse, naming the field


def options_from_values(values: dict[str, Any]) -> SynthesisOptions:
    """Widget values by field name -> validated options (OptionsError names a bad field)."""
    return SynthesisOptions(**{name: _coerce(name, v) for name, v in values.items()})
