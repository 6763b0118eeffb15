"""Failures answered one way: the proxy middleware turns a request whose gateway stopped (no response
started) into 503 + Retry-After in the path's error shape, and a replica's health check names a dead
scheduler. No Ray needed."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest

from studio.cluster.health import engine_problem, scheduler_problem
from studio.cluster.proxy import AnswerLostRequests


def run_through(app, path: str = "/tts", disconnect: bool = False) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        if disconnect:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def main():
        await AnswerLostRequests(app)({"type": "http", "method": "GET", "path": path}, receive, send)

    asyncio.run(main())
    return sent


async def silent_app(scope, receive, send):  # what Serve's proxy does when its ingress actor died
    return None


def test_a_request_left_unanswered_gets_503_with_retry_after_in_the_paths_error_shape():
    start, body = run_through(silent_app, "/tts")
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert "send the request again" in json.loads(body["body"])["message"]
    start, body = run_through(silent_app, "/v1/audio/speech")
    error = json.loads(body["body"])["error"]
    assert start["status"] == 503 and error["type"] == "server_error" and "send the request again" in error["message"]


def test_answered_requests_and_gone_clients_are_left_alone():
    async def answering(scope, receive, send):
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"app error"})

    assert [m.get("status") for m in run_through(answering)] == [500, None]  # the app's own answer, unchanged

    async def reads_then_leaves(scope, receive, send):
        await receive()

    assert run_through(reads_then_leaves, disconnect=True) == []  # nobody to answer


def finished_thread(name: str) -> threading.Thread:
    t = threading.Thread(target=lambda: None, name=name)
    t.start()
    t.join()
    return t


def test_a_scheduler_with_a_stopped_thread_is_dead_unless_it_was_closed():
    alive = threading.Event()
    running = threading.Thread(target=alive.wait, name="acoustic", daemon=True)
    running.start()
    try:
        healthy = SimpleNamespace(_closed=False, _threads=[running])
        dead = SimpleNamespace(_closed=False, _threads=[finished_thread("t2s-loop"), running])
        closed = SimpleNamespace(_closed=True, _threads=[finished_thread("t2s-loop")])
        assert scheduler_problem(healthy) == "" and scheduler_problem(closed) == ""
        assert "t2s-loop" in scheduler_problem(dead)
        assert engine_problem(SimpleNamespace(_schedulers={"a": healthy, "b": closed})) == ""
        assert "t2s-loop" in engine_problem(SimpleNamespace(_schedulers={"a": healthy, "b": dead}))
        assert "could not be rebuilt" in engine_problem(SimpleNamespace(_schedulers={}, serving_state="failed"))
    finally:
        alive.set()


class Remote:
    """A DeploymentHandle method's shape (``.remote(...)`` gives an awaitable) over a local coroutine."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from engine.testweights import make_test_weights

    return make_test_weights(tmp_path_factory.mktemp("weights"), "v2")


def bare_replica(weights, tmp_path, corrupt: bool):
    """A Synthesizer built as its async constructor builds it, minus Ray (a local ClusterState)."""
    import yaml

    from engine.studio import Studio
    from studio.cluster.config import ClusterConfig
    from studio.cluster.replica import Synthesizer
    from studio.cluster.routing import ModelSet
    from studio.cluster.state import ClusterState
    from studio.http.app import create_app

    path = weights
    if corrupt:  # the same set but a GPT file that is no checkpoint
        data = yaml.safe_load(weights.read_text())
        (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
        for section in data.values():  # the test set repeats its section as "v2"
            section["t2s_weights_path"] = str(tmp_path / "bad.ckpt")
        path = tmp_path / "tts_infer.yaml"
        path.write_text(yaml.safe_dump(data))
    config = ClusterConfig.load(None, {"infer_config": str(path), "voices_dir": str(tmp_path / "voices")})
    engine_config = config.engine_config()
    replica = Synthesizer.__new__(Synthesizer)
    replica.config, replica.replica_id, replica.problem = config, "r1", ""
    replica.studio = Studio.from_config(engine_config, settings=config.engine_settings(engine_config))
    replica.app = create_app(replica.studio, config.server_settings(engine_config))
    replica.context = replica.app.state.context
    replica._synced, replica._held, replica._reporter = None, {}, SimpleNamespace(done=lambda: False)
    w = replica.studio.default_weights
    state = ClusterState(ModelSet.of(w.gpt, w.sovits))
    replica.state = SimpleNamespace(defaults=Remote(state.defaults), wanted_sets=Remote(state.wanted_sets))
    announced: list[str] = []

    async def model_set(model_id: str) -> None:
        announced.append(model_id)

    replica.model_set = model_set
    return replica, engine_config, announced


def test_a_replica_warms_and_announces_its_default_set_then_fails_its_health_check_when_its_scheduler_dies(
        weights, tmp_path, monkeypatch):
    """Warm: the default set loaded, synthesised once (a scheduler made) and announced; healthy. Then the
    engine's own scheduler loses its threads while open (the state a crashed loop leaves): unhealthy."""
    from engine.warmup import WarmupSettings
    from studio.cluster.config import ClusterConfig

    # one language, a few tokens: the wiring under test, at a fraction of serve's warm-up (zh + en)
    monkeypatch.setattr(ClusterConfig, "warmup_settings",
                        lambda self, engine_config=None: WarmupSettings(languages=("en",), max_tokens=8))
    replica, engine_config, announced = bare_replica(weights, tmp_path, corrupt=False)

    async def main():
        replica._sync_lock = asyncio.Lock()
        await replica._warm_up(engine_config)
        await replica.check_health()

    asyncio.run(main())
    w = replica.studio.default_weights
    assert replica.problem == "" and announced == [json.dumps([str(w.gpt.resolve()), str(w.sovits.resolve())])]
    (sched,) = replica.studio._schedulers.values()
    assert engine_problem(replica.studio) == ""
    sched.close()  # its threads end ...
    sched._closed = False  # ... but it does not say closed
    with pytest.raises(RuntimeError, match="t2s-loop"):
        asyncio.run(replica.check_health())


def test_default_weights_that_fail_to_load_fail_the_health_check(weights, tmp_path):
    replica, engine_config, announced = bare_replica(weights, tmp_path, corrupt=True)

    async def main():
        replica._sync_lock = asyncio.Lock()
        await replica._warm_up(engine_config)
        await replica.check_health()

    with pytest.raises(RuntimeError, match="cannot serve: the default weights failed to load"):
        asyncio.run(main())
    assert announced == []


def test_serves_proxy_accepts_the_middleware_callback_the_launcher_names():
    pytest.importorskip("ray.serve", reason="the [cluster] extra (ray[serve]) is not installed")
    from ray.serve._private.http_util import validate_http_proxy_callback_return
    from ray.serve._private.utils import call_function_from_import_path

    from studio.cluster.launch import PROXY_CALLBACK

    (middleware,) = validate_http_proxy_callback_return(call_function_from_import_path(PROXY_CALLBACK))
    assert middleware.cls is AnswerLostRequests
