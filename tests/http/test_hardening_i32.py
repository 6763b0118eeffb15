"""Issue 32 (third hardening pass): one client must not hurt others or the host, on the HTTP side.

Each test reproduces a finding of the attack run on 2f66d90 and fails there. A scripted engine stands in for
the models (tests.http.test_hardening); requests run in process (ASGI) unless the connection itself matters.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from studio.http import bodies
from tests.http.test_hardening import ScriptedStudio, asgi, make_app, refs, tts_body

__all__ = ["refs"]


# ---- 10: a JSON body of a million keys --------------------------------------------------------------------


def test_a_json_body_of_a_million_keys_is_refused_before_it_is_parsed(tmp_path, refs, monkeypatch) -> None:
    parsed: list[int] = []
    loads = json.loads
    monkeypatch.setattr(bodies.json, "loads", lambda raw, *a, **k: (parsed.append(len(raw)), loads(raw, *a, **k))[1])
    app = make_app(ScriptedStudio(tmp_path), refs)
    keys = b"{" + b",".join(b'"k%d":0' % i for i in range(1_500_000)) + b"}"  # 16 MiB, under max_upload_bytes
    few = json.dumps({**tts_body(), **{f"x{i}": i for i in range(1000)}}).encode()

    async def calls(c):
        return (await c.post("/tts", content=keys, headers={"content-type": "application/json"}),
                await c.post("/v1/audio/speech", content=keys, headers={"content-type": "application/json"}),
                await c.post("/tts", content=few, headers={"content-type": "application/json"}))

    tts, speech, ok = asgi(app, calls)
    assert tts.status_code == 400 and "max_json_items" in tts.json()["message"], tts.text
    assert speech.status_code == 400 and "max_json_items" in speech.json()["error"]["message"], speech.text
    assert max(parsed) < len(keys) // 100  # 2f66d90 handed the 16 MiB body to json.loads (1.2 s under the GIL)
    assert ok.status_code == 200  # a body with a thousand unknown fields is still read


def test_the_json_item_bound_is_a_limit_with_a_floor(tmp_path, refs) -> None:
    from engine.errors import OptionsError
    from studio.http.limits import ServerLimits

    assert ServerLimits().max_json_items == bodies.DEFAULT_MAX_ITEMS
    with pytest.raises(OptionsError, match="max_json_items"):
        ServerLimits(max_json_items=0)
    with pytest.raises(OptionsError, match="max_json_items"):
        bodies.parse_json(b'{"a": [1, 2, 3, 4]}', 32, max_items=3)
    assert bodies.parse_json(b'{"a": [1, 2, 3]}', 32, max_items=3) == {"a": [1, 2, 3]}
