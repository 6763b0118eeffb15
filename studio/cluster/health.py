"""Whether a replica's engine can still serve: the answer of its Serve health check.

Relies on what :class:`engine.serving.scheduler.Scheduler` exposes today: a scheduler that was closed on
purpose (its model set evicted or reloaded, idle under memory pressure) is replaced by the next request,
so only a scheduler that is open while one of its threads (the T2S decode loop, the acoustic loop) has
ended counts as dead: its requests would wait forever.
"""

from __future__ import annotations

from typing import Any


def scheduler_problem(scheduler: Any) -> str:
    """Why ``scheduler`` cannot run requests ("" when it can, or when it was closed on purpose)."""
    if getattr(scheduler, "_closed", False):
        return ""
    dead = [t.name for t in getattr(scheduler, "_threads", ()) if not t.is_alive()]
    return f"its scheduler's {' and '.join(dead)} thread stopped" if dead else ""


def engine_problem(studio: Any) -> str:
    """Why the engine ``studio`` cannot serve ("" when it can): a device whose decoding state could not be
    rebuilt after a failed step (``Studio.serving_state`` "failed"), or a dead scheduler of any model set."""
    if getattr(studio, "serving_state", "ok") == "failed":
        return "its device failed and the decoding state could not be rebuilt"
    schedulers = list(getattr(studio, "_schedulers", {}).values())  # a snapshot (the engine's own registry)
    return next((p for p in map(scheduler_problem, schedulers) if p), "")
