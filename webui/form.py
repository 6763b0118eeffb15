"""The synthesis controls of the page, described once: which ``SynthesisOptions`` field each widget sets,
and its range (labels and help texts are in ``webui/locale``). Defaults are read from the dataclass, never written here.

Pure (no gradio): ``webui.app`` turns these specs into widgets, :func:`options_from_values` turns the
widget values back into a validated :class:`SynthesisOptions`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from engine.options import MAX_SEED, SPLIT_METHODS, SynthesisOptions


@dataclass(frozen=True)
class Control:
    """One widget bound to one ``SynthesisOptions`` field; its label and help text are the locale
    entries ``<name>`` and ``<name>.info`` (``webui/locale/*.json``)."""

    name: str  # the SynthesisOptions field
    widget: str  # "slider" | "number" | "checkbox" | "dropdown"
    minimum: float | None = None  # slider range (a UI choice; validation stays in SynthesisOptions)
    maximum: float | None = None
    step: float | None = None
    choices: tuple = ()  # dropdown: (label or locale key, value) pairs
    group: str = "sampling"  # "text" | "sampling" | "advanced"


CONTROLS: tuple[Control, ...] = (
    Control("text_split_method", "dropdown", choices=tuple((f"split.{m}", m) for m in SPLIT_METHODS), group="text"),
    Control("top_k", "slider", 1, 100, 1),
    Control("top_p", "slider", 0.05, 1.0, 0.05),
    Control("temperature", "slider", 0.05, 2.0, 0.05),
    Control("repetition_penalty", "slider", 1.0, 2.0, 0.05),
    Control("speed_factor", "slider", 0.6, 1.65, 0.05),
    Control("seed", "number", -1, MAX_SEED),
    Control("batch_size", "slider", 1, 20, 1, group="advanced"),
    Control("parallel_infer", "checkbox", group="advanced"),
    Control("split_bucket", "checkbox", group="advanced"),
    Control("streaming_mode", "checkbox", group="advanced"),
    Control("fragment_interval", "slider", 0.0, 1.0, 0.01, group="advanced"),
    Control("sample_steps", "dropdown", choices=tuple((str(n), n) for n in (4, 8, 16, 32, 64)), group="advanced"),
    Control("super_sampling", "checkbox", group="advanced"),
    Control("early_stop_num", "number", 0, 10_000, group="advanced"),
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
