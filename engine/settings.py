"""The settings a front door gives the engine, from its config (``tts_infer.yaml``) and its overrides.

``serve``, ``webui``, ``synth`` (through :mod:`studio.cli.bootstrap`) and the cluster's replicas read the
same config keys with the same precedence here: an override (a command-line flag, a cluster setting) wins
over the config's active section, which wins over the dataclass defaults. ``overrides`` is any object with
an attribute per name (parsed flags); a missing or None attribute is unset. Cheap to import.
"""

from __future__ import annotations

from typing import Any


def knob_values(config, overrides: Any) -> dict[str, object]:
    """Knob key -> value set by ``overrides`` (an attribute per knob key, e.g. parsed flags; None: unset),
    else by the config's active section (unset knobs are absent)."""
    from engine.config import KNOBS

    values = dict(config.active.knob_values)
    for knob in KNOBS:
        given = getattr(overrides, knob.key, None)
        if given is not None:
            values[knob.key] = given
    return values


def knob_settings(owner: str, values: dict[str, object]) -> dict[str, object]:
    """The dataclass fields of ``owner`` (e.g. engine.config.ENGINE) that the knob values set, in field units."""
    from engine.config import KNOB_KEYS

    return {KNOB_KEYS[k].field: v * KNOB_KEYS[k].scale if KNOB_KEYS[k].scale != 1 else v
            for k, v in values.items() if KNOB_KEYS[k].owner == owner}


def token_cap(config, overrides: Any) -> int | None:
    """Semantic tokens per sentence at most: ``overrides.max_tokens_per_sentence``, else the config's
    ``max_tokens_per_sentence`` (test weight sets carry one: random weights rarely stop), else None."""
    return getattr(overrides, "max_tokens_per_sentence", None) or config.active.max_tokens_per_sentence or None


def engine_settings(config, overrides: Any, **settings):
    """``EngineSettings`` of a front door: the knobs (overrides over the config's keys), ``max_text_chars``
    and the fields given here. ``serve``, ``webui``, ``synth`` and every cluster replica build theirs here."""
    from engine.config import ENGINE
    from engine.options import EngineSettings

    if getattr(overrides, "max_text_chars", None) is not None:
        settings.setdefault("max_text_chars", overrides.max_text_chars)
    return EngineSettings(**{**knob_settings(ENGINE, knob_values(config, overrides)), **settings})


def warmup_settings(config, overrides: Any):
    """What the start-up warm-up does: the ``warmup`` knob of ``overrides`` (``--no-warmup``) over the config's."""
    from engine.config import WARMUP
    from engine.warmup import WarmupSettings

    return WarmupSettings(**knob_settings(WARMUP, knob_values(config, overrides)))
