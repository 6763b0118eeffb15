"""Phone symbol tables (v1: 322 symbols, v2: 732) and phone -> id mapping, in the official id order.

The tables are data (``engine/data/symbols_v1.json`` / ``symbols_v2.json``). Every model version other than
v1 (v2, v2Pro, v2ProPlus, v3, v4) uses the v2 table; the v1 table is an exact prefix of it.
"""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Iterable, Mapping

from engine.data import load_json
from engine.errors import ConfigError, TextError
from engine.versions import VERSIONS

# The g2p punctuation set shared by the zh / ja / yue / en frontends (official `text.symbols.punctuation`).
PUNCTUATION = ("!", "?", "…", ",", ".", "-")

UNKNOWN = "UNK"


def table_name(version: str) -> str:
    """'v1' or 'v2': which symbol table a model version uses (raises ConfigError for unknown versions)."""
    if version not in VERSIONS:
        raise ConfigError(f"unknown model version {version!r}; expected one of {', '.join(VERSIONS)}")
    return "v1" if version == "v1" else "v2"


@lru_cache(maxsize=None)
def _symbols(table: str) -> tuple[str, ...]:
    return tuple(load_json(f"symbols_{table}.json"))


@lru_cache(maxsize=None)
def _ids(table: str) -> Mapping[str, int]:
    return MappingProxyType({s: i for i, s in enumerate(_symbols(table))})


def symbols(version: str = "v2") -> tuple[str, ...]:
    """The symbol table of a model version; the phone id is the index."""
    return _symbols(table_name(version))


def symbol_to_id(version: str = "v2") -> Mapping[str, int]:
    """Read-only phone -> id mapping of a model version."""
    return _ids(table_name(version))


def cleaned_text_to_sequence(phones: Iterable[str], version: str = "v2") -> list[int]:
    """Phone strings -> ids in the version's table (TextError names the first phone not in the table)."""
    ids = symbol_to_id(version)
    out = []
    for ph in phones:
        i = ids.get(ph)
        if i is None:
            raise TextError(f"phone {ph!r} is not in the {table_name(version)} symbol table; run clean_text first")
        out.append(i)
    return out


def sequence_to_phones(phone_ids: Iterable[int], version: str = "v2") -> list[str]:
    """The inverse of `cleaned_text_to_sequence`."""
    table = symbols(version)
    out = []
    for i in phone_ids:
        if not 0 <= int(i) < len(table):
            raise TextError(f"phone id {i} is outside the {table_name(version)} table (size {len(table)})")
        out.append(table[int(i)])
    return out
