"""A synthesis replica: one engine (:class:`engine.studio.Studio`) serving the server's own FastAPI app
(:func:`studio.http.app.create_app`) to requests the gateway forwards.

Responsibilities: (1) be ready before it takes traffic (load and warm its model sets first) and fail
its health check when its engine cannot serve; (2) hold at most ``max_model_sets`` model sets, least
recently used out, through ``serve.multiplexed`` (so Serve routes each set's requests to replicas that
hold it); (3) follow the cluster's default weights; (4) report its health and metrics to the cluster
state every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studio.cluster.asgi import ForwardedRequest, ResponseStart, serve_forwarded
from studio.cluster.routing import Defaults, ModelSet

if TYPE_CHECKING:
    from studio.cluster.config import ClusterConfig

log = logging.getLogger(__name__)
STATE_WAIT_S = 30.0  # longest wait at start for the cluster state (then: the config's defaults)


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
    """The replica deployment's class (wrapped by ``serve.deployment`` in :mod:`studio.cluster.app`).

    Its constructor is async and ends only when the replica has loaded and warmed the model sets it should
    hold (see :meth:`_warm_up`); Serve routes no request to a replica before that, nor before its first
    health check passes."""

    async def __init__(self, config: "ClusterConfig", state: Any) -> None:
        from ray import serve

        from engine.platform_env import quiet_libraries, set_switch_interval
        from engine.studio import Studio
        from studio.http.app import create_app

        quiet_libraries(config.verbose)  # a process of its own: no loading bars in the driver's log either
        self.config = config
        self.state = state  # DeploymentHandle of ClusterState
        engine_config = config.engine_config()
        self.studio = Studio.from_config(engine_config, device=config.device, precision=config.precision,
                                         settings=config.engine_settings(engine_config),
                                         vocoder_backend=config.vocoder_backend)
        set_switch_interval(self.studio.settings.switch_interval_ms)  # the replica's process is its own
        self.app = create_app(self.studio, config.server_settings(engine_config))
        self.context = self.app.state.context
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._synced: tuple[str, int] | None = None  # (epoch, generation) of the defaults followed
        self._sync_lock = asyncio.Lock()
        self._held: dict[str, None] = {}  # ids of the model sets held now (insertion order)
        self.problem = ""  # why this replica cannot serve (its health check fails while set)

        async def model_set(model_id: str) -> HeldModelSet:  # a plain function: Serve keeps its LRU on it
            return await self._load(model_id)

        self.model_set = serve.multiplexed(max_num_models_per_replica=config.max_model_sets)(model_set)
        self._reporter: asyncio.Task | None = None
        await self._warm_up(engine_config)

    async def _warm_up(self, engine_config) -> None:
        """Follow the cluster's default weights, then load and warm (``engine.warmup``, as ``serve`` does) the
        sets the cluster wants on a new replica (:meth:`ClusterState.wanted_sets`: the defaults, then the
        sets of replicas that went away) and the config's other sets, at most ``max_model_sets``; each
        warmed set is announced to Serve's router. A default set that exists but fails to load leaves
        :attr:`problem` set: the health check fails and Serve replaces the replica."""
        import time

        from engine.warmup import configured_weight_sets, warm_up

        start = time.monotonic()
        settings = self.config.warmup_settings(engine_config)
        default = ModelSet.of(self.studio.default_weights.gpt, self.studio.default_weights.sovits)
        wanted = [default.id]
        try:
            async def ask() -> tuple[Defaults, list[str]]:  # the state may be restarting: bounded below
                return (await self.state.defaults.remote(),
                        await self.state.wanted_sets.remote(self.config.max_model_sets))

            defaults, wanted = await asyncio.wait_for(ask(), timeout=STATE_WAIT_S)
            await self._follow_defaults(defaults)
            default = defaults.models
        except Exception as e:  # noqa: BLE001 - the state may be restarting; requests will follow later
            log.warning("cluster state not reachable at start (%s); warming the config's defaults", e)
        for weights in configured_weight_sets(engine_config, self.studio.default_weights)[1:]:
            wanted.append(ModelSet.of(weights.gpt, weights.sovits).id)
        sets = [ModelSet.from_id(m) for m in dict.fromkeys(wanted)][:self.config.max_model_sets]
        sets = [m for m in sets if Path(m.gpt).is_file() and Path(m.sovits).is_file()]  # missing: nothing to load
        if not settings.enabled:
            return
        for models in sets:
            weights = self.studio.default_weights.replace(gpt=models.gpt, sovits=models.sovits)
            report = await self.context.runner.run(warm_up, self.studio, [weights], settings)
            if report.errors:
                log.error("warm-up of %s failed: %s", models, "; ".join(report.errors))
                if models == default:
                    self.problem = f"the default weights failed to load: {'; '.join(report.errors)}"
                continue
            try:
                await self.model_set(models.id)  # Serve's router now sends this set's requests here too
            except Exception as e:  # noqa: BLE001 - routing learns of the set at its first request instead
                log.warning("model set %s not announced: %s", models, e)
        log.info("replica %s warmed %d model set(s) in %.1f s", self.replica_id, len(sets), time.monotonic() - start)

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
        """Serve's periodic health check (the first one gates the replica's first request): fails while the
        default weights failed to load or a scheduler is dead, so Serve replaces the replica. Also (re)starts
        the reports."""
        from studio.cluster.health import engine_problem

        self._start_reporting()
        problem = self.problem or engine_problem(self.studio)
        if problem:
            raise RuntimeError(f"replica {self.replica_id} cannot serve: {problem}")

    def __del__(self) -> None:  # Serve's graceful shutdown of the replica
        context = getattr(self, "context", None)
        if context is not None:
            context.runner.shutdown(wait=False)

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
