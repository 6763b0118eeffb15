"""Shared set-up of the server tests: tiny random weights of every version in one official tree, synthetic
reference clips, and a real uvicorn server on a free loopback port in a thread."""

from __future__ import annotations

import io
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from engine.versions import DIRECT_VERSIONS, VOCODER_VERSIONS

VERSIONS = DIRECT_VERSIONS + VOCODER_VERSIONS  # the direct-audio versions first, then v3/v4
MAX_TOKENS = 12  # the server's max_tokens_per_sentence: random weights rarely say EOS, so bound them


def write_weight_tree(root: Path) -> Path:
    """Every version's tiny weights under ``root`` (official layout); returns a v2 ``tts_infer.yaml``."""
    from engine.testweights import LAYOUT, PRETRAINED, make_test_weights

    for version in VERSIONS:
        make_test_weights(root, version)
    base = root / PRETRAINED
    section = {"device": "cpu", "is_half": False, "version": "v2",
               "t2s_weights_path": str(base / LAYOUT["v2"]["gpt"]), "vits_weights_path": str(base / LAYOUT["v2"]["sovits"]),
               "bert_base_path": str(base / "chinese-roberta-wwm-ext-large"),
               "cnhuhbert_base_path": str(base / "chinese-hubert-base")}
    config = root / "tts_infer.yaml"
    config.write_text(yaml.safe_dump({"custom": section}), encoding="utf-8")
    return config


def weight_files(root: Path, version: str) -> tuple[Path, Path]:
    from engine.testweights import LAYOUT, PRETRAINED

    return root / PRETRAINED / LAYOUT[version]["gpt"], root / PRETRAINED / LAYOUT[version]["sovits"]


def reference_wav(index: int, seconds: float = 3.5, sr: int = 16000) -> bytes:
    """A distinct voiced-sounding clip per index (a vowel-like harmonic series with a vibrato)."""
    rng = np.random.default_rng(index)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 110 + 9 * index
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t) ** 2)
    x = 0.3 * x / np.abs(x).max() + 0.003 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(app, timeout: float = 60.0):
    """Serve ``app`` with uvicorn on 127.0.0.1:<free port> in a thread; yields the base URL; stops it."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wav_pcm(data: bytes) -> tuple[int, np.ndarray]:
    pcm, sr = sf.read(io.BytesIO(data), dtype="int16")
    return sr, pcm
