"""A synthesis replica: one engine (:class:`engine.pipeline.Studio`) serving the server's own FastAPI app
(:func:`studio.http.app.create_app`) to requests the gateway forwards.

Responsibilities: (1) hold at most ``max_model_sets`` model sets, least recently used out, through
``serve.multiplexed`` (so Serve routes each set's requests to replicas that hold it); (2) follow the
cluster's default weights; (3) report its health and metrics to the cluster state every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from studio.cluster.asgi import ForwardedRequest, ResponseStart, serve_forwarded
from studio.cluster.routing import Defaults, ModelSet

if TYPE_CHECKING:
    from studio.cluster.config import ClusterConfig

log = logging.getLogger(__name__)


class HeldModelSet:
    """A model set this replica holds: keeps its networks alive while Serve counts it as loaded."""

    def __init__(self, model_id: str, models: Any, on_release: Any) -> None:
        self.model_id, self.models, self._on_release = model_id, models, on_release

    def __del__(self) -> None:  # Serve calls this when the set leaves the replica's LRU
        self.models = None
        if self._on_release is not None:
            self._on_release(self.model_id)
            self._on_release = None


class Synthesizer:
    """The replica deployment's class (wrapped by ``serve.deployment`` in :mod:`studio.cluster.app`)."""

    def __init__(self, config: "ClusterConfig", state: Any) -> None:
        from ray import serve

        from engine.pipeline import Studio
        from studio.http.app import create_app

        self.config = config
        self.state = state  # DeploymentHandle of ClusterState
        self.studio = Studio.from_config(config.engine_config(), device=config.device, precision=config.precision,
                                         settings=config.engine_settings(), vocoder_backend=config.vocoder_backend)
        self.app = create_app(self.studio, config.server_settings())
        self.context = self.app.state.context
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._synced: tuple[str, int] | None = None  # (epoch, generation) of the defaults followed
        self._sync_lock = asyncio.Lock()
        self._held: dict[str, None] = {}  # ids of the model sets held now (insertion order)

        async def model_set(model_id: str) -> HeldModelSet:  # a plain function: Serve keeps its LRU on it
            return await self._load(model_id)

        self.model_set = serve.multiplexed(max_num_models_per_replica=config.max_model_sets)(model_set)
        self._reporter: asyncio.Task | None = None

    # ---- model sets --------------------------------------------------------------------------
    async def _load(self, model_id: str) -> HeldModelSet:
        models = ModelSet.from_id(model_id)
        weights = self.studio.default_weights.replace(gpt=models.gpt, sovits=models.sovits)
        loaded = await asyncio.to_thread(self.studio.pool.models, weights, self.studio.runtime)
        self._held[model_id] = None
        return HeldModelSet(model_id, loaded, lambda key: self._held.pop(key, None))

    async def _follow_defaults(self, defaults: Defaults) -> None:
        key = (defaults.epoch, defaults.generation)
        if self._synced == key:
            return
        async with self._sync_lock:
            if self._synced == key:
                return
            current = self.studio.default_weights
            if (str(current.gpt), str(current.sovits)) != (defaults.models.gpt, defaults.models.sovits):
                await self.context.runner.run(self.studio.set_default_weights, defaults.models.gpt,
                                              defaults.models.sovits)
            self._synced = key

    # ---- requests ----------------------------------------------------------------------------
    async def handle(self, request: ForwardedRequest, defaults: Defaults | None = None
                     ) -> AsyncIterator[ResponseStart | bytes]:
        """Serve one forwarded request with the app; yields its response start, then body chunks."""
        from ray import serve

        self._start_reporting()
        model_id = serve.get_multiplexed_model_id()
        try:
            if defaults is not None:
                await self._follow_defaults(defaults)
            if model_id:
                await self.model_set(model_id)
        except Exception as e:  # noqa: BLE001 - the app names the problem when it loads the same weights
            log.warning("model set %s not loaded ahead: %s", model_id, e)
        first = True
        async for message in serve_forwarded(self.app, request, self.config.max_pending_chunks):
            if first and isinstance(message, ResponseStart):
                message = ResponseStart(message.status,
                                        (*message.headers, (b"x-sovits-replica", self.replica_id.encode())))
                first = False
            yield message

    # ---- reports -----------------------------------------------------------------------------
    def _start_reporting(self) -> None:
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.get_running_loop().create_task(self._report_forever())

    async def check_health(self) -> None:
        """Serve's periodic health check; also (re)starts the reports."""
        self._start_reporting()

    def __del__(self) -> None:  # Serve's graceful shutdown of the replica
        self.context.runner.shutdown(wait=False)

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.state.report.remote(self.report())
            except Exception as e:  # noqa: BLE001 - the state may be restarting; report again later
                log.debug("report failed: %s", e)
            await asyncio.sleep(self.config.report_interval_s)

    def report(self):
        import ray

        from studio.cluster.state import ReplicaReport

        held = tuple(self._held)
        return ReplicaReport(
            replica=self.replica_id, pid=os.getpid(), node=ray.get_runtime_context().get_node_id(),
            host=socket.gethostname(), device=str(self.studio.runtime.device), model_sets=held,
            running=self.context.runner.running, queued=self.context.runner.queue_length,
            metrics=self.context.metrics.render())
