"""Start or join Ray, deploy the application, and wait: what ``sovits-studio cluster`` does."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from engine.errors import EngineError
from studio.cluster.config import ClusterConfig

log = logging.getLogger(__name__)
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "studio.cluster.proxy:proxy_middlewares"


@dataclass
class RunningCluster:
    """A deployed application; :meth:`stop` removes it (and the Ray instance, when started here)."""

    config: ClusterConfig
    started_ray: bool
    dashboard_url: str | None = None  # Ray's dashboard of a Ray started here (None: off)

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


def dashboard_wanted(config: ClusterConfig) -> bool:
    """``config.dashboard``, or (None) whether Ray's dashboard dependencies are installed."""
    if config.dashboard is not None:
        return config.dashboard
    from ray._private.utils import get_dashboard_dependency_error

    return get_dashboard_dependency_error() is None


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def connect(config: ClusterConfig, *, quiet: bool = False) -> tuple[bool, str | None]:
    """Join the Ray cluster at ``config.address``, or start one on this machine. Returns (started here,
    the dashboard's URL or None).

    A Ray started here is always a new one (``address="local"``: never the instance ``ray start`` left
    running on this machine), keeps its ports on 127.0.0.1 (other machines cannot join it: start a cluster
    with ``ray start --head`` for that and pass its address), and lives in ``config.temp_dir``.
    """
    try:
        import ray
    except ImportError as e:
        raise EngineError('the cluster needs Ray Serve: pip install -e ".[cluster]"') from e
    if ray.is_initialized():
        return False, None
    extra = {"log_to_driver": not quiet, "logging_level": logging.WARNING if quiet else logging.INFO,
             "namespace": config.namespace}
    if config.address is not None:
        ray.init(address=config.address, **extra)
        return False, None
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's node address: loopback
    # Serve's HTTP proxy takes its middlewares from here (every Ray process started below inherits it)
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    store = config.object_store_mb * (1 << 20) if config.object_store_mb else None
    dashboard = dashboard_wanted(config)
    port = config.dashboard_port
    if dashboard and not port_is_free("127.0.0.1", port):  # e.g. another Ray's dashboard
        port = free_port()
        log.warning("port %d is taken (another Ray's dashboard?); Ray's dashboard listens on %d instead",
                    config.dashboard_port, port)
    with warnings.catch_warnings():
        # Ray 2.55 tells every driver that a future Ray will stop hiding GPUs from actors that reserve none;
        # replicas rely on that hiding today (gpus_per_replica 0 means the CPU), so the tip is noise here
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        ray.init(address="local", num_cpus=config.num_cpus, object_store_memory=store,
                 include_dashboard=dashboard, dashboard_host="127.0.0.1", dashboard_port=port if dashboard else None,
                 _temp_dir=config.temp_dir, **extra)
    return True, f"http://127.0.0.1:{port}" if dashboard else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _DropMessages(logging.Filter):
    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


@contextlib.contextmanager
def _without_http_config_warning() -> Iterator[None]:
    """``serve.run`` starts Serve with its own default HTTP options and says that they differ from the
    ones ``serve.start`` set and that it ignores its own: messages about nothing, dropped here."""
    logger = logging.getLogger("ray.serve")
    drop = _DropMessages("The new client HTTP config differs from the existing one",
                         "New http options will not be applied")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def deploy(config: ClusterConfig, *, quiet: bool = False) -> RunningCluster:
    """Connect, start Serve's HTTP proxy on ``config.host:port`` and deploy; returns once every replica
    has loaded and warmed its model sets (replicas report healthy only then)."""
    engine_config = config.engine_config()
    config.server_settings(engine_config), config.engine_settings(engine_config)  # bad limits fail here, before Ray
    started, dashboard = connect(config, quiet=quiet)
    from ray import serve

    from studio.cluster.app import application
    from studio.cluster.proxy import proxy_middlewares

    try:
        http = {"host": config.host, "port": config.port}
        if not started:  # a Ray of its own has the middleware from PROXY_CALLBACK_ENV; a joined one may not
            # (docs/cluster.md: set it on `ray start`). Ray 2.55 calls this way in deprecated, but runs it.
            http["middlewares"] = proxy_middlewares()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Passing `middlewares` to HTTPOptions is deprecated")
            serve.start(http_options=http)
        with _without_http_config_warning():
            serve.run(application(config), name=config.app_name, route_prefix="/", blocking=False)  # waits: RUNNING
    except BaseException:
        if started:
            import ray

            ray.shutdown()
        raise
    return RunningCluster(config, started, dashboard)
