"""The page's progress line for one synthesis: the stage (preparing, sentence n of N, finishing), one bar,
the time it has taken and about how much is left, shown for the whole run. It is the page's only progress
display: Gradio's own overlay is off for the synthesis (it covered the outputs, restarted its timer and
came and went between two pieces of audio).

The engine reports each finished sentence from its worker thread (:meth:`SynthesisProgress.update`); the
page's handler reads :meth:`SynthesisProgress.line` on each piece of audio and once a second in between.
No gradio here.
"""

from __future__ import annotations

import threading
import time

BAR_CELLS = 20


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour)."""
    whole = max(0, int(round(seconds)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class SynthesisProgress:
    """Sentences done out of how many, since when; safe to update from the synthesis thread."""

    def __init__(self, now=time.monotonic) -> None:
        self._now = now
        self.started = now()
        self._lock = threading.Lock()
        self._done, self._total = 0, 0
        self._last_done_at = self.started

    def update(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total
            self._last_done_at = self._now()

    def snapshot(self) -> tuple[int, int, float, float | None]:
        """(sentences done, total (0: not known yet), seconds elapsed, seconds left or None)."""
        with self._lock:
            done, total, last = self._done, self._total, self._last_done_at
        now = self._now()
        elapsed = now - self.started
        left = None
        if done and total:  # the pace of the sentences so far, less the time the current one has run
            left = max(0.0, (last - self.started) / done * (total - done) - (now - last))
        return done, total, elapsed, left

    def line(self, locale: str) -> str:
        """The progress line in ``locale`` (Markdown)."""
        from webui.i18n import text

        done, total, elapsed, left = self.snapshot()
        filled = round(BAR_CELLS * done / total) if total else 0
        bar = "▰" * filled + "▱" * (BAR_CELLS - filled)  # the same bar from the first moment: the line never jumps
        if not total:
            return text("progress.starting", locale, bar=bar, elapsed=clock(elapsed))
        if done >= total:
            return text("progress.finishing", locale, total=total, bar=bar, elapsed=clock(elapsed))
        return text("progress.running", locale, current=done + 1, total=total, bar=bar, elapsed=clock(elapsed),
                    left=clock(left) if left is not None else "?")
