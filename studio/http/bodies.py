"""Reading request bodies with one rule: anything malformed is a 400 that names the part at fault, raised
before any work starts (never a parser's exception, never its text in the answer).

JSON: UTF-8 (or the UTF-16/32 that ``json`` detects), at most ``max_depth`` levels of nesting, one
object, at most ``max_items`` separators (``,`` and ``:``, a bound on its members and items) counted before
the parser runs: the parser holds the interpreter lock, so a body of a million keys would stall every other
request for a second even on a worker thread (the guard counts them too, as the body arrives, for every route).
Forms: multipart or urlencoded, a bounded number of fields and files, every text field UTF-8. The size and
read-time limits of the whole body are the guard's (:mod:`studio.http.guard`).
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import OptionsError

BODY = "request body"
DEFAULT_MAX_ITEMS = 100_000  # ServerLimits.max_json_items


def parse_json(raw: bytes, max_depth: int, max_items: int = DEFAULT_MAX_ITEMS) -> dict[str, Any]:
    """One JSON object from ``raw``; OptionsError (field ``request body``) for anything else."""
    if not raw.strip():
        raise OptionsError("expected a JSON object, got an empty body", field=BODY)
    items = raw.count(b",") + raw.count(b":")  # C loops over the bytes: milliseconds for the largest body
    if items > max_items:
        raise OptionsError(f"JSON with {items} ',' and ':' separators; at most {max_items} are parsed "
                           "(max_json_items); send the named fields only", field=BODY)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise OptionsError(f"JSON nested deeper than {max_depth} levels", field=BODY) from None
    except UnicodeDecodeError:
        raise OptionsError("not UTF-8 text; send JSON encoded as UTF-8", field=BODY) from None
    except json.JSONDecodeError as e:
        raise OptionsError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", field=BODY) from None
    except ValueError:  # e.g. an integer of more digits than Python converts
        raise OptionsError("not valid JSON (a value is out of range: a number with too many digits?)",
                           field=BODY) from None
    if _depth(data) > max_depth:
        raise OptionsError(f"JSON nested deeper than {max_depth} levels", field=BODY)
    if not isinstance(data, dict):
        raise OptionsError("expected a JSON object of named fields", field=BODY)
    return data


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item if isinstance(v, (dict, list)))
    return deepest


async def read_json(request, max_depth: int, max_items: int = DEFAULT_MAX_ITEMS) -> dict[str, Any]:
    """The body parsed on a worker thread, after the bound on its items (see the module docstring)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(parse_json, await request.body(), max_depth, max_items)


def is_form(request) -> bool:
    ctype = request.headers.get("content-type", "").lower()
    return ctype.startswith("multipart/form-data") or ctype.startswith("application/x-www-form-urlencoded")


async def read_form(request, max_files: int, max_fields: int):
    """The parsed form (close it when done); OptionsError for a malformed body, too many parts or a
    text field that is not UTF-8."""
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    try:
        form = await request.form(max_files=max_files, max_fields=max_fields)
    except MultiPartException as e:  # starlette's own limits and checks: plain sentences of its own
        raise OptionsError(str(e), field=BODY) from None
    except HTTPException as e:  # the same, as starlette reports them inside an app
        if e.status_code != 400:
            raise
        raise OptionsError(str(e.detail), field=BODY) from None
    except (ValueError, KeyError, AssertionError) as e:  # python-multipart's parse errors, bad encodings
        raise OptionsError(f"malformed form data ({_kind(e)}); send multipart/form-data with a boundary",
                           field=BODY) from None
    return form


def _kind(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):
        return "a field is not UTF-8"
    return "the multipart structure cannot be parsed"
