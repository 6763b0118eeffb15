"""SoVITS Studio inference engine for GPT-SoVITS models.

Public names (imported on first use, so ``import engine`` stays cheap)::

    from engine import Studio, Reference, SynthesisOptions, join
    studio = Studio.from_config("tts_infer.yaml")
    rate, audio = join(studio.synthesize("Hello.", "en", Reference("ref.wav", "Its transcript.", "en")))
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Studio": "engine.studio",
    "VoiceCloner": "engine.cloner",
    "Reference": "engine.reference",
    "Result": "engine.results",
    "join": "engine.results",
    "SynthesisOptions": "engine.options",
    "EngineSettings": "engine.options",
    "load_config": "engine.config",
    "resolve_runtime": "engine.runtime",
    "EngineError": "engine.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
