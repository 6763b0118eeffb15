"""The cluster's deployment choices, in one frozen dataclass: from ``configs/cluster.yaml``, a Serve config
file's ``args`` or command-line flags (later sources override earlier ones), checked in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from studio.http.limits import ServerLimits

MIB = 1 << 20


@dataclass(frozen=True)
class ClusterConfig:
    """How many replicas, on what, with which engine and server limits. Paths are resolved when loaded
    from a file (relative to the working folder), so every replica reads the same ones."""

    # -- Ray and the HTTP entry
    address: str | None = None  # a running Ray cluster ("auto", "HOST:6379", "ray://..."); None: start one here
    host: str = "127.0.0.1"  # where Serve's HTTP proxy listens (0.0.0.0 for all interfaces)
    port: int = 9880
    app_name: str = "sovits-studio"
    num_cpus: int | None = None  # CPUs of a Ray instance started here (None: Ray counts them)
    object_store_mb: int | None = None  # its object store (None: Ray's default, 30% of memory)
    dashboard: bool | None = None  # Ray's dashboard (`serve status`, `ray list`) with a Ray started here;
    # None: on when its dependencies are installed
    dashboard_port: int = 8265  # where that dashboard listens (8265 is where `serve status` looks)
    temp_dir: str | None = None  # session folder of a Ray started here (None: Ray's, /tmp/ray)
    namespace: str | None = None  # Ray namespace of this driver (None: Ray's anonymous one)
    # -- replicas
    replicas: int = 1  # fixed number of synthesis replicas (when no autoscaling bounds are set)
    min_replicas: int | None = None  # autoscaling bounds: both set -> Serve autoscales between them
    max_replicas: int | None = None
    target_ongoing_requests: float = 2.0  # autoscaling aims at this many requests per replica
    max_ongoing_requests: int = 2  # requests one replica takes at once; beyond it a model set's requests spill
    # to another replica (which loads the set) or wait at the gateway. Raise it when the engine batches.
    gpus_per_replica: float = 0.0  # 0.5: two replicas share a GPU; 1: one GPU each
    cpus_per_replica: float = 1.0
    max_model_sets: int = 2  # (GPT, SoVITS) sets one replica holds; the least recently used leaves first
    gateway_replicas: int = 2  # HTTP ingress replicas: with two, new requests go around a dead one
    report_interval_s: float = 1.0  # replicas report health and metrics this often
    # -- engine (tts_infer.yaml) and device
    infer_config: str | None = None  # tts_infer.yaml; None: the built-in defaults (the CLI looks for one)
    device: str | None = None  # None: the config's
    precision: str | None = None
    vocoder_backend: str | None = None  # torch | coreml for every version; None: the config's
    verbose: bool = False  # replicas print the libraries' loading bars and messages (--verbose)
    # -- server limits (as `serve`)
    voices_dir: str = "voices"  # saved voices, shared by every replica (a folder on shared storage)
    reference_dirs: tuple[str, ...] = ()  # folders ref_audio_path may name; empty: the working folder
    weight_dirs: tuple[str, ...] = ()  # folders weights may be loaded from; empty: those of the configured ones
    voice_uploads: bool = True
    # the defaults are the HTTP server's (studio.http.limits.ServerLimits), per replica
    max_upload_bytes: int = ServerLimits.max_upload_bytes
    workers: int = ServerLimits.workers  # syntheses computed at once per replica
    max_queue: int | None = ServerLimits.max_queue  # per replica (None: sized from the engine, as serve)
    max_pending_chunks: int = ServerLimits.max_pending_chunks
    max_tokens_per_sentence: int | None = ServerLimits.max_tokens_per_sentence
    max_text_chars: int | None = None  # None: EngineSettings' default
    # operating knobs (engine.config.KNOBS: slots, warmup, model_pool_mb ...) over the tts_infer.yaml's,
    # as `serve`'s flags; a mapping in YAML
    knobs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, allow_zero: bool = False) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                value >= 0 if allow_zero else value > 0)
            if not ok:
                raise ConfigError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, "
                                  f"got {value!r}")

        for name in ("replicas", "max_ongoing_requests", "max_model_sets", "gateway_replicas", "port",
                     "target_ongoing_requests", "report_interval_s", "cpus_per_replica", "dashboard_port"):
            positive(name, getattr(self, name))
        positive("gpus_per_replica", self.gpus_per_replica, allow_zero=True)
        if self.gpus_per_replica > 1 and not float(self.gpus_per_replica).is_integer():
            raise ConfigError(f"gpus_per_replica: {self.gpus_per_replica} — above 1 it must be a whole number")
        bounds = (self.min_replicas, self.max_replicas)
        if (bounds[0] is None) != (bounds[1] is None):
            raise ConfigError("min_replicas and max_replicas: give both (autoscaling) or neither (fixed replicas)")
        if bounds[0] is not None:
            positive("min_replicas", bounds[0], allow_zero=True)
            positive("max_replicas", bounds[1])
            if bounds[0] > bounds[1]:
                raise ConfigError(f"min_replicas ({bounds[0]}) is above max_replicas ({bounds[1]})")
        for name in ("num_cpus", "object_store_mb"):
            value = getattr(self, name)
            if value is not None:
                positive(name, value)
        if (self.device or "").startswith("cuda") and self.gpus_per_replica == 0:
            raise ConfigError(f"device {self.device}: set gpus_per_replica (1, or 0.5 to share a GPU); Ray hides "
                              f"the GPUs from replicas that reserve none")
        if self.address is not None and (self.num_cpus is not None or self.object_store_mb is not None):
            raise ConfigError("num_cpus and object_store_mb size a Ray instance started here; with address "
                              "set, give them to `ray start` instead")
        from engine.config import KNOB_KEYS

        for key, _ in self.knobs:
            if key not in KNOB_KEYS:
                raise ConfigError(f"knobs: unknown knob {key!r}; known: {', '.join(KNOB_KEYS)}")

    # ---- sources ---------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "settings") -> "ClusterConfig":
        """From a mapping of field names (YAML, Serve ``args``); an unknown key is an error naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        clean = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
        knobs = clean.get("knobs", ())
        if isinstance(knobs, Mapping):
            clean["knobs"] = tuple(knobs.items())
        elif not (isinstance(knobs, tuple) and all(isinstance(k, (tuple, list)) and len(k) == 2 for k in knobs)):
            raise ConfigError(f"{source}: knobs must be a mapping of knob names to values, got {knobs!r}")
        else:
            clean["knobs"] = tuple(tuple(k) for k in knobs)
        return cls(**clean)

    @classmethod
    def load(cls, path: str | os.PathLike | None, overrides: Mapping[str, Any] = {}) -> "ClusterConfig":
        """``path`` (a cluster YAML; None: defaults) with ``overrides`` (None values are left out) on top."""
        import yaml

        values: dict[str, Any] = {}
        if path is not None:
            try:
                data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError) as e:
                raise ConfigError(f"{path}: cannot read the cluster config ({e})") from e
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: expected a mapping of settings")
            values.update(data)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(values, str(path or "settings")).resolved()

    def resolved(self) -> "ClusterConfig":
        """Folder and file paths made absolute (replicas may run in another working folder)."""
        def absolute(p: str | os.PathLike) -> str:
            return str(Path(os.path.expanduser(str(p))).resolve())

        return replace(
            self,
            infer_config=absolute(self.infer_config) if self.infer_config else None,
            voices_dir=absolute(self.voices_dir) if self.voices_dir else "",
            reference_dirs=tuple(absolute(d) for d in (self.reference_dirs or (os.getcwd(),))),
            weight_dirs=tuple(absolute(d) for d in self.weight_dirs),
        )

    # ---- what the parts need ------------------------------------------------------------------
    def engine_config(self):
        """The parsed ``tts_infer.yaml`` (the built-in defaults when none is named)."""
        from engine.config import load_config, parse_config

        return load_config(self.infer_config) if self.infer_config else parse_config({}, "built-in defaults")

    def default_weights(self):
        """The configured model set (:class:`engine.loading.model_pool.WeightSet`)."""
        from engine.loading.model_pool import WeightSet

        return WeightSet.from_config(self.engine_config())

    def weight_roots(self) -> tuple[str, ...]:
        """``weight_dirs``, else the folders of the configured weights (as the HTTP server decides)."""
        if self.weight_dirs:
            return self.weight_dirs
        w = self.default_weights()
        return tuple(dict.fromkeys(str(Path(p).resolve().parent) for p in (w.gpt, w.sovits)))

    def as_args(self):
        """These settings as the parsed flags of ``serve`` (what :mod:`engine.settings` reads, as for ``serve``), so the
        cluster gets its token cap, knobs and text limit from the same functions as every other front door."""
        import argparse

        return argparse.Namespace(max_tokens_per_sentence=self.max_tokens_per_sentence,
                                  max_text_chars=self.max_text_chars, **dict(self.knobs))

    def server_settings(self, engine_config=None):
        """The replicas' server settings; ``max_tokens_per_sentence`` unset: the tts_infer.yaml's, as ``serve``."""
        from engine.settings import token_cap
        from studio.http.context import ServerSettings

        engine_config = engine_config or self.engine_config()
        limits = ServerLimits(max_upload_bytes=self.max_upload_bytes, workers=self.workers, max_queue=self.max_queue,
                              max_pending_chunks=self.max_pending_chunks,
                              max_tokens_per_sentence=token_cap(engine_config, self.as_args()))
        return ServerSettings(
            reference_roots=self.reference_dirs, weight_roots=self.weight_roots(), profiles_dir=self.voices_dir,
            voice_uploads=self.voice_uploads, limits=limits)

    def engine_settings(self, engine_config=None):
        """The replicas' ``EngineSettings``: the knobs (these over the tts_infer.yaml's), as ``serve``."""
        from engine.settings import engine_settings

        return engine_settings(engine_config or self.engine_config(), self.as_args(), weight_roots=self.weight_roots())

    def warmup_settings(self, engine_config=None):
        from engine.settings import warmup_settings

        return warmup_settings(engine_config or self.engine_config(), self.as_args())

    def state_file(self) -> Path | None:
        """Where the cluster state keeps the default weights (a file in the shared voices folder, so a
        restarted state finds it, on any machine); None without a voices folder."""
        return Path(self.voices_dir) / f".cluster-{self.app_name}.json" if self.voices_dir else None

    def replica_bounds(self) -> dict[str, int]:
        if self.min_replicas is None:
            return {"min": self.replicas, "max": self.replicas}
        return {"min": self.min_replicas, "max": self.max_replicas}

    def synthesizer_options(self) -> dict[str, Any]:
        """``serve.deployment`` options of the replicas."""
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.cpus_per_replica, "num_gpus": self.gpus_per_replica},
            "max_ongoing_requests": self.max_ongoing_requests,
            "health_check_period_s": 2.0, "health_check_timeout_s": 30.0,
            "graceful_shutdown_timeout_s": 20.0,
        }
        if self.min_replicas is None:
            options["num_replicas"] = self.replicas
        else:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": max(self.min_replicas, 1),
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        return options
