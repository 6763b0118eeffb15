"""Load a running server over HTTP: N concurrent streaming clients, and what they got.

Responsibilities: (1) drive ``/tts`` (api_v2, any ``streaming_mode``) or ``/v1/audio/speech`` with
closed-loop clients or at a fixed arrival rate, bounded by a duration and/or a request count;
(2) measure each stream from the client side (first audio byte, audio seconds from the WAV
header's format and the bytes received) and the server's memory from ``/metrics`` when it exposes
it. The client is the standard library only (asyncio streams, one connection per request), so one
thread carries thousands of streams and the tool runs against any api_v2 server.

Timing: a request's clock starts when it is due: when its client sends it (closed loop) or at its
scheduled arrival (fixed rate, so waiting for a free client slot counts, as a user would feel it).

Modules: ``config`` (LoadConfig), ``client`` (HTTP/1.1 on asyncio), ``wav`` (audio seconds of a
body), ``server_memory`` (/metrics), ``run`` (the load and its figures), ``report`` (table, PNG).
"""

from studio.loadtest.config import REF_TEXT, TEXT, LoadConfig, LoadTestError
from studio.loadtest.report import draw_png, format_table
from studio.loadtest.run import run_load, synthetic_reference
from studio.loadtest.server_memory import parse_metrics
from studio.loadtest.wav import WavMeter

__all__ = ["REF_TEXT", "TEXT", "LoadConfig", "LoadTestError", "WavMeter", "draw_png", "format_table",
           "parse_metrics", "run_load", "synthetic_reference"]
