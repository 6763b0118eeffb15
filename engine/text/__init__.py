"""Text frontend: normalisation, sentence splitting, g2p per language, phone symbols, BERT features.

Public names are imported lazily so that `import engine.text.symbols` stays cheap.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "cleaned_text_to_sequence": "engine.text.symbols",
    "symbol_to_id": "engine.text.symbols",
    "clean_text": "engine.text.cleaner",
    "TextFrontend": "engine.text.frontend",
    "TextFeatures": "engine.text.frontend",
    "Segment": "engine.text.frontend",
    "get_phones_and_bert": "engine.text.frontend",
    "languages": "engine.text.frontend",
    "BertFeatureExtractor": "engine.text.bert",
    "preprocess": "engine.text.segment",
    "pre_seg_text": "engine.text.segment",
    "get_method": "engine.text.segment",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.text' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
