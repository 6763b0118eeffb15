"""The Serve application: a gateway (the HTTP ingress), the synthesis replicas and the cluster state.

``build_app(args)`` is the application builder that Serve config files name
(``import_path: studio.cluster.app:build_app``); ``sovits-studio cluster`` calls it too.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from studio.cluster.config import ClusterConfig


def application(config: ClusterConfig):
    """The bound Serve application for ``config``."""
    from ray import serve

    from studio.cluster.gateway import Gateway
    from studio.cluster.replica import Synthesizer
    from studio.cluster.routing import ModelSet
    from studio.cluster.state import ClusterState

    weights = config.default_weights()
    quiet = {"enable_access_log": False}  # the state is called every second by every replica
    state_file = config.state_file()
    deployment = uuid.uuid4().hex  # a restarted state keeps it (same bound arguments); a new deployment does not
    watched = {"health_check_period_s": 2.0}  # a dead process is found (and replaced) within seconds
    state = serve.deployment(ClusterState, name="ClusterState", num_replicas=1, ray_actor_options={"num_cpus": 0},
                             logging_config=quiet, **watched).bind(ModelSet.of(weights.gpt, weights.sovits),
                                                        stale_after_s=max(5.0, 5 * config.report_interval_s),
                                                        late_after_s=3 * config.report_interval_s,
                                                        state_file=str(state_file) if state_file else None,
                                                        deployment=deployment)
    replicas = serve.deployment(Synthesizer, name="Synthesizer", **config.synthesizer_options()).bind(config, state)
    gateway = serve.deployment(Gateway, name="Gateway", num_replicas=config.gateway_replicas,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000, **watched)
    return gateway.bind(replicas, state, config)


def build_app(args: Mapping[str, Any]):
    """Serve's application builder: ``args`` may name a cluster YAML as ``config`` and override any of
    its settings (``replicas``, ``infer_config``, ``voices_dir`` ...)."""
    values = dict(args or {})
    path = values.pop("config", None)
    return application(ClusterConfig.load(path, values))
