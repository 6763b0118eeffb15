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


class RssWatch:
    """The server's resident memory (``/proc/PID/status``), sampled every 20 ms while a case runs."""

    def __init__(self, pid: int | None) -> None:
        self.pid, self.peak, self.growth = pid, 0, {}  # growth: case -> MB above the RSS before it

    def rss_mb(self) -> float:
        if self.pid is None:
            return 0.0
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def around(self, case: str, fn) -> None:
        import threading

        before, top, stop = self.rss_mb(), [0.0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                top[0] = max(top[0], self.rss_mb())
                stop.wait(0.02)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            fn()
        finally:
            stop.set()
            thread.join()
            self.growth[case] = max(0.0, max(top[0], self.rss_mb()) - before)


class Probe:
    def __init__(self, url: str, key: str | None, ref: str | None) -> None:
        self.url, self.ref = url.rstrip("/"), ref
        self.headers = {"X-API-Key": key} if key else {}
        self.host_lines = b"Host: x\r\n" + (f"X-API-Key: {key}\r\n".encode() if key else b"")  # for raw requests
        self.clip = synthetic_clip()
        self.results: list[tuple[str, str]] = []  # (case, "2xx" | "4xx" | "5xx" | "busy" | "hang" | "reset")
        self.health: dict[str, float] = {}  # case -> slowest /health (ms) while it ran

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

    def warm_up(self) -> None:
        """Requests that load the models and each language's frontend; not counted (a server's time limit
        may cut the first ones while the models load: they are repeated)."""
        texts = {"en": "Hello there.", "zh": "你好世界。", "ja": "こんにちは。", "ko": "안녕하세요.", "yue": "你好世界。",
                 "auto": "Hello 你好 こんにちは 안녕하세요."}
        counted = len(self.results)
        for lang, text in texts.items():
            for _ in range(3):
                self.tts(f"warm-up {lang}", deadline=600, text=text, text_lang=lang)
                if self.results[-1][1] == "2xx":
                    break
        del self.results[counted:]

    # ---- issue 21: one request must never freeze, bloat or hold the server ---------------------------
    def health_ms(self, client: httpx.Client) -> float:
        start = time.perf_counter()
        try:
            client.get(self.url + "/health", headers=self.headers)
        except httpx.HTTPError:
            return float("inf")
        return (time.perf_counter() - start) * 1000

    def while_health(self, case: str, fn) -> None:
        """Run ``fn`` while /health is polled on one open connection; the slowest answer is kept per case."""
        import threading

        worst, stop = [0.0], threading.Event()

        def poll() -> None:
            with httpx.Client(timeout=DEADLINE) as client:
                self.health_ms(client)  # the connection is open before the clock starts
                while not stop.is_set():
                    worst[0] = max(worst[0], self.health_ms(client))
                    stop.wait(0.05)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            fn()
        finally:
            stop.set()
            thread.join()
        self.health[case] = worst[0]

    def texts(self, rss: "RssWatch") -> None:
        numbers = {"en": "7" * 37, "zh": "我有" + "7" * 37 + "个", "ja": "私は" + "7" * 37 + "です",
                   "yue": "我有" + "7" * 37 + "個", "ko": "나는 " + "7" * 17 + "개", "auto": "7" * 40}
        cases = [("digits 2400", {"text": "1" * 2400}), ("digits 5000", {"text": "1" * 5000}),
                 ("digits and signs", {"text": "1." * 4000}), ("money run", {"text": "1," * 3000 + "$"})]
        cases += [(f"long number {lang}", {"text": t, "text_lang": lang}) for lang, t in numbers.items()]
        for case, extra in cases:
            rss.around(case, lambda extra=extra, case=case: self.while_health(case, lambda: self.tts(case, **extra)))
        for lang in ("en", "zh", "ja", "ko", "yue", "auto"):
            raw = json.dumps(self.base(text="Hello \ud800 world", text_lang=lang))  # ASCII JSON: the escape "\\ud800"
            case = f"lone surrogate {lang}"
            rss.around(case, lambda raw=raw, case=case: self.call(
                case, "POST", "/tts", content=raw.encode(), headers={"content-type": "application/json"}))
        mixed = ("Hello world 12 apples. 你好世界，今天是2024年。こんにちは、元気ですか。안녕하세요 반갑습니다. " * 200)[:10_000]
        for lang in ("auto", "en", "zh", "ja", "ko", "yue"):
            case = f"10000 mixed chars {lang}"
            rss.around(case, lambda lang=lang, case=case: self.while_health(case, lambda: self.first_chunk(
                case, text=mixed, text_lang=lang)))

    def first_chunk(self, case: str, **extra) -> None:
        """A streaming request counted as answered at its first chunk (the rest would be minutes of audio)."""
        body = self.base(streaming_mode=True, **extra)
        try:
            with httpx.Client(timeout=DEADLINE) as c:
                if self.ref:
                    ctx = c.stream("POST", self.url + "/tts", headers=self.headers, json=body)
                else:
                    fields = {k: str(v) for k, v in body.items()}
                    ctx = c.stream("POST", self.url + "/tts", headers=self.headers, data=fields,
                                   files={"ref_audio": ("r.wav", self.clip)})
                with ctx as r:
                    next(r.iter_raw(), None)
                    self.record(case, r.status_code)
        except httpx.TimeoutException:
            self.record(case, "hang")
        except httpx.TransportError:
            self.record(case, "reset")

    def hostile_clips(self, rss: "RssWatch") -> None:
        import struct

        t = np.arange(4 * 16022) / 16022
        odd = wav((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), sr=16022, subtype="PCM_16")
        buf = io.BytesIO()
        sf.write(buf, (0.01 * np.random.default_rng(0).standard_normal((8000, 255))).astype(np.float32), 16000,
                 format="OGG", subtype="VORBIS")
        vorbis = buf.getvalue()
        au = b".snd" + struct.pack(">IIIII", 24, 0xFFFFFFFF, 3, 8000, 200) + bytes(np.random.default_rng(1).integers(
            0, 255, 4000, dtype=np.uint8))
        header = struct.pack("<HHIIHH", 1, 255, 16000, 16000 * 510, 510, 16)
        wav255 = b"RIFF" + struct.pack("<I", 36 + 510_000) + b"WAVEfmt " + struct.pack("<I", 16) + header + \
            b"data" + struct.pack("<I", 510_000) + bytes(510_000)
        fields = {"text": "Hello.", "text_lang": "en", "prompt_text": "Hello.", "prompt_lang": "en"}
        for name, data in (("odd rate 16022 Hz", odd), ("vorbis 255 channels", vorbis), ("fuzzed au", au),
                           ("wav 255 channels", wav255)):
            case = f"clip {name}"
            rss.around(case, lambda data=data, case=case: self.while_health(case, lambda: self.call(
                case, "POST", "/tts", data=fields, files={"ref_audio": ("c.wav", data)})))
        case = "three 255-channel vorbis at once"

        def three() -> None:
            with ThreadPoolExecutor(max_workers=3) as pool:
                list(pool.map(lambda i: self.call(f"{case} {i}", "POST", "/tts", data=fields,
                                                  files={"ref_audio": ("c.ogg", vorbis)}), range(3)))

        rss.around(case, three)

    def long_paths(self, rss: "RssWatch", ref_dir: str | None) -> None:
        for case, extra in (("ref path 156 KiB", {"ref_audio_path": "a/" * 80_000}),
                            ("aux path 156 KiB", {"aux_ref_audio_paths": ["a/" * 80_000]}),
                            ("gpt path 39 KiB", {"gpt_weights_path": "b/" * 20_000})):
            rss.around(case, lambda extra=extra, case=case: self.while_health(
                case, lambda: self.call(case, "POST", "/tts", json=self.base(**extra))))
        self.while_health("set_gpt_weights 39 KiB", lambda: self.call(
            "set_gpt_weights 39 KiB", "POST", "/set_gpt_weights", params={"weights_path": "b_" * 20_000}))
        if ref_dir:
            import os

            loop = os.path.join(ref_dir, "adversarial_loop.wav")
            if not os.path.lexists(loop):
                os.symlink(loop, loop)
            for case, extra in (("ref symlink loop", {"ref_audio_path": "adversarial_loop.wav"}),
                                ("aux symlink loop", {"aux_ref_audio_paths": ["adversarial_loop.wav"]})):
                self.call(case, "POST", "/tts", json=self.base(**extra))
            self.call("set_refer_audio symlink loop", "GET", "/set_refer_audio",
                      params={"refer_audio_path": "adversarial_loop.wav"})

    def heads(self) -> None:
        self.raw("header line 64 KiB", b"GET /health HTTP/1.1\r\n" + self.host_lines + b"X-A: " + b"a" * 65536
                 + b"\r\n\r\n")
        self.raw("10000 headers", b"GET /health HTTP/1.1\r\n" + self.host_lines
                 + b"".join(b"X-%d: 1\r\n" % i for i in range(10_000)) + b"\r\n")
        self.raw("URL 70 KiB", b"GET /health?x=" + b"c" * 70_000 + b" HTTP/1.1\r\n" + self.host_lines + b"\r\n")
        if not self.headers:  # without a key: a web page must not drive the server
            self.call("host evil.example (DNS rebinding)", "GET", "/set_gpt_weights", params={"weights_path": "x"},
                      headers={"host": "evil.example"})
            self.call("cross-site GET", "GET", "/set_gpt_weights", params={"weights_path": "x"},
                      headers={"sec-fetch-site": "cross-site"})
            self.call("cross-origin POST", "POST", "/tts", json=self.base(), headers={"origin": "https://evil.example"})

    def slow_clients(self, body_timeout: float, request_timeout: float) -> None:
        """Trickled bodies (408 within body_timeout_s), a stream nobody reads (closed after request_timeout_s),
        520 idle connections (a normal request still served)."""
        u = urlparse(self.url)
        body = json.dumps(self.base()).encode()

        def trickle(i: int) -> None:
            case = f"trickled body {i}"
            try:
                with socket.create_connection((u.hostname, u.port or 80), timeout=DEADLINE) as s:
                    s.sendall(b"POST /tts HTTP/1.1\r\n" + self.host_lines + b"Content-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body))
                    start = time.monotonic()
                    try:
                        for byte in body:
                            s.sendall(bytes([byte]))
                            time.sleep(body_timeout / 20)
                            if time.monotonic() - start > body_timeout + 10:
                                break
                    except OSError:
                        pass
                    data = s.recv(4096)
                self.record(case, int(data.split(b" ", 2)[1]) if data else "reset")
            except socket.timeout:
                self.record(case, "hang")
            except OSError:
                self.record(case, "reset")

        def stalled() -> None:
            case = "stream nobody reads"
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(request_timeout + 30)
            s.connect((u.hostname, u.port or 80))
            raw = json.dumps(self.base(streaming_mode=True, text="Hello there. " * 200)).encode()
            s.sendall(b"POST /tts HTTP/1.1\r\n" + self.host_lines + b"Content-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
            time.sleep(request_timeout + 8)  # never read meanwhile; then the server must have let go
            try:
                admitted = httpx.get(self.url + "/health", headers=self.headers, timeout=10).json().get("admitted", 0)
            except (httpx.HTTPError, ValueError):
                admitted = -1
            s.close()
            self.record(case, 200 if admitted == 0 else "hang")

        with ThreadPoolExecutor(max_workers=6) as pool:
            futures = [pool.submit(trickle, i) for i in range(4)] + [pool.submit(stalled)]
            time.sleep(1.0)
            self.tts("normal request while slow clients hang")
            for f in futures:
                f.result()
        idle = []
        try:
            for _ in range(520):
                try:
                    idle.append(socket.create_connection((u.hostname, u.port or 80), timeout=5))
                except OSError:
                    break
            self.tts("normal request beside 520 idle connections")
        finally:
            for s in idle:
                s.close()

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
    parser.add_argument("--server-pid", type=int, default=None, help="the server's process id: RSS growth per case")
    parser.add_argument("--ref-dir", default=None, help="the server's reference folder (symlink-loop cases)")
    parser.add_argument("--body-timeout", type=float, default=30.0, help="the server's body_timeout_s")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="the server's request_timeout_s")
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
    probe.warm_up()  # models and every language's dictionaries load on first use: not a hostile case's time
    probe.tts("baseline")
    for step in (probe.bodies, probe.options, probe.paths, probe.clips, probe.control_and_keys, probe.streams):
        step()
    probe.sizes(int(args.max_upload_mb * (1 << 20)))
    rss = RssWatch(args.server_pid)
    probe.texts(rss)
    probe.hostile_clips(rss)
    probe.long_paths(rss, args.ref_dir)
    probe.heads()
    probe.slow_clients(args.body_timeout, args.request_timeout)
    probe.slow(min(args.slow, 300))
    probe.burst(min(args.burst, 200))
    probe.tts("final health check")
    kinds = Counter(kind for _, kind in probe.results)
    print(f"cases tried: {len(probe.results)} in {time.monotonic() - t0:.0f} s")
    print("answers: " + ", ".join(f"{k}: {kinds[k]}" for k in ("2xx", "4xx", "busy", "5xx", "hang", "reset", "cut")))
    for case, kind in probe.results:
        if kind in ("5xx", "hang", "reset"):
            print(f"  {kind}: {case}")
    slow_health = {c: ms for c, ms in probe.health.items() if ms > 100}
    print(f"slowest /health during a hostile case: {max(probe.health.values(), default=0):.0f} ms"
          + (f" ({len(slow_health)} cases over 100 ms: {', '.join(slow_health)})" if slow_health else ""))
    if args.server_pid:
        worst = max(rss.growth.items(), key=lambda kv: kv[1], default=("-", 0.0))
        print(f"largest RSS growth during a case: {worst[1]:.0f} MB ({worst[0]})")
        if worst[1] > 200:
            return 1
    return 1 if kinds["5xx"] or kinds["hang"] or kinds["reset"] else 0


if __name__ == "__main__":
    sys.exit(main())
