"""The in-process ASGI bridge a replica serves forwarded requests with: status, headers, body chunks in
order, the request body delivered, a closed stream telling the app its client left."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import Request

from studio.cluster.asgi import ForwardedRequest, ResponseStart, serve_forwarded


def small_app(events: list[str]):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.get("/whole")
    async def whole(x: int = 0):
        return {"x": x}

    @app.post("/echo")
    async def echo(request: Request):
        return {"body": (await request.body()).decode(), "type": request.headers.get("content-type")}

    @app.get("/bad")
    async def bad():
        raise HTTPException(418, "short and stout")

    @app.get("/stream")
    async def stream(n: int = 3):
        async def chunks():
            try:
                for i in range(n):
                    yield f"chunk{i};".encode()
                    await asyncio.sleep(0.01)
            finally:
                events.append("stream closed")

        return StreamingResponse(chunks(), media_type="audio/wav", headers={"x-extra": "1"})

    return app


async def collect(app, request: ForwardedRequest, limit: int | None = None) -> list:
    out = []
    stream = serve_forwarded(app, request)
    async for message in stream:
        out.append(message)
        if limit is not None and len(out) >= limit:
            break
    await stream.aclose()
    return out


def test_whole_response_keeps_status_headers_and_body():
    out = asyncio.run(collect(small_app([]), ForwardedRequest("GET", "/whole", b"x=5")))
    start, *body = out
    assert isinstance(start, ResponseStart) and start.status == 200
    assert (b"content-type", b"application/json") in start.headers
    assert b"".join(body) == b'{"x":5}'


def test_request_body_and_headers_reach_the_app():
    request = ForwardedRequest("POST", "/echo", headers=((b"content-type", b"text/plain"),), body=b"hello")
    start, *body = asyncio.run(collect(small_app([]), request))
    assert start.status == 200
    assert b"".join(body) == b'{"body":"hello","type":"text/plain"}'


def test_errors_of_the_app_pass_through():
    start, *body = asyncio.run(collect(small_app([]), ForwardedRequest("GET", "/bad")))
    assert start.status == 418 and b"short and stout" in b"".join(body)


def test_streamed_chunks_arrive_one_by_one_in_order():
    start, *chunks = asyncio.run(collect(small_app([]), ForwardedRequest("GET", "/stream", b"n=4")))
    assert start.status == 200 and (b"x-extra", b"1") in start.headers
    assert chunks == [b"chunk0;", b"chunk1;", b"chunk2;", b"chunk3;"]


def test_closing_early_tells_the_app_its_client_left():
    events: list[str] = []
    out = asyncio.run(collect(small_app(events), ForwardedRequest("GET", "/stream", b"n=1000"), limit=2))
    assert len(out) == 2 and out[1] == b"chunk0;"
    assert events == ["stream closed"]  # the app's generator was stopped, not run to its 1000 chunks


def test_an_app_that_never_answers_gives_a_500():
    async def silent(scope, receive, send):
        return None

    start, *body = asyncio.run(collect(silent, ForwardedRequest("GET", "/")))
    assert start.status == 500 and b"no response" in b"".join(body)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_scope_names_method_path_and_query(method):
    seen = {}

    async def app(scope, receive, send):
        seen.update(method=scope["method"], path=scope["path"], query=scope["query_string"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    start, *body = asyncio.run(collect(app, ForwardedRequest(method, "/v1/voices/x", b"a=1")))
    assert start.status == 204 and body == []
    assert seen == {"method": method, "path": "/v1/voices/x", "query": b"a=1"}
