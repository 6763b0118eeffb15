"""Without an API key the server serves this machine's names only: DNS rebinding (a Host that is a
registered domain) and cross-site browser requests (Origin, Sec-Fetch-Site) get 403; with a key, the key
decides."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from studio.http.auth import Access
from studio.http.context import ServerSettings
from studio.http.origins import host_allowed, origin_refusal
from tests.http.test_hardening import KEY, ScriptedStudio, refs

__all__ = ["refs"]


@pytest.mark.parametrize("host, ok", [("127.0.0.1:9880", True), ("[::1]:9880", True), ("localhost:9880", True),
                                      ("myhost", True), ("app.localhost", True), ("10.0.0.5", True),
                                      ("evil.example:9880", False), ("127.0.0.1.nip.io", False)])
def test_hosts(host, ok) -> None:
    assert host_allowed(host) is ok


def test_origins_and_fetch_sites() -> None:
    local = {b"host": b"127.0.0.1:9880"}
    assert origin_refusal(local) is None
    assert origin_refusal({**local, b"origin": b"http://127.0.0.1:9880"}) is None  # the page itself
    assert origin_refusal({**local, b"sec-fetch-site": b"same-origin"}) is None
    assert "another web site" in origin_refusal({**local, b"origin": b"https://evil.example"})
    assert "another web site" in origin_refusal({**local, b"sec-fetch-site": b"cross-site"})  # an <img src=...>
    assert "DNS rebinding" in origin_refusal({b"host": b"evil.example:9880"})
    assert origin_refusal({b"host": b"studio.lan"}, allowed=("studio.lan",)) is None
    share = {b"host": b"abc123.gradio.live", b"origin": b"https://abc123.gradio.live"}
    assert origin_refusal(share, allowed=(".gradio.live",)) is None
    assert origin_refusal(share) is not None
    assert origin_refusal({b"host": b"gradio.live.evil.example"}, allowed=(".gradio.live",)) is not None


@pytest.mark.parametrize("origin", [b"null", b"NULL", b" null"])
def test_an_opaque_origin_is_refused(origin) -> None:
    # a sandboxed iframe, a file: page or a redirect sends `Origin: null`: 2f66d90 served it as a script
    why = origin_refusal({b"host": b"127.0.0.1:9880", b"origin": origin})
    assert why is not None and "null" in why and "--api-key" in why


def test_the_server_refuses_a_web_page_without_a_key_and_lets_the_key_decide(tmp_path, refs) -> None:
    from studio.http.app import create_app
    from studio.http.limits import ServerLimits

    def app(access=Access()):
        return create_app(ScriptedStudio(tmp_path), ServerSettings(reference_roots=(str(refs),), access=access,
                                                                   limits=ServerLimits()))

    async def calls(application, headers):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url="http://127.0.0.1:9880") as c:
            return [(await c.get(path, params=params, headers=headers)).status_code
                    for path, params in (("/health", None), ("/set_gpt_weights", {"weights_path": "x.ckpt"}))]

    assert asyncio.run(calls(app(), {})) == [200, 400]  # a script (no browser headers) keeps working
    assert asyncio.run(calls(app(), {"sec-fetch-site": "cross-site"})) == [403, 403]
    assert asyncio.run(calls(app(), {"host": "evil.example:9880"})) == [403, 403]
    assert asyncio.run(calls(app(), {"origin": "null"})) == [403, 403]
    keyed = app(Access(api_keys=(KEY,)))
    assert asyncio.run(calls(keyed, {"sec-fetch-site": "cross-site", "x-api-key": KEY})) == [200, 400]
    assert asyncio.run(calls(keyed, {"sec-fetch-site": "cross-site"})) == [401, 401]
