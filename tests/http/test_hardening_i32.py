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


def test_any_route_gets_the_json_item_bound_before_its_parser(tmp_path, refs) -> None:
    from starlette.responses import JSONResponse

    app = make_app(ScriptedStudio(tmp_path), refs, max_json_items=1000)

    async def echo(request):  # a route that parses its body on the event loop, as the page's own routes do
        return JSONResponse({"keys": len(await request.json())})

    app.router.add_route("/echo", echo, methods=["POST"])
    from starlette.applications import Starlette
    from starlette.routing import Route

    app.mount("/page", Starlette(routes=[Route("/echo", echo, methods=["POST"])]))  # a mounted app, as the page is

    small = json.dumps({f"k{i}": i for i in range(400)}).encode()
    large = json.dumps({f"k{i}": i for i in range(600)}).encode()

    async def calls(c):
        async def pieces():  # the body in 10 pieces, without a declared length
            for i in range(0, len(large), len(large) // 10 + 1):
                yield large[i:i + len(large) // 10 + 1]

        return (await c.post("/echo", content=small, headers={"content-type": "application/json"}),
                await c.post("/echo", content=large, headers={"content-type": "application/json"}),
                await c.post("/echo", content=pieces(), headers={"content-type": "application/json"}),
                await c.post("/page/echo", content=large, headers={"content-type": "application/json"}))

    ok, refused, streamed, mounted = asgi(app, calls)
    assert ok.status_code == 200 and ok.json() == {"keys": 400}, ok.text
    for r in (refused, streamed, mounted):  # 2f66d90: parsed (200), on the event loop
        assert r.status_code == 400 and "max_json_items" in r.json()["message"], r.text


def test_the_json_item_bound_is_a_limit_with_a_floor(tmp_path, refs) -> None:
    from engine.errors import OptionsError
    from studio.http.limits import ServerLimits

    assert ServerLimits().max_json_items == bodies.DEFAULT_MAX_ITEMS
    with pytest.raises(OptionsError, match="max_json_items"):
        ServerLimits(max_json_items=0)
    with pytest.raises(OptionsError, match="max_json_items"):
        bodies.parse_json(b'{"a": [1, 2, 3, 4]}', 32, max_items=3)
    assert bodies.parse_json(b'{"a": [1, 2, 3]}', 32, max_items=3) == {"a": [1, 2, 3]}


# ---- 10: slow senders from one address ---------------------------------------------------------------------


def _scope(client: tuple[str, int], body_length: int) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/tts", "raw_path": b"/tts", "root_path": "", "query_string": b"", "client": client,
            "server": ("127.0.0.1", 9880),
            "headers": [(b"host", b"127.0.0.1:9880"), (b"content-type", b"application/json"),
                        (b"content-length", str(body_length).encode())]}


def test_slow_senders_from_one_address_cannot_take_every_place(tmp_path, refs) -> None:
    app = make_app(ScriptedStudio(tmp_path), refs, workers=1, max_queue=10)  # 11 places
    body = json.dumps(tts_body()).encode()

    async def main():
        stop = asyncio.Event()
        answers: list[list[dict]] = []

        async def slow_sender(port: int) -> None:  # sends the first byte of its body, then nothing
            sent: list[dict] = []
            answers.append(sent)
            pieces = iter([{"type": "http.request", "body": body[:1], "more_body": True}])

            async def receive():
                piece = next(pieces, None)
                if piece is None:
                    await stop.wait()
                    return {"type": "http.disconnect"}
                return piece

            async def send(message):
                sent.append(message)

            await app(_scope(("10.0.0.1", port), len(body)), receive, send)

        slow = [asyncio.create_task(slow_sender(40000 + i)) for i in range(12)]
        for _ in range(3000):  # until each slow sender holds a place or has its answer
            await asyncio.sleep(0.01)
            if app.state.context.admission.active + sum(1 for a in answers if a) == 12:
                break
        held = sum(1 for a in answers if not a)  # still sending, admitted
        transport = httpx.ASGITransport(app=app, client=("10.0.0.2", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9880", timeout=30) as c:
            normal = [(await c.post("/tts", content=body, headers={"content-type": "application/json"})).status_code
                      for _ in range(3)]
        stop.set()
        await asyncio.gather(*slow)
        refused = [a for a in answers if a and a[0]["type"] == "http.response.start" and a[0]["status"] == 503]
        return held, normal, refused

    held, normal, refused = asyncio.run(main())
    assert normal == [200, 200, 200]  # 2f66d90: eleven slow senders held all eleven places: 503, 503, 503
    assert held == 8  # max_uploads_per_client
    assert len(refused) == 4
    assert any(b"max_uploads_per_client" in m.get("body", b"") for a in refused for m in a)
    assert all((b"retry-after", b"1") in a[0]["headers"] for a in refused)


# ---- 3: one decoding budget for the process --------------------------------------------------------------


def test_an_upload_over_the_process_decoding_budget_is_a_503_with_retry_after(tmp_path, refs) -> None:
    import io

    import soundfile as sf

    from engine.decode_budget import process_decode_budget
    from tests.core.test_audio_budget import _tone

    buf = io.BytesIO()
    sf.write(buf, _tone(4.0, 384000, 8) * 0.1, 384000, format="FLAC", subtype="PCM_16")  # 8 ch at 384 kHz
    app = make_app(ScriptedStudio(tmp_path), refs, decode_budget_bytes=200 << 20)
    budget = process_decode_budget()
    assert budget.max_bytes == 200 << 20  # the server sizes the one budget of its process
    form = {"name": "surround", "prompt_text": "Hello.", "prompt_lang": "en"}

    async def calls(c):
        with budget.reserve(170 << 20, "other uploads"):  # the clip needs 47 MiB
            busy = await c.post("/v1/voices", data=form, files={"audio": ("s.flac", buf.getvalue())})
        return busy, await c.post("/v1/voices", data=form, files={"audio": ("s.flac", buf.getvalue())})

    busy, after = asgi(app, calls)
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text  # 2f66d90: decoded anyway
    assert "decode_budget_bytes" in busy.json()["error"]["message"]
    assert after.status_code == 201, after.text  # the same clip once the room is back
    assert budget.in_use == 0


# ---- 7: saved voices -----------------------------------------------------------------------------------------


def test_the_voice_quota_is_the_servers_limit(tmp_path, refs) -> None:
    from tests.http.test_profiles import _with_junk
    from tests.support.server import reference_wav

    app = make_app(ScriptedStudio(tmp_path), refs, max_profiles_bytes=300_000, max_profiles=8)
    form = {"prompt_text": "Hello.", "prompt_lang": "en"}

    async def calls(c):
        return [await c.post("/v1/voices", data={**form, "name": f"v{i}"},
                             files={"audio": ("v.wav", _with_junk(reference_wav(i), 5 << 20))}) for i in range(4)]

    answers = asgi(app, calls)
    assert [a.status_code for a in answers] == [201, 201, 400, 400], [a.text for a in answers]  # 112 KiB each
    assert "max_profiles_bytes" in answers[2].json()["error"]["message"]
    stored = sum(p.stat().st_size for p in (refs.parent / "voices").rglob("*") if p.is_file())
    assert stored <= 300_000  # 2f66d90 kept every 5 MiB upload whole, with no bound in bytes


# ---- 4: a body that arrives after SIGTERM ---------------------------------------------------------------------


@pytest.mark.parametrize("path, body", [("/tts", tts_body()), ("/tts", tts_body(streaming_mode=1)),
                                        ("/tts", tts_body(streaming_mode=2)),
                                        ("/v1/audio/speech", {"input": "Hi.", "voice": "nobody"})])
def test_a_body_that_arrives_after_sigterm_gets_503_with_retry_after(tmp_path, refs, path, body) -> None:
    studio = ScriptedStudio(tmp_path)
    app = make_app(studio, refs, workers=1, max_queue=4)
    raw = json.dumps(body).encode()

    async def main():
        rest = asyncio.Event()
        pieces = iter([{"type": "http.request", "body": raw[:5], "more_body": True}])
        sent: list[dict] = []

        tail = iter([{"type": "http.request", "body": raw[5:], "more_body": False}])

        async def receive():
            piece = next(pieces, None)
            if piece is not None:
                return piece
            await rest.wait()  # the rest of the body comes after SIGTERM
            piece = next(tail, None)
            if piece is not None:
                return piece
            await asyncio.Event().wait()  # then nothing more: the client waits for its answer

        async def send(message):
            sent.append(message)

        scope = {**_scope(("10.0.0.3", 40000), len(raw)), "path": path, "raw_path": path.encode()}
        call = asyncio.create_task(app(scope, receive, send))
        for _ in range(3000):  # until the request is admitted and waits for the rest of its body
            await asyncio.sleep(0.01)
            if app.state.context.admission.active == 1:
                break
        app.state.context.drain()  # what SIGTERM does first (studio.http.lifecycle.DrainingServer)
        rest.set()
        await asyncio.wait_for(call, 30)
        return sent

    sent = asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_bytes = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 503, body_bytes  # 2f66d90: 500 "internal error"
    assert dict(start["headers"]).get(b"retry-after") == b"1" and b"shutting down" in body_bytes
    assert studio.steps == 0


# ---- 10: clips with absurd samples ------------------------------------------------------------------------------


def test_clips_with_absurd_samples_are_a_clear_400(tmp_path, refs) -> None:
    import io

    import numpy as np
    import soundfile as sf

    from tests.core.test_audio_budget import _tone

    def wav(x: np.ndarray) -> bytes:
        buf = io.BytesIO()
        sf.write(buf, x, 16000, format="WAV", subtype="FLOAT")
        return buf.getvalue()

    speech = _tone(4.0, 16000)[:, 0]
    spikes, nan = speech.copy(), speech.copy()
    spikes[::1000] = 1e30
    nan[100] = np.nan
    clips = {"spikes": (wav(spikes), "samples of 1e+30"), "negative": (wav(-np.abs(spikes)), "samples of 1e+30"),
             "nan": (wav(nan), "NaN or infinite samples"), "dc": (wav(np.full(64000, 0.5, np.float32)), "constant level")}
    app = make_app(ScriptedStudio(tmp_path), refs)
    form = {"prompt_text": "Hello.", "prompt_lang": "en"}

    async def calls(c):
        return {name: await c.post("/v1/voices", data={**form, "name": name}, files={"audio": ("c.wav", clip)})
                for name, (clip, _) in clips.items()}

    answers = asgi(app, calls)
    for name, (_, says) in clips.items():  # 2f66d90: spikes, negative and dc were saved (201)
        r = answers[name]
        assert r.status_code == 400 and r.json()["error"]["param"] == "audio", (name, r.text)
        assert says in r.json()["error"]["message"], (name, r.text)
