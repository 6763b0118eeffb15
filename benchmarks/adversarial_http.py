"""Hostile and unusual requests against a running SoVITS Studio server on this machine; prints the counts.

    python benchmarks/adversarial_http.py --url http://127.0.0.1:9880 [--api-key KEY] [--ref ref.wav]

Every case is one request (or one raw connection) with a deadline; the script reports how many cases it
tried and how many got a 2xx, a 4xx, a 5xx (other than a busy 503), a hang (no answer within the
deadline) or a reset, and lists every 5xx, hang and reset. Only loopback addresses are accepted, and
every loop is bounded. ``--ref`` names a clip in the server's reference folder for the cases that need
a valid request (default: an uploaded synthetic clip).
"""

from __future__ import annotations

import argparse
import io
import ipaddress
import json
import socket
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import numpy as np
import soundfile as sf

DEADLINE = 60.0  # seconds a case may take before it counts as a hang


def synthetic_clip(seconds: float = 3.5, sr: int = 16000) -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * np.cumsum(120 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 1.3 * t) ** 2)
    buf = io.BytesIO()
    sf.write(buf, (0.3 * x / np.abs(x).max()).astype(np.float32), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def wav(samples: np.ndarray, sr: int = 16000, subtype: str = "FLOAT") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, sr, format="WAV", subtype=subtype)
    return buf.getvalue()


class Probe:
    def __init__(self, url: str, key: str | None, ref: str | None) -> None:
        self.url, self.ref = url.rstrip("/"), ref
        self.headers = {"X-API-Key": key} if key else {}
        self.host_lines = b"Host: x\r\n" + (f"X-API-Key: {key}\r\n".encode() if key else b"")  # for raw requests
        self.clip = synthetic_clip()
        self.results: list[tuple[str, str]] = []  # (case, "2xx" | "4xx" | "5xx" | "busy" | "hang" | "reset")

    # ---- bookkeeping ------------------------------------------------------------------------------
    def record(self, case: str, status: int | str) -> None:
        if isinstance(status, int):
            kind = "busy" if status == 503 else f"{status // 100}xx"
        else:
            kind = status
        self.results.append((case, kind))

    def call(self, case: str, method: str, path: str, stream: bool = False, deadline: float = DEADLINE,
             **kwargs) -> None:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        try:
            with httpx.Client(timeout=deadline) as c:
                if stream:
                    with c.stream(method, self.url + path, headers=headers, **kwargs) as r:
                        for _ in r.iter_raw():
                            pass
                        self.record(case, r.status_code)
                else:
                    self.record(case, c.request(method, self.url + path, headers=headers, **kwargs).status_code)
        except httpx.TimeoutException:
            self.record(case, "hang")
        except httpx.TransportError as e:
            self.record(case, "cut" if stream else "reset")
            if not stream:
                print(f"  reset: {case}: {type(e).__name__}", file=sys.stderr)

    def raw(self, case: str, payload: bytes, expect_close: bool = False) -> None:
        """Send bytes on a raw connection; a hang is no answer and no close within the deadline."""
        u = urlparse(self.url)
        try:
            with socket.create_connection((u.hostname, u.port or 80), timeout=DEADLINE) as s:
                s.sendall(payload)
                data = s.recv(4096)
        except socket.timeout:
            self.record(case, "hang")
            return
        except OSError:
            self.record(case, "reset")
            return
        if not data:
            self.record(case, "4xx" if expect_close else "reset")  # closed by the server: refused
        else:
            self.record(case, int(data.split(b" ", 2)[1]))

    def base(self, **extra) -> dict:
        body = {"text": "Hello there.", "text_lang": "en", "prompt_text": "Hello.", "prompt_lang": "en",
                "text_split_method": "cut5", "seed": 1}
        if self.ref:
            body["ref_audio_path"] = self.ref
        return {**body, **extra}

    def tts(self, case: str, stream: bool = False, deadline: float = DEADLINE, **extra) -> None:
        body = self.base(**extra)
        if self.ref or "ref_audio_path" in extra:
            self.call(case, "POST", "/tts", json=body, stream=stream, deadline=deadline)
        else:
            fields = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in body.items()}
            self.call(case, "POST", "/tts", data=fields, files={"ref_audio": ("r.wav", self.clip)}, stream=stream,
                      deadline=deadline)

    # ---- the cases --------------------------------------------------------------------------------
    def bodies(self) -> None:
        j = {"content-type": "application/json"}
        for depth in (33, 1000, 100_000):
            self.call(f"json depth {depth}", "POST", "/tts", content=b"[" * depth + b"]" * depth, headers=j)
            self.call(f"openai json depth {depth}", "POST", "/v1/audio/speech",
                      content=b'{"input":' + b"[" * depth + b"]" * depth + b"}", headers=j)
        for name, raw in (("not json", b"{nope"), ("latin-1", '{"text": "caf\xe9"}'.encode("latin-1")),
                          ("utf-16 no bom", '{"a": 1}'.encode("utf-16-le")), ("array", b"[1, 2]"), ("empty", b""),
                          ("null", b"null"), ("huge int", b'{"top_k": ' + b"9" * 5000 + b"}"),
                          ("nan", b'{"top_p": NaN}'), ("bom", b'\xef\xbb\xbf{"text": "x"}')):
            self.call(f"json {name}", "POST", "/tts", content=raw, headers=j)
        m = "multipart/form-data"
        for name, ctype, raw in (("no boundary", m, b"--x\r\n"), ("truncated", f"{m}; boundary=x", b"--x\r\nContent-Dispo"),
                                 ("garbage", f"{m}; boundary=x", bytes(range(256)) * 20),
                                 ("no name", f"{m}; boundary=x", b"--x\r\nContent-Disposition: form-data\r\n\r\nv\r\n--x--\r\n"),
                                 ("bad utf-8 field", f"{m}; boundary=x",
                                  b'--x\r\nContent-Disposition: form-data; name="text"\r\n\r\n\xff\xfe\r\n--x--\r\n')):
            self.call(f"multipart {name}", "POST", "/tts", content=raw, headers={"content-type": ctype})
            self.call(f"voices multipart {name}", "POST", "/v1/voices", content=raw, headers={"content-type": ctype})
        self.call("form 500 fields", "POST", "/tts", content="&".join(["text=x"] * 500).encode(),
                  headers={"content-type": "application/x-www-form-urlencoded"})
        self.call("urlencoded bad percent", "POST", "/tts", content=b"text=%ZZ%FF",
                  headers={"content-type": "application/x-www-form-urlencoded"})

    def options(self) -> None:
        for name, extra in (("min_chunk<overlap mode 2", {"streaming_mode": 2, "min_chunk_length": 1, "overlap_length": 5}),
                            ("min_chunk<overlap mode 3", {"streaming_mode": 3, "min_chunk_length": 2, "overlap_length": 8}),
                            ("streaming_mode 9", {"streaming_mode": 9}), ("streaming_mode str", {"streaming_mode": "fast"}),
                            ("top_k 0", {"top_k": 0}), ("top_k huge", {"top_k": 10**9}), ("top_p 0", {"top_p": 0}),
                            ("temperature -1", {"temperature": -1}), ("speed 0", {"speed_factor": 0}),
                            ("speed 1e9", {"speed_factor": 1e9}), ("seed -5", {"seed": -5}), ("seed 2**40", {"seed": 2**40}),
                            ("batch 0", {"batch_size": 0}), ("batch 10**6", {"batch_size": 10**6}),
                            ("split cut9", {"text_split_method": "cut9"}), ("media mp4", {"media_type": "mp4"}),
                            ("text empty", {"text": ""}), ("text blank", {"text": " \n\t"}), ("text 10001", {"text": "a" * 10_001}),
                            ("text punctuation", {"text": "。。！！"}), ("text_lang xx", {"text_lang": "xx"}),
                            ("prompt_lang none", {"prompt_lang": None}), ("text list", {"text": ["a"]}),
                            ("fragment_interval -1", {"fragment_interval": -1}), ("overlap 0", {"overlap_length": 0}),
                            ("sample_steps 10**6", {"sample_steps": 10**6}), ("aux 100", {"aux_ref_audio_paths": ["x.wav"] * 100})):
            self.tts(f"option {name}", **extra)
        for name, body in (("no voice", {"input": "hi"}), ("voice path", {"input": "hi", "voice": "../../etc"}),
                           ("speed 99", {"input": "hi", "voice": "x", "speed": 99}),
                           ("format exe", {"input": "hi", "voice": "x", "response_format": "exe"}),
                           ("input 5000", {"input": "x" * 5000, "voice": "x"}), ("input list", {"input": [1], "voice": "x"})):
            self.call(f"openai {name}", "POST", "/v1/audio/speech", json=body)

    def paths(self) -> None:
        for p in ("/etc/passwd", "/etc/shadow", "/etc/nonexistent", "../../../../etc/passwd", "..", "/", "/proc/self/environ",
                  "a\x00b.wav", "~/.ssh/id_rsa", "C:\\Windows\\win.ini", "//server/share/x.wav", "x" * 5000):
            self.call(f"ref path {p[:30]!r}", "POST", "/tts", json=self.base(ref_audio_path=p))
            self.call(f"aux path {p[:30]!r}", "POST", "/tts", json=self.base(aux_ref_audio_paths=[p]))
            self.call(f"weights path {p[:30]!r}", "GET", "/set_gpt_weights", params={"weights_path": p})
            self.call(f"set_refer_audio {p[:30]!r}", "GET", "/set_refer_audio", params={"refer_audio_path": p})
        for name in ("../x", "a/b", ".hidden", "x" * 100, "%2e%2e"):
            self.call(f"voice name {name[:20]!r}", "DELETE", f"/v1/voices/{name}")

    def clips(self) -> None:
        sr = 16000
        cases = {"nan": wav(np.full(sr * 4, np.nan, np.float32)), "silent": wav(np.zeros(sr * 4, np.float32)),
                 "short": wav(np.full(sr // 2, 0.1, np.float32)), "clipped": wav(np.sign(np.sin(np.arange(sr * 4))).astype(np.float32)),
                 "junk": b"RIFF\x00\x00\x00\x00WAVEjunk" * 10, "empty": b"", "inf": wav(np.full(sr * 4, np.inf, np.float32)),
                 "rate 1 Hz": wav(np.full(8, 0.1, np.float32), sr=1)}
        for name, data in cases.items():
            fields = {"text": "Hello.", "text_lang": "en", "prompt_text": "Hello.", "prompt_lang": "en"}
            self.call(f"upload clip {name}", "POST", "/tts", data=fields, files={"ref_audio": ("c.wav", data)})
            self.call(f"save voice {name}", "POST", "/v1/voices",
                      data={"name": f"adv_{name.replace(' ', '_')}", "prompt_text": "Hello.", "prompt_lang": "en"},
                      files={"audio": ("c.wav", data)})

    def sizes(self, limit: int) -> None:
        big = b"x" * (limit + 1)
        self.call("declared over limit", "POST", "/tts", content=big, headers={"content-type": "application/json"})

        def chunks():
            for i in range(0, len(big), 65536):
                yield big[i:i + 65536]

        self.call("chunked over limit", "POST", "/tts", content=chunks(), headers={"content-type": "application/json"})
        self.call("multipart over limit", "POST", "/tts", data={"text": "x"}, files={"ref_audio": ("a.wav", big)})
        self.raw("lying content-length", b"POST /tts HTTP/1.1\r\n" + self.host_lines + b"Content-Length: 99999999999\r\n\r\n{}")
        self.raw("negative content-length", b"POST /tts HTTP/1.1\r\n" + self.host_lines + b"Content-Length: -5\r\n\r\n{}")
        self.raw("huge header", b"GET /health HTTP/1.1\r\n" + self.host_lines + b"X-A: " + b"a" * 200_000 + b"\r\n\r\n")
        self.raw("bad request line", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n")

    def slow(self, n: int) -> None:
        """Half-open connections and slow bodies: the server must close them, not hold them."""
        u = urlparse(self.url)

        def one(kind: str) -> None:
            try:
                with socket.create_connection((u.hostname, u.port or 80), timeout=DEADLINE) as s:
                    if kind == "body":
                        s.sendall(b"POST /tts HTTP/1.1\r\n" + self.host_lines + b"Content-Type: application/json\r\n"
                                  b"Content-Length: 1000\r\n\r\n{")
                    elif kind == "header":
                        s.sendall(b"GET /health HTTP/1.1\r\n" + self.host_lines + b"")
                    data = s.recv(4096)
                self.record(f"slow {kind}", int(data.split(b" ", 2)[1]) if data else "4xx")
            except socket.timeout:
                self.record(f"slow {kind}", "hang")
            except OSError:
                self.record(f"slow {kind}", "4xx")  # closed on us: refused

        with ThreadPoolExecutor(max_workers=min(n, 64)) as pool:
            list(pool.map(one, [k for _ in range(n // 3) for k in ("idle", "header", "body")]))

    def control_and_keys(self) -> None:
        bare = {k: v for k, v in self.headers.items()}
        self.headers = {}
        for path in ("/control?command=exit", "/control?command=restart", "/set_gpt_weights?weights_path=x"):
            self.call(f"no key {path}", "GET", path)
        self.headers = {"Authorization": "Bearer wrong-key-0000000000"}
        self.call("wrong key /health", "GET", "/health")
        self.headers = bare
        self.call("control bad command", "GET", "/control", params={"command": "rm -rf"})

    def burst(self, n: int) -> None:
        """``n`` requests at once: each is answered (200 or busy 503), none is lost or hangs."""
        with ThreadPoolExecutor(max_workers=min(n, 64)) as pool:
            list(pool.map(lambda i: self.tts(f"burst {i}"), range(n)))

    def streams(self) -> None:
        for mode in (1, 2, 3):
            self.tts(f"stream mode {mode}", stream=True, streaming_mode=mode)
        try:  # leave in the middle; the next request must still work
            with httpx.Client(timeout=DEADLINE) as c:
                fields = {k: str(v) for k, v in self.base(streaming_mode=2, text="One. Two. Three. Four.").items()}
                with c.stream("POST", self.url + "/tts", headers=self.headers, data=fields,
                              files={"ref_audio": ("r.wav", self.clip)}) as r:
                    next(r.iter_raw(), None)
            self.record("leave a stream", 200)
        except httpx.HTTPError:
            self.record("leave a stream", "reset")
        self.tts("after a left stream")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:9880")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--ref", default=None, help="a clip name in the server's reference folder")
    parser.add_argument("--max-upload-mb", type=float, default=20.0, help="the server's upload limit")
    parser.add_argument("--burst", type=int, default=48, help="concurrent requests in the burst case (<= 200)")
    parser.add_argument("--slow", type=int, default=60, help="half-open / slow connections (<= 300)")
    args = parser.parse_args()
    host = urlparse(args.url).hostname or ""
    try:
        loopback = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        loopback = False
    if not loopback:
        print(f"error: {host} is not a loopback address; this script only probes servers on this machine",
              file=sys.stderr)
        return 2
    probe = Probe(args.url, args.api_key, args.ref)
    t0 = time.monotonic()
    probe.tts("baseline", deadline=600)  # the first request may load the models
    for step in (probe.bodies, probe.options, probe.paths, probe.clips, probe.control_and_keys, probe.streams):
        step()
    probe.sizes(int(args.max_upload_mb * (1 << 20)))
    probe.slow(min(args.slow, 300))
    probe.burst(min(args.burst, 200))
    probe.tts("final health check")
    kinds = Counter(kind for _, kind in probe.results)
    print(f"cases tried: {len(probe.results)} in {time.monotonic() - t0:.0f} s")
    print("answers: " + ", ".join(f"{k}: {kinds[k]}" for k in ("2xx", "4xx", "busy", "5xx", "hang", "reset", "cut")))
    for case, kind in probe.results:
        if kind in ("5xx", "hang", "reset"):
            print(f"  {kind}: {case}")
    return 1 if kinds["5xx"] or kinds["hang"] or kinds["reset"] else 0


if __name__ == "__main__":
    sys.exit(main())
