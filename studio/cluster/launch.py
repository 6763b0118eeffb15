"""Start or join Ray, deploy the application, and wait: what ``sovits-studio cluster`` does."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from engine.errors import EngineError
from studio.cluster.config import ClusterConfig


@dataclass
class RunningCluster:
    """A deployed application; :meth:`stop` removes it (and the Ray instance, when started here)."""

    config: ClusterConfig
    started_ray: bool

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        return f"http://{host}:{self.config.port}"

    def stop(self) -> None:
        import ray
        from ray import serve

        try:
            serve.delete(self.config.app_name)
            if self.started_ray:
                serve.shutdown()
        finally:
            if self.started_ray:
                ray.shutdown()


def connect(config: ClusterConfig, *, quiet: bool = False) -> bool:
    """Join the Ray cluster at ``config.address``, or start one on this machine; True if started here.

    A Ray started here keeps its own ports on 127.0.0.1 (other machines cannot join it: start a cluster
    with ``ray start --head`` for that and pass its address).
    """
    try:
        import ray
    except ImportError as e:
        raise EngineError('the cluster needs Ray Serve: pip install -e ".[cluster]"') from e
    if ray.is_initialized():
        return False
    extra = {"log_to_driver": not quiet, "logging_level": logging.WARNING if quiet else logging.INFO}
    if config.address is not None:
        ray.init(address=config.address, **extra)
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's node address: loopback
    store = config.object_store_mb * (1 << 20) if config.object_store_mb else None
    ray.init(num_cpus=config.num_cpus, object_store_memory=store, include_dashboard=False, **extra)
    return True


def deploy(config: ClusterConfig, *, quiet: bool = False) -> RunningCluster:
    """Connect, start Serve's HTTP proxy on ``config.host:port`` and deploy; returns once replicas answer."""
    config.server_settings(), config.engine_settings()  # bad limits fail here, before Ray starts
    started = connect(config, quiet=quiet)
    from ray import serve

    from studio.cluster.app import application

    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(application(config), name=config.app_name, route_prefix="/", blocking=False)  # waits for RUNNING
    except BaseException:
        if started:
            import ray

            ray.shutdown()
        raise
    return RunningCluster(config, started)

