"""The page's endpoints take only files uploaded to this server: every endpoint with a file input, called
through Gradio's HTTP API with a server path (a file, a device, a FIFO) or a URL, gets the same refusal at
once, and the server keeps answering."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.support.synth import model_config

pytest.importorskip("gradio_client")

from tests.webui.test_server import _app, running_server  # noqa: E402
from webui.uploads import MAX_PATH_CHARS, REFUSAL, is_uploaded  # noqa: E402

FILE_COMPONENTS = ("Audio", "File")


@pytest.fixture(scope="module")
def page():
    app, _ = _app(model_config("v2"))
    with running_server(app) as url:
        yield url


def _call(url: str, api_name: str, data: list) -> str:
    """The SSE answer of one call through Gradio's HTTP API."""
    event = httpx.post(f"{url}/gradio_api/call/{api_name}", json={"data": data}, timeout=10).json()["event_id"]
    return httpx.get(f"{url}/gradio_api/call/{api_name}/{event}", timeout=10).text


def _file_endpoints(url: str) -> dict[str, list[dict]]:
    info = httpx.get(f"{url}/gradio_api/info", timeout=10).json()["named_endpoints"]
    return {name.lstrip("/"): ep["parameters"] for name, ep in info.items()
            if any(p["component"] in FILE_COMPONENTS for p in ep["parameters"])}


def test_every_file_input_refuses_server_paths_the_same_way(page, tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    endpoints = _file_endpoints(page)
    assert {"generate", "describe_reference"} <= set(endpoints)
    for name, params in endpoints.items():
        answers = {}
        for bad in ("/etc/passwd", "/dev/zero", str(fifo), str(loop), "http://127.0.0.1:9/x", "a/" * 80_000):
            file = {"path": bad, "meta": {"_type": "gradio.FileData"}}
            data = [(file if p["component"] == "Audio" else [file]) if p["component"] in FILE_COMPONENTS
                    else p.get("parameter_default") for p in params]
            start = time.perf_counter()
            answer = _call(page, name, data)
            assert time.perf_counter() - start < 5, (name, bad[:40])
            assert httpx.get(f"{page}/health", timeout=5).status_code == 200
            answers[bad] = answer
        # a name longer than the file system takes fails in Gradio's own static-file check first (ENAMETOOLONG):
        # refused too, in other words
        assert "event: error" in answers.pop("a/" * 80_000)
        assert len(set(answers.values())) == 1, (name, answers)
        answer = answers["/etc/passwd"]
        assert "event: error" in answer and REFUSAL in answer and "passwd" not in answer, answer


def test_is_uploaded_checks_the_folder_the_kind_and_the_length(tmp_path) -> None:
    root = tmp_path / "uploads"
    root.mkdir()
    clip = root / "clip.wav"
    clip.write_bytes(b"RIFF")
    outside = tmp_path / "outside.wav"
    outside.write_bytes(b"RIFF")
    (root / "escape.wav").symlink_to(outside)
    os.mkfifo(root / "fifo")
    roots = (root.resolve(),)
    assert is_uploaded(str(clip), roots)
    assert not is_uploaded(str(outside), roots)
    assert not is_uploaded(str(root / "escape.wav"), roots)  # a symlink out of the folder
    assert not is_uploaded(str(root / "fifo"), roots)
    assert not is_uploaded(str(root / "missing.wav"), roots)
    assert not is_uploaded(str(root) + "/" + "x" * MAX_PATH_CHARS, roots)
    assert not is_uploaded(str(clip) + "\ud800", roots)
    assert not is_uploaded(None, roots)


def test_admin_actions_need_a_login_or_this_machine() -> None:
    from webui.handlers import may_administer

    assert may_administer(None, "127.0.0.1") and may_administer(None, "::1")
    assert may_administer("alice", "203.0.113.7")
    assert not may_administer(None, "203.0.113.7") and not may_administer(None, None)
    assert not may_administer(None, "testclient")


def test_the_heartbeat_stream_needs_the_page_login() -> None:
    import asyncio
    from types import SimpleNamespace

    from webui.login_gate import PageLoginGate

    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = PageLoginGate(inner, SimpleNamespace(cookie_id="abc", tokens={"t0k": "alice"}))

    async def status(path: str, cookie: str | None = None) -> int:
        transport = httpx.ASGITransport(app=gate)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return (await c.get(path, headers={"cookie": cookie} if cookie else {})).status_code

    assert asyncio.run(status("/gradio_api/heartbeat/s1")) == 401
    assert asyncio.run(status("/gradio_api/heartbeat/s1", "access-token-abc=wrong")) == 401
    assert asyncio.run(status("/gradio_api/heartbeat/s1", "access-token-abc=t0k")) == 200
    assert asyncio.run(status("/gradio_api/heartbeat/s1", "access-token-unsecure-abc=t0k")) == 200
    assert asyncio.run(status("/gradio_api/info")) == 200  # Gradio's own login covers the rest
    assert seen == ["/gradio_api/heartbeat/s1", "/gradio_api/heartbeat/s1", "/gradio_api/info"]


def test_uploads_are_refused_while_the_folder_is_full(tmp_path) -> None:
    import asyncio

    from webui.upload_quota import UploadQuota, folder_usage

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    folder = tmp_path / "uploads"
    (folder / "a").mkdir(parents=True)
    for i in range(3):
        (folder / "a" / f"{i}.wav").write_bytes(b"x" * 100)
    assert folder_usage(str(folder), 10) == (3, 300)

    async def upload(gate) -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://127.0.0.1") as c:
            return (await c.post("/gradio_api/upload", files={"files": ("x.wav", b"RIFF")})).status_code

    assert asyncio.run(upload(UploadQuota(inner, str(folder), max_files=4, max_bytes=1000))) == 200
    assert asyncio.run(upload(UploadQuota(inner, str(folder), max_files=3, max_bytes=1000))) == 507
    assert asyncio.run(upload(UploadQuota(inner, str(folder), max_files=10, max_bytes=300))) == 507


def test_concurrent_uploads_cannot_overshoot_the_folder_quota(tmp_path) -> None:
    import asyncio

    from webui.upload_quota import UploadQuota, folder_usage

    folder = tmp_path / "uploads"
    folder.mkdir()

    state = {"arrived": 0, "release": None, "stored": 0}

    async def store(scope, receive, send):  # Gradio's upload route: read the body, write it, answer
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        state["arrived"] += 1
        await state["release"].wait()  # every upload is under way at once
        state["stored"] += 1
        (folder / f"{state['stored']}.bin").write_bytes(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = UploadQuota(store, str(folder), max_files=100, max_bytes=1000)

    async def main():
        state["release"] = asyncio.Event()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://127.0.0.1") as c:
            async def upload() -> int:
                return (await c.post("/gradio_api/upload", files={"files": ("x.wav", b"x" * 300)})).status_code

            tasks = [asyncio.create_task(upload()) for _ in range(10)]
            for _ in range(6000):  # until each upload reached the store or was refused
                await asyncio.sleep(0.005)
                if state["arrived"] + sum(t.done() for t in tasks) == 10:
                    break
            state["release"].set()
            first = await asyncio.gather(*tasks)
            return first, await upload()

    statuses, later = asyncio.run(main())
    files, size = folder_usage(str(folder), 100)
    assert size <= 1000, (statuses, size)  # 2f66d90: all ten passed the check on an empty folder, 4,450 bytes
    assert statuses.count(200) == 2 and statuses.count(507) == 8 and files == 2
    assert later == 507 and gate.held() == (0, 0)  # the stored files count now; nothing is held twice


def test_the_page_says_which_number_is_too_long() -> None:
    from engine.errors import TextError
    from engine.text.limits import check_user_text
    from webui.messages import user_message

    with pytest.raises(TextError) as e:
        check_user_text("1" * 40, "en")
    message = user_message(e.value, "en")
    assert "has 40 digits; at most 36" in message
