"""`sovits-studio cluster`: the HTTP API of `serve` on a Ray Serve cluster (replicas, routing by model set,
failover). Needs the optional extra: ``pip install -e ".[cluster]"``. See docs/cluster.md."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

CLUSTER_CONFIG = "configs/cluster.yaml"  # read when --cluster-config is not given and it exists here


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from studio.cli.bootstrap import PRECISIONS, add_knob_arguments, add_verbose_argument
    from studio.cluster.config import ClusterConfig as C

    def flag(*names: str, **kw) -> None:
        parser.add_argument(*names, default=None, **kw)  # None: the cluster YAML's value, else the default

    flag("--cluster-config", metavar="YAML", help=f"cluster settings (default: {CLUSTER_CONFIG} if it exists); "
                                                  f"the flags below override it")
    flag("-c", "--config", dest="infer_config", metavar="TTS_INFER_YAML",
         help="tts_infer.yaml of the engine (default: configs/tts_infer.yaml or GPT_SoVITS/configs/tts_infer.yaml)")
    flag("--address", help="join this Ray cluster (auto, HOST:6379); default: start Ray on this machine only")
    flag("-a", "--host", help=f"address of the HTTP entry (default {C.host}; 0.0.0.0 for all)")
    flag("-p", "--port", type=int, help=f"port of the HTTP entry (default {C.port})")
    flag("--replicas", type=int, help=f"synthesis replicas (default {C.replicas})")
    flag("--gpus-per-replica", type=float, help="GPUs each replica reserves: 1 one GPU each, 0.5 two per GPU "
                                                f"(default {C.gpus_per_replica:g})")
    flag("--cpus-per-replica", type=float, help=f"CPUs each replica reserves (default {C.cpus_per_replica:g})")
    flag("--min-replicas", type=int, help="autoscale between --min-replicas and --max-replicas (give both)")
    flag("--max-replicas", type=int)
    flag("--target-ongoing-requests", type=float,
         help=f"autoscaling target of requests per replica (default {C.target_ongoing_requests:g})")
    flag("--max-model-sets", type=int, help=f"GPT+SoVITS sets one replica holds (default {C.max_model_sets})")
    flag("--num-cpus", type=int, help="CPUs of the Ray started here (default: all)")
    flag("--object-store-mb", type=int, help="object store of the Ray started here, MiB (default: Ray's)")
    flag("--device", help="auto, cpu, cuda, mps (default: the config's); each replica sees its own GPUs")
    flag("--precision", choices=PRECISIONS)
    flag("--vocoder-backend", choices=("torch", "coreml"), help="every version's vocoder backend (default: the "
                                                               "config's vocoder_backend keys)")
    flag("--voices-dir", help=f"saved voices, shared by all replicas (default ./{C.voices_dir})")
    flag("--reference-dir", dest="reference_dirs", action="append", metavar="DIR",
         help="folder ref_audio_path may name files in (repeatable; default: the working folder)")
    flag("--weights-dir", dest="weight_dirs", action="append", metavar="DIR",
         help="folder weights may be loaded from (repeatable; default: as serve)")
    flag("--workers", type=int, help=f"syntheses computed at once per replica (default {C.workers})")
    flag("--max-queue", type=int, help="requests waiting per replica; more get 503 (default: auto, as many as "
         "the replica's decoding slots and queue hold)")
    flag("--max-upload-mb", type=float, help=f"request body limit in MiB (default {C.max_upload_bytes / (1 << 20):g})")
    flag("--max-tokens-per-sentence", type=int, help="cap semantic tokens per sentence (default: the GPT file's)")
    parser.add_argument("--no-voice-uploads", dest="voice_uploads", action="store_const", const=False,
                        default=None, help="refuse POST/DELETE /v1/voices")
    flag("--gateway-replicas", type=int, help=f"HTTP ingress replicas (default {C.gateway_replicas}; with two or "
                                              f"more, new requests go around a dead one)")
    flag("--dashboard", action=argparse.BooleanOptionalAction,
         help="Ray's dashboard with a Ray started here, for `serve status` and `ray list` (default: on when "
              "ray[default] is installed)")
    flag("--dashboard-port", type=int, help=f"port of that dashboard (default {C.dashboard_port}, where `serve "
                                            f"status` looks; a free one if taken)")
    add_knob_arguments(parser, warmup=True)
    add_verbose_argument(parser)


def config_from_args(args: argparse.Namespace):
    """The cluster YAML (``--cluster-config``, else configs/cluster.yaml when it exists), the flags on top,
    then what `serve` would find by itself."""
    from studio.cluster.config import ClusterConfig

    from engine.config import KNOB_KEYS

    knobs = {k: v for k, v in vars(args).items() if k in KNOB_KEYS and v is not None}
    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("cluster_config", "max_upload_mb") and k not in KNOB_KEYS}
    if args.max_upload_mb is not None:
        overrides["max_upload_bytes"] = int(args.max_upload_mb * (1 << 20))
    path = args.cluster_config or (CLUSTER_CONFIG if Path(CLUSTER_CONFIG).is_file() else None)
    config = ClusterConfig.load(path, overrides)
    if knobs:  # flags over the cluster YAML's knobs, which are over the tts_infer.yaml's
        config = replace(config, knobs=tuple({**dict(config.knobs), **knobs}.items()))
    return with_serve_defaults(config)


def with_serve_defaults(config):
    """What `serve` finds by itself: the tts_infer.yaml here, and the official weight folders."""
    from studio.cli.bootstrap import find_config
    from studio.cli.serve import OFFICIAL_WEIGHT_DIRS

    found = config.infer_config or find_config(None)
    config = replace(config, infer_config=str(found) if found else None)
    if not config.weight_dirs:
        engine = config.engine_config()
        configured = [engine.path(k).parent for k in ("t2s_weights_path", "vits_weights_path")]
        dirs = dict.fromkeys(str(Path(d).resolve()) for d in (*OFFICIAL_WEIGHT_DIRS, *configured))
        config = replace(config, weight_dirs=tuple(dirs))
    return config.resolved()


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading
    import time

    from studio.cli.bootstrap import g2pw_note, incomplete_weights_warning, quiet_libraries
    from studio.cluster.launch import deploy

    quiet_libraries(args.verbose)  # here, and in each replica (ClusterConfig.verbose)
    start = time.monotonic()
    config = config_from_args(args)
    engine_config = config.engine_config()
    for notice in (incomplete_weights_warning(engine_config),
                   *(f"warning: {p}" for p in engine_config.problems()), g2pw_note(engine_config)):
        if notice:
            print(notice, file=sys.stderr)
    cluster = deploy(config)
    bounds = config.replica_bounds()
    count = bounds["min"] if bounds["min"] == bounds["max"] else f"{bounds['min']}-{bounds['max']}"
    dashboard = f"; Ray's dashboard: {cluster.dashboard_url}" if cluster.dashboard_url else ""
    print(f"serving {cluster.url} ({count} replicas, warmed; /health lists them{dashboard}), up in "
          f"{time.monotonic() - start:.0f} s. Ctrl-C stops.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0
