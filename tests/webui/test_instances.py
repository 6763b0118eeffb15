"""Two `sovits-studio webui` processes on one machine: each keeps the files its page serves (uploads, clips,
the example clips) in a folder of its own, so one that stops, or one started by mistake on a port in use,
deletes nothing the other serves. Runs the real command (two processes, tiny v2 weights, no warm-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.paths import REPO
from tests.support.server import free_port
from tests.support.synth import model_config

EXAMPLES = ("en_slt_01.wav", "en_kumo_01.wav", "zh_kumo_01.wav", "ja_alpha_01.wav")


@contextmanager
def webui(port: int, temp: Path, log: list[str]):
    """`sovits-studio webui` on ``port`` with $GRADIO_TEMP_DIR=``temp``; yields the process once it serves
    (or once it has exited: a start that fails)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_TEMP_DIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "webui", "--config", str(model_config("v2")),
                             "--port", str(port), "--device", "cpu", "--no-warmup",
                             "--profiles-dir", str(temp.parent / "voices")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not any("is running: http://127.0.0.1:" in line for line in log):
            line = proc.stdout.readline()
            log.append(line)
            if not line and proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "".join(log)
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def example_files(folder: Path) -> dict[str, Path]:
    """The copies of the example clips a page made in ``folder`` (its own file folder), by name."""
    found = {p.name: p for p in folder.rglob("*.wav")}
    assert set(EXAMPLES) <= set(found), sorted(found)
    return found


def fetch(port: int, path: Path) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/gradio_api/file={path}", timeout=30)


def test_an_instance_that_stops_deletes_nothing_another_one_serves(tmp_path) -> None:
    temp = tmp_path / "gradio"
    port_a, port_b = free_port(), free_port()
    log_a, log_b, log_c = [], [], []
    with webui(port_a, temp, log_a) as a:
        assert a.poll() is None, "".join(log_a)
        folders_a = set(temp.glob("sovits-studio-webui-*"))
        assert len(folders_a) == 1
        with webui(port_b, temp, log_b) as b:
            assert b.poll() is None, "".join(log_b)
            (folder_b,) = set(temp.glob("sovits-studio-webui-*")) - folders_a
            clips_b = example_files(folder_b)
            for name in EXAMPLES:
                assert fetch(port_b, clips_b[name]).status_code == 200
            # a third start by mistake on b's port: it fails, and takes nothing of b's with it
            with webui(port_b, temp, log_c) as c:
                assert c.wait(timeout=120) == 1 and "port in use" in "".join(log_c)
            stop(a)  # a stops for good
            assert a.returncode == 0, "".join(log_a)
            assert not any(f.exists() for f in folders_a)  # a removed its own folder, and only its own
            for name in EXAMPLES:
                response = fetch(port_b, clips_b[name])
                assert response.status_code == 200 and response.content[:4] == b"RIFF", name
            assert set(temp.glob("sovits-studio-webui-*")) == {folder_b}
    assert not list(temp.glob("sovits-studio-webui-*"))  # nothing left behind
