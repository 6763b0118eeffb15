"""Data tables read from the official code (phone symbols, frontend constants, defaults)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=None)
def load_json(name: str) -> Any:
    """A shipped data table by file name, e.g. ``load_json("symbols_v2.json")`` (cached, read-only use)."""
    return json.loads(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))
