"""The cluster end to end on this machine: its own local Ray (loopback, free ports, its own session folder
and namespace, 2 CPUs, a small object store), two CPU replicas, two gateways and tiny random weights. The
oracle is `sovits-studio serve` over the same files: the cluster must give the same bytes for the same
request and seed. Neither is given a token cap: both read the config's ``max_tokens_per_sentence``.

Slow (Ray and two warmed replicas start in about a minute on two cores; each killed part's replacement
takes a while more); `.ci/run` runs it with the rest.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.paths import REPO
from tests.support.server import MAX_TOKENS, free_port, reference_wav

pytestmark = pytest.mark.slow
pytest.importorskip("ray.serve", reason="the [cluster] extra (ray[serve]) is not installed")

TIMEOUT = httpx.Timeout(180.0)
PROMPT = {"prompt_text": "Hello.", "prompt_lang": "en"}
TOKENS_PER_SECOND = 25  # semantic tokens per second of audio
FRESH_REFERENCES = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Tiny v2 weights (the default set) whose config caps sentences at MAX_TOKENS, a second set beside
    them, a reference clip, a voices folder."""
    from engine.testweights import make_test_weights
    from engine.testweights.sovits import write_sovits
    from engine.testweights.t2s import write_t2s

    root = tmp_path_factory.mktemp("cluster")
    config = make_test_weights(root / "weights", "v2")
    data = yaml.safe_load(config.read_text())
    for section in data.values():
        section["max_tokens_per_sentence"] = MAX_TOKENS  # the cap every front door must read from here
    config.write_text(yaml.safe_dump(data))
    folder = Path(data["custom"]["t2s_weights_path"]).parent
    refs = root / "refs"
    refs.mkdir()
    (refs / "ref.wav").write_bytes(reference_wav(3))
    for i in range(FRESH_REFERENCES):  # voices no replica has seen: a warm replica still computes their features
        (refs / f"fresh{i}.wav").write_bytes(reference_wav(100 + i))
    return {"config": config, "weights": folder, "gpt2": write_t2s(folder / "other.ckpt", "v2", seed=1),
            "sovits2": write_sovits(folder / "other.pth", "v2", seed=1), "refs": refs, "voices": root / "voices"}


@pytest.fixture(scope="module")
def serve_process(files):
    """`sovits-studio serve` over the same files, with no token cap flag (the oracle), and one CPU thread as
    a replica of one CPU has (Ray sets OMP_NUM_THREADS from num_cpus; other thread counts round a few
    samples apart). It starts while the cluster does; :func:`serve` waits for it."""
    port = free_port()
    command = [sys.executable, "-c", "import sys; from studio.cli import main; sys.exit(main())", "serve", "-c",
               str(files["config"]), "-p", str(port), "--reference-dir", str(files["refs"]), "--weights-dir",
               str(files["weights"]), "--profiles-dir", str(files["voices"])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def running(files, serve_process):
    """The deployed cluster: a Ray of its own (free ports, a short session folder, a namespace of its own:
    it starts and passes beside another Ray instance on this machine)."""
    from studio.cluster.config import ClusterConfig
    from studio.cluster.launch import deploy

    session = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    config = ClusterConfig.load(None, {
        "infer_config": str(files["config"]), "replicas": 2, "cpus_per_replica": 1, "num_cpus": 2,
        "object_store_mb": 100, "port": free_port(), "voices_dir": str(files["voices"]),
        "reference_dirs": [str(files["refs"])], "weight_dirs": [str(files["weights"])],
        "report_interval_s": 0.5, "max_model_sets": 2, "temp_dir": session,
        # the dashboard costs ~20 s of start-up on two busy cores; test_parts checks it is asked for
        "dashboard": False, "namespace": f"sovits-test-{uuid.uuid4().hex[:8]}"})
    start = time.monotonic()
    cluster = deploy(config, quiet=True)
    print(f"\ncluster up (2 warmed replicas, 2 gateways) in {time.monotonic() - start:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(session, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(running) -> str:
    return running.url


@pytest.fixture(scope="module")
def serve(serve_process) -> str:
    process, url = serve_process

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"serve exited: {process.stderr.read().decode()[-2000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=2).json().get("status") == "ready"
        except (httpx.TransportError, ValueError):
            return False

    wait_for(ready, 180, "sovits-studio serve to start")
    return url


def query(files, text: str = "Hi there.", seed: int = 7, other: bool = False, **extra) -> dict:
    q = {"text": text, "text_lang": "en", "ref_audio_path": str(files["refs"] / "ref.wav"), **PROMPT,
         "text_split_method": "cut5", "media_type": "wav", "seed": seed, **extra}
    if other:
        q.update(gpt_weights_path=str(files["gpt2"]), sovits_weights_path=str(files["sovits2"]))
    return q


def health(url: str) -> dict:
    r = httpx.get(f"{url}/health", timeout=TIMEOUT)
    return r.json()


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_two_model_sets_answer_and_each_set_stays_on_the_replica_that_loaded_it(cluster, serve, files):
    """Both replicas warmed the default set before taking traffic; a second set is loaded by one of them
    and its later requests go there (routing by model set); every answer equals `serve`'s."""
    assert all(len(r["model_sets"]) == 1 for r in health(cluster)["replicas"])  # the default set, warmed
    a = httpx.get(f"{cluster}/tts", params=query(files), timeout=TIMEOUT)
    assert a.status_code == 200, a.text
    b = httpx.get(f"{cluster}/tts", params=query(files, other=True), timeout=TIMEOUT)
    assert b.status_code == 200, b.text
    holder = b.headers["x-sovits-replica"]
    gpt2 = str(files["gpt2"].resolve())
    wait_for(lambda: any(r["replica"] == holder and gpt2 in {m["gpt"] for m in r["model_sets"]}
                         for r in health(cluster)["replicas"]), 30, "the replica to report the second set")
    time.sleep(1.0)  # Serve's routers learn which replica holds which set
    assert a.content != b.content  # two different voices
    for params, first in ((query(files), a), (query(files, other=True), b)):
        again = httpx.get(f"{cluster}/tts", params=params, timeout=TIMEOUT)
        assert again.content == first.content
        direct = httpx.get(f"{serve}/tts", params=params, timeout=TIMEOUT)
        assert direct.status_code == 200 and direct.content == first.content  # the same answer as `serve`
    for _ in range(3):
        again = httpx.get(f"{cluster}/tts", params=query(files, other=True), timeout=TIMEOUT)
        assert again.headers["x-sovits-replica"] == holder  # routed by model set


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_every_streaming_mode_equals_serve(cluster, serve, files, mode):
    params = query(files, "Hi there. How are you?", seed=11, streaming_mode=mode)
    got = httpx.get(f"{cluster}/tts", params=params, timeout=TIMEOUT)
    want = httpx.get(f"{serve}/tts", params=params, timeout=TIMEOUT)
    assert got.status_code == want.status_code == 200, got.text
    assert got.headers["content-type"] == want.headers["content-type"]
    assert got.content == want.content


def test_post_json_multipart_and_errors_equal_serve(cluster, serve, files):
    body = query(files, seed=5, other=True)
    for url in (cluster, serve):
        assert httpx.post(f"{url}/tts", json=body, timeout=TIMEOUT).status_code == 200
    assert (httpx.post(f"{cluster}/tts", json=body, timeout=TIMEOUT).content
            == httpx.post(f"{serve}/tts", json=body, timeout=TIMEOUT).content)
    fields = {k: str(v) for k, v in body.items() if k != "ref_audio_path"}
    files_ = {"ref_audio": ("mine.wav", (files["refs"] / "ref.wav").read_bytes(), "audio/wav")}
    got = httpx.post(f"{cluster}/tts", data=fields, files=files_, timeout=TIMEOUT)
    want = httpx.post(f"{serve}/tts", data=fields, files=files_, timeout=TIMEOUT)
    assert got.status_code == want.status_code == 200 and got.content == want.content
    for bad in ({"text": ""}, {"gpt_weights_path": "/etc/passwd"}, {"text_lang": "xx"}):
        got = httpx.post(f"{cluster}/tts", json={**body, **bad}, timeout=TIMEOUT)
        want = httpx.post(f"{serve}/tts", json={**body, **bad}, timeout=TIMEOUT)
        assert got.status_code == want.status_code == 400
        assert {**got.json(), "request_id": ""} == {**want.json(), "request_id": ""}  # each request has its own id


def test_saved_voices_are_shared_and_speech_equals_serve(cluster, serve, files):
    clip = (files["refs"] / "ref.wav").read_bytes()
    made = httpx.post(f"{cluster}/v1/voices", data={"name": "alice", **PROMPT},
                      files={"audio": ("alice.wav", clip, "audio/wav")}, timeout=TIMEOUT)
    assert made.status_code == 201, made.text
    try:
        for _ in range(4):  # whichever replica answers reads the same folder
            assert [v["name"] for v in httpx.get(f"{cluster}/v1/voices", timeout=TIMEOUT).json()["voices"]] == ["alice"]
        speech = {"model": "tts-1", "input": "Hi there.", "voice": "alice", "response_format": "wav", "seed": 3}
        got = httpx.post(f"{cluster}/v1/audio/speech", json=speech, timeout=TIMEOUT)
        want = httpx.post(f"{serve}/v1/audio/speech", json=speech, timeout=TIMEOUT)
        assert got.status_code == want.status_code == 200, got.text
        assert got.content == want.content
        missing = httpx.post(f"{cluster}/v1/audio/speech", json={**speech, "voice": "bob"}, timeout=TIMEOUT)
        assert missing.status_code == 404 and "bob" in missing.json()["error"]["message"]
    finally:
        assert httpx.delete(f"{cluster}/v1/voices/alice", timeout=TIMEOUT).status_code == 200


def test_set_weights_changes_the_default_of_every_replica(cluster, files):
    """After /set_gpt_weights, requests naming no GPT weights use the new ones, whichever replica (and
    model set) they land on: the default set's replica and the second set's replica both follow."""
    before = health(cluster)["default_weights"]
    gpt2 = {"gpt_weights_path": str(files["gpt2"])}
    explicit = httpx.get(f"{cluster}/tts", params=query(files, seed=9, **gpt2), timeout=TIMEOUT)
    explicit_b = httpx.get(f"{cluster}/tts", params=query(files, seed=9, other=True), timeout=TIMEOUT)
    r = httpx.get(f"{cluster}/set_gpt_weights", params={"weights_path": str(files["gpt2"])}, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json() == {"message": "success"}
    try:
        assert health(cluster)["default_weights"]["gpt"] == str(files["gpt2"].resolve())
        for _ in range(3):
            r = httpx.get(f"{cluster}/tts", params=query(files, seed=9), timeout=TIMEOUT)
            assert r.status_code == 200 and r.content == explicit.content
        # naming only the second SoVITS file: the second model set, on its own replica, with the new GPT default
        r = httpx.get(f"{cluster}/tts", params=query(files, seed=9, sovits_weights_path=str(files["sovits2"])),
                      timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == explicit_b.content
        assert r.headers["x-sovits-replica"] == explicit_b.headers["x-sovits-replica"]
        bad = httpx.get(f"{cluster}/set_sovits_weights", params={"weights_path": "/etc/passwd"}, timeout=TIMEOUT)
        assert bad.status_code == 400 and "is not a weight file in the server's weight folders" in bad.text
        assert health(cluster)["default_weights"]["sovits"] == before["sovits"]
    finally:
        r = httpx.get(f"{cluster}/set_gpt_weights", params={"weights_path": before["gpt"]}, timeout=TIMEOUT)
        assert r.status_code == 200


def test_health_and_metrics_cover_every_replica(cluster):
    h = health(cluster)
    assert h["status"] == "ok" and h["replicas_live"] == 2 and h["replicas_wanted"] == {"min": 2, "max": 2}
    ids = {r["replica"] for r in h["replicas"]}
    assert len(ids) == 2 and all(r["pid"] > 0 and r["device"] == "cpu" for r in h["replicas"])
    text = httpx.get(f"{cluster}/metrics", timeout=TIMEOUT).text
    for replica in ids:
        assert f'replica="{replica}"' in text
    assert "sovits_cluster_replicas 2" in text.splitlines()


def test_a_busy_model_set_spreads_to_another_replica(cluster, files):
    """Routing by model set does not pin a popular voice to one replica: beyond max_ongoing_requests (2)
    its requests go to another replica, which loads the set, and all answer the same."""
    text = " ".join(f"Sentence number {i} is here." for i in range(8))
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: httpx.get(f"{cluster}/tts", params=query(files, text), timeout=TIMEOUT),
                                range(4)))
    assert all(r.status_code == 200 for r in answers)
    assert len({r.content for r in answers}) == 1
    assert len({r.headers["x-sovits-replica"] for r in answers}) == 2


def wav_seconds(data: bytes) -> float:
    import soundfile as sf

    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


def test_the_configs_token_cap_bounds_every_sentence_without_a_flag(cluster, files):
    """Neither the cluster nor `serve` got a token cap: the config's bounds each sentence (random weights
    rarely stop by themselves: without it two sentences run for minutes of audio)."""
    text = "Hi there. How are you? See you soon."
    r = httpx.get(f"{cluster}/tts", params=query(files, text, seed=13), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    sentences, pause = 3, 0.3  # cut5 splits at each stop; fragment_interval between sentences
    assert 0 < wav_seconds(r.content) <= sentences * (MAX_TOKENS / TOKENS_PER_SECOND + pause) + 0.1


def test_a_killed_state_keeps_the_default_weights(cluster, files):
    """/set_gpt_weights, then kill -9 the state's process: Serve restarts it, it reads the defaults back
    from its file in the voices folder, and requests naming no weights still use the new GPT weights."""
    before = health(cluster)
    explicit = httpx.get(f"{cluster}/tts", params=query(files, seed=21, gpt_weights_path=str(files["gpt2"])),
                         timeout=TIMEOUT)
    r = httpx.get(f"{cluster}/set_gpt_weights", params={"weights_path": str(files["gpt2"])}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    try:
        pid = health(cluster)["state"]["pid"]
        os.kill(pid, signal.SIGKILL)  # the state process of this test's own Ray
        after = wait_for(lambda: (lambda h: h.get("state", {}).get("pid") not in (None, pid) and h)(health(cluster)),
                         120, "Serve to restart the cluster state")
        assert after["state"]["epoch"] != before["state"]["epoch"]  # a new process
        assert after["default_weights"]["gpt"] == str(files["gpt2"].resolve())
        r = httpx.get(f"{cluster}/tts", params=query(files, seed=21), timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == explicit.content
    finally:
        r = httpx.get(f"{cluster}/set_gpt_weights", params={"weights_path": before["default_weights"]["gpt"]},
                      timeout=TIMEOUT)
        assert r.status_code == 200


def pool_loads(url: str, replica: str) -> float:
    """The weights a replica's model pool has loaded, from the cluster's /metrics (as that replica last reported)."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    for line in text.splitlines():
        if (line.startswith("sovits_cache_misses_total{") and 'cache="model_pool"' in line
                and f'replica="{replica}"' in line):
            return float(line.rsplit(None, 1)[1])
    raise AssertionError(f"no model_pool loads reported by replica {replica}")


def timed_get(url: str, **kw) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    r = httpx.get(url, timeout=TIMEOUT, **kw)
    return time.monotonic() - start, r


def test_a_killed_gateway_answers_503_and_new_requests_go_around_it(cluster, files):
    """Two long requests in flight (one per gateway, as Serve's router spreads them), then kill -9 one
    gateway: its request gets 503 + Retry-After (never the proxy's bare 500), the other finishes, and new
    requests are answered at once by the other gateway."""
    pids = set()
    wait_for(lambda: pids.add(health(cluster)["gateway"]["pid"]) or len(pids) == 2, 60, "both gateways to answer")
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    lost = None
    for victim in sorted(pids):  # with luck the first kill catches a request; else the other gateway
        outcomes: list = []
        threads = [threading.Thread(target=lambda: outcomes.append(httpx.get(
            f"{cluster}/tts", params=query(files, text, seed=3), timeout=TIMEOUT))) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.3)
        wait_for(lambda: sum(r["running"] for r in health(cluster)["replicas"]) >= 2, 60,
                 "both long requests to start")
        os.kill(victim, signal.SIGKILL)  # a gateway process of this test's own Ray
        stalls = [timed_get(f"{cluster}/health") for _ in range(5)]
        print(f"\nafter the gateway kill: /health answered in {', '.join(f'{t:.2f}' for t, _ in stalls)} s")
        assert all(r.status_code == 200 for _, r in stalls)
        assert max(t for t, _ in stalls) < 5.0  # no stall while Serve replaces the dead gateway
        for t in threads:
            t.join(timeout=170)
        assert sorted(r.status_code for r in outcomes) in ([200, 200], [200, 503], [503, 503]), \
            [(r.status_code, r.text[:200]) for r in outcomes]
        lost = next((r for r in outcomes if r.status_code == 503), None)
        if lost is not None:
            break
        wait_for(lambda: len({health(cluster)["gateway"]["pid"] for _ in range(4)} - {victim}) >= 1, 120,
                 "the replacement gateway")
    assert lost is not None, "neither kill caught a request in flight"
    assert lost.headers["retry-after"] == "1" and "send the request again" in lost.json()["message"]


def test_a_killed_replica_does_not_take_the_service_down(cluster, files):
    """Kill the process of the replica computing a request: that request answers 503 with Retry-After, the
    next ones answer as before, and Serve starts a replacement that warms the killed replica's model sets before
    it takes traffic: its first request loads no weights (its model pool's loads, in the metrics it reports,
    are the same after that request as before it)."""
    a = httpx.get(f"{cluster}/tts", params=query(files), timeout=TIMEOUT)
    b = httpx.get(f"{cluster}/tts", params=query(files, other=True), timeout=TIMEOUT)
    fresh = iter(range(FRESH_REFERENCES))

    def new_voice() -> dict:  # a request on the second set with a reference no replica has seen yet
        return query(files, other=True, ref_audio_path=str(files["refs"] / f"fresh{next(fresh)}.wav"))

    warm = min(timed_get(f"{cluster}/tts", params=new_voice())[0] for _ in range(2))  # on a warm replica
    long_text = " ".join(f"Sentence number {i} is here." for i in range(300))  # ~8,700 characters
    for _ in range(3):  # health reports come every 0.5 s: a fast machine may finish before the kill lands
        victim = httpx.get(f"{cluster}/tts", params=query(files, other=True), timeout=TIMEOUT).headers[
            "x-sovits-replica"]
        replicas = health(cluster)["replicas"]
        pid = next(r["pid"] for r in replicas if r["replica"] == victim)
        known = {r["replica"] for r in replicas}
        outcome: dict = {}
        request = threading.Thread(target=lambda: outcome.update(r=httpx.get(
            f"{cluster}/tts", params=query(files, long_text, other=True), timeout=TIMEOUT)))
        request.start()
        wait_for(lambda: any(r["replica"] == victim and r["running"] for r in health(cluster)["replicas"]), 60,
                 "the long request to start on the replica")
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # a replica process of this test's own Ray
        request.join(timeout=120)
        lost = outcome["r"]
        if lost.status_code != 200:
            break
        wait_for(lambda: (lambda h: h["replicas_live"] == 2 and pid not in {r["pid"] for r in h["replicas"]}
                          and h)(health(cluster)), 240, "Serve to replace the killed replica")
    assert lost.status_code == 503 and lost.headers["retry-after"] == "1"
    assert "send the request again" in lost.json()["message"]
    r = httpx.get(f"{cluster}/tts", params=query(files), timeout=TIMEOUT)  # the live replica answers meanwhile
    assert r.status_code == 200 and r.content == a.content
    replaced = wait_for(lambda: (lambda h: h["replicas_live"] == 2 and pid not in {r["pid"] for r in h["replicas"]}
                                 and h)(health(cluster)), 240, "Serve to replace the killed replica")
    up_after = time.monotonic() - killed_at
    assert replaced["requests_lost"] >= 1
    new = next(r for r in replaced["replicas"] if r["replica"] not in known)
    assert str(files["gpt2"].resolve()) in {m["gpt"] for m in new["model_sets"]}  # the dead one's set, warmed
    loads_before = pool_loads(cluster, new["replica"])
    assert loads_before >= 1  # it loaded the set while warming, before any request reached it
    for _ in range(8):  # Serve's router picks one of the two replicas holding the set
        first, r = timed_get(f"{cluster}/tts", params=new_voice())
        assert r.status_code == 200, r.text
        if r.headers["x-sovits-replica"] == new["replica"]:
            break
    else:
        raise AssertionError("no request reached the replacement replica")
    answered = time.monotonic()
    wait_for(lambda: any(r["replica"] == new["replica"] and time.monotonic() - r["last_report_s"] > answered + 0.1
                         for r in health(cluster)["replicas"]), 30, "a report from the replacement after its request")
    assert pool_loads(cluster, new["replica"]) == loads_before  # the request found its weights loaded
    r = httpx.get(f"{cluster}/tts", params=query(files, other=True), timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == b.content
    print(f"\nreplacement live {up_after:.1f} s after the kill; its first request {first:.2f} s "
          f"(warm: {warm:.2f} s)")
