"""What the cluster shares besides the voice folder: its default model set (``/set_*_weights``), the latest
report of every replica (for ``/health`` and ``/metrics``) and the model sets of replicas that went away
(what their replacements warm up). One small Serve deployment holds it.

The default model set survives a restart of this deployment: it is written to a small state file in the
shared voices folder (``ClusterConfig.state_file``), tagged with the id of the application's deployment,
so a restarted state (same deployment) reads it back, while a new deployment starts from the config's
defaults (as a restarted ``serve`` does).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from studio.cluster.routing import Defaults, ModelSet

log = logging.getLogger(__name__)
DEPARTED_KEEP_S = 600.0  # how long the model sets of a replica that went away count as wanted


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica tells the cluster every ``report_interval_s``."""

    replica: str  # Serve's replica id
    pid: int
    node: str  # Ray node id
    host: str
    device: str
    model_sets: tuple[str, ...]  # ids of the model sets it holds (its multiplexed models), oldest first
    running: int  # syntheses being computed
    queued: int  # admitted, waiting for a worker
    metrics: str  # its /metrics text

    def to_json(self, age_s: float) -> dict:
        return {"replica": self.replica, "pid": self.pid, "node": self.node, "host": self.host,
                "device": self.device, "model_sets": [ModelSet.from_id(m).to_json() for m in self.model_sets],
                "running": self.running, "queued": self.queued, "last_report_s": round(age_s, 1)}


class DefaultsFile:
    """The default model set on disk: ``{"deployment": id, "gpt": path, "sovits": path}``, replaced atomically."""

    def __init__(self, path: str | os.PathLike | None, deployment: str) -> None:
        self.path = Path(path) if path else None
        self.deployment = deployment

    def read(self) -> ModelSet | None:
        """The saved set when it belongs to this deployment and its files still exist, else None."""
        if self.path is None or not self.path.is_file():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            models = ModelSet(str(data["gpt"]), str(data["sovits"]))
            mine = data.get("deployment") == self.deployment
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("cluster state file %s unreadable (%s); using the config's default weights", self.path, e)
            return None
        if not mine or not (Path(models.gpt).is_file() and Path(models.sovits).is_file()):
            return None
        return models

    def write(self, models: ModelSet) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"deployment": self.deployment, **models.to_json()}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as e:  # the cluster keeps working; only a restart of the state would lose the change
            log.error("could not save the default weights to %s: %s", self.path, e)


class ClusterState:
    """The default model set, versioned and saved, and the replicas' reports (async methods: Serve runs them
    on the replica's event loop, one at a time). A replica whose last report is older than ``stale_after_s``
    (by this process's clock) counts as gone: a dead one stops reporting. One silent for ``late_after_s``
    (a few report intervals) may be gone: a new replica warms its sets too, since Serve often starts the
    replacement of a killed replica before the dead one counts as gone."""

    def __init__(self, defaults: ModelSet, stale_after_s: float = 5.0, state_file: str | None = None,
                 deployment: str = "", late_after_s: float | None = None) -> None:
        self._file = DefaultsFile(state_file, deployment)
        saved = self._file.read()
        if saved is not None and saved != defaults:
            log.info("default weights from %s: %s", state_file, saved)
        self._defaults = Defaults(saved or defaults, epoch=uuid.uuid4().hex[:12])
        self._reports: dict[str, tuple[ReplicaReport, float]] = {}
        self._departed: dict[str, float] = {}  # model set id -> when its last holder went away
        self._lost = 0  # requests the gateways answered 503 because their replica stopped
        self._lock = threading.Lock()
        self.stale_after_s = stale_after_s
        self.late_after_s = min(stale_after_s, late_after_s if late_after_s is not None else stale_after_s / 2)

    async def defaults(self) -> Defaults:
        return self._defaults

    async def set_defaults(self, models: ModelSet) -> Defaults:
        with self._lock:
            d = self._defaults
            self._defaults = Defaults(models, d.epoch, d.generation + 1)
            self._file.write(models)
            return self._defaults

    async def report(self, report: ReplicaReport) -> None:
        with self._lock:
            self._reports[report.replica] = (report, time.monotonic())

    async def replicas(self) -> list[tuple[ReplicaReport, float]]:
        """The live replicas' latest reports with their age in seconds, by replica id."""
        with self._lock:
            now = self._prune()
            return sorted(((r, now - t) for r, t in self._reports.values()), key=lambda x: x[0].replica)

    async def wanted_sets(self, limit: int) -> list[str]:
        """What a new replica should load before it takes traffic: the default set, then the sets of
        replicas that went away (most recent first), then the sets held only by replicas that have been
        silent for ``late_after_s`` (most recently silent first), at most ``limit``."""
        with self._lock:
            now = self._prune()
            wanted = [self._defaults.models.id]
            for model_id, _ in sorted(self._departed.items(), key=lambda x: -x[1]):
                if model_id not in wanted:
                    wanted.append(model_id)
            live = {m for r, t in self._reports.values() if now - t <= self.late_after_s for m in r.model_sets}
            for report, _ in sorted((x for x in self._reports.values() if now - x[1] > self.late_after_s),
                                    key=lambda x: -x[1]):
                for model_id in report.model_sets:
                    if model_id not in wanted and model_id not in live:
                        wanted.append(model_id)
            return wanted[:limit]

    async def count_lost(self) -> None:
        with self._lock:
            self._lost += 1

    async def describe(self) -> dict:
        """This state's process and version, and the requests lost with a replica (for ``/health``)."""
        return {"pid": os.getpid(), "epoch": self._defaults.epoch, "generation": self._defaults.generation,
                "requests_lost": self._lost}

    def _prune(self) -> float:
        """Forget replicas that stopped reporting, remembering their model sets; returns now."""
        now = time.monotonic()
        for key in [k for k, (_, t) in self._reports.items() if now - t > self.stale_after_s]:
            for model_id in self._reports.pop(key)[0].model_sets:
                self._departed[model_id] = now
        for model_id in [m for m, t in self._departed.items() if now - t > DEPARTED_KEEP_S]:
            del self._departed[model_id]
        return now
