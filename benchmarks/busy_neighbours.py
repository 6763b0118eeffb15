"""Other processes that keep CPU cores busy while a benchmark runs (its ``--busy N``): the load a laptop's other
programs put beside the engine."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_neighbours(n: int) -> Iterator[None]:
    """``n`` processes spinning in a pure-Python loop for the duration of the block; ended on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
