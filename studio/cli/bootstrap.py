"""What the commands share: finding the config, the device and precision flags, the engine and server
limits with their one set of defaults, and building the engine from them.

Every default shown by ``-h`` is read from the dataclass that owns it (:class:`engine.options.EngineSettings`,
:class:`studio.http.limits.ServerLimits`), so a default lives in one place. Importing this module is cheap:
nothing here imports torch until an engine is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# what a command's flags and its config give the engine: the functions every front door (and the cluster) uses
from engine.settings import engine_settings, knob_settings, knob_values, token_cap, warmup_settings  # noqa: F401

# Where a command looks for tts_infer.yaml when --config is not given, in order: ours, then an official
# GPT-SoVITS checkout's (the command run from its root).
CONFIG_CANDIDATES = ("configs/tts_infer.yaml", "GPT_SoVITS/configs/tts_infer.yaml")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
MIB = 1 << 20


def find_config(arg: str | None) -> Path | None:
    """``arg`` if given, else the first of :data:`CONFIG_CANDIDATES` that exists here, else None."""
    if arg:
        return Path(arg)
    return next((Path(c) for c in CONFIG_CANDIDATES if Path(c).is_file()), None)


def load_engine_config(arg: str | None, *, required: bool):
    """The parsed config: ``--config``, a discovered one, or (when not ``required``) the built-in defaults."""
    from engine.config import load_config, parse_config
    from engine.errors import ConfigError

    path = find_config(arg)
    if path is not None:
        return load_config(path)
    if required:
        raise ConfigError(f"no --config given and none of {', '.join(CONFIG_CANDIDATES)} here; pass --config "
                          f"PATH (make one with `sovits-studio download` or `sovits-studio make-test-weights DIR`)")
    return parse_config({}, "built-in defaults")


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", default=None,
                        help=f"tts_infer.yaml (default: the first of {', '.join(CONFIG_CANDIDATES)} that exists)")


def add_device_arguments(parser: argparse.ArgumentParser, *, device: str | None = None,
                         precision: str | None = None) -> None:
    """``--device`` and ``--precision``, with the same choices on every command (default: the config's)."""
    parser.add_argument("--device", default=device,
                        help=f"auto, cpu, cuda, cuda:N or mps (default: {device or 'the config' + chr(39) + 's'})")
    parser.add_argument("--precision", default=precision, choices=PRECISIONS,
                        help="auto (per stage: fp16 with an fp32 vocoder on MPS, fp16 on CUDA, fp32 on CPU), fp32, "
                             f"fp16 or bf16 (default: {precision or 'the config' + chr(39) + 's is_half'})")
    add_vocoder_backend_argument(parser)


def add_vocoder_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--vocoder-backend {torch,coreml}``: every version's vocoder backend (default: the config's keys)."""
    from engine.config import VOCODER_BACKENDS

    parser.add_argument("--vocoder-backend", default=None, choices=VOCODER_BACKENDS,
                        help="torch, or coreml (macOS: the Core ML packages the config names, per version); "
                             "default: each section's vocoder_backend")


def add_engine_limits(parser: argparse.ArgumentParser) -> None:
    """The text limit every front door applies (default from EngineSettings)."""
    from engine.options import EngineSettings

    parser.add_argument("--max-text-chars", type=int, default=EngineSettings.max_text_chars,
                        help=f"longest text accepted (default {EngineSettings.max_text_chars})")


def add_server_arguments(parser: argparse.ArgumentParser, *, port: int, port_note: str) -> None:
    """Host, port, and a server's limits (defaults from studio.http.limits.ServerLimits, the one place
    they live; ``limits_from_args`` turns the flags back into a ServerLimits)."""
    from studio.http.limits import add_limit_arguments

    parser.add_argument("-a", "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("-p", "--port", type=int, default=port, help=f"port (default {port}, {port_note})")
    add_limit_arguments(parser)
    parser.add_argument("--profiles-dir", default=None,
                        help="saved voices for /v1/audio/speech (default: voices/ in the user's data folder, "
                             "e.g. ~/.local/share/sovits-studio/voices)")
    add_engine_limits(parser)


def voices_folder(arg: str | None) -> str:
    """``--profiles-dir``, else ``voices`` in the user's data folder (platformdirs: ~/.local/share/sovits-studio
    on Linux, ~/Library/Application Support/sovits-studio on macOS, %LOCALAPPDATA%\\sovits-studio on Windows),
    never the working folder."""
    if arg:
        return arg
    from platformdirs import user_data_path

    return str(user_data_path("sovits-studio", appauthor=False) / "voices")


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the libraries' progress bars and messages (model loading, dictionaries)")


def quiet_libraries(verbose: bool) -> None:
    """Unless ``verbose``: no transformers / huggingface_hub progress bars ("Loading weights") and no jieba
    dictionary messages ("Building prefix dict") in the command's output. Call before the engine loads."""
    from engine.platform_env import quiet_libraries as quiet

    quiet(verbose)


def add_knob_arguments(parser: argparse.ArgumentParser, *, warmup: bool = False) -> None:
    """The operating knobs (engine.config.KNOBS): one flag per config key, default shown from its dataclass.

    ``warmup``: also ``--warmup/--no-warmup`` (serve and webui warm up at start)."""
    from engine.config import KNOBS
    from engine.options import PRESSURE_ACTIONS

    group = parser.add_argument_group("operating knobs (also config keys of the active section; the flag wins)")
    for knob in KNOBS:
        if knob.key == "warmup" and not warmup:
            continue
        flag, default = "--" + knob.key.replace("_", "-"), knob.default()
        if knob.kind is bool:
            group.add_argument(flag, dest=knob.key, action=argparse.BooleanOptionalAction, default=None,
                               help=f"{knob.help} (default: {'on' if default else 'off'})")
            continue
        choices = PRESSURE_ACTIONS if knob.key == "on_memory_pressure" else None
        group.add_argument(flag, dest=knob.key, type=knob.kind, default=None, choices=choices,
                           help=f"{knob.help} (default {default})")












def incomplete_weights_warning(config) -> str:
    """The warning a server prints when the config's default weights are missing ("" when complete)."""
    missing = config.missing_files()
    if not missing:
        return ""
    listed = "\n".join(f"  {k}: {p}" for k, p in missing.items())
    return (f"warning: the default weights are incomplete ({config.source}):\n{listed}\n"
            f"Run `sovits-studio download --version {config.active.version}`; requests naming other weights "
            f"still work.")


def g2pw_note(config) -> str:
    """The note a front door prints when the config's v2+ Mandarin runs without G2PW ("" when it runs with it): the
    same words `build_studio` prints, for commands that build no engine here (cluster: its replicas do)."""
    from engine.text.chinese import g2pw_fix, g2pw_notice

    problem, _ = g2pw_fix(config.active.version, config.g2pw_folder(), config.base_dir)
    return f"note: {g2pw_notice(problem, config.base_dir)}" if problem else ""


def build_studio(config, args: argparse.Namespace, reference_rules=None, **settings):
    """The engine for ``config`` with the command's ``--device``/``--precision``, the knobs (flags over the
    config's keys) and ``EngineSettings`` fields given here.

    A device named only by the config that this machine lacks falls back to auto with a printed notice
    (``studio.device_notice``); a device given on the command line must exist. Config settings that cannot
    work as written are printed as warnings (``studio.config_notices``), and so is a v2+ Mandarin frontend
    without G2PW (``studio.g2pw_notice``, with the command that fetches it).
    """
    from engine.platform_env import set_switch_interval
    from engine.studio import Studio

    extra = {"reference_rules": reference_rules} if reference_rules is not None else {}
    studio = Studio.from_config(config, device=getattr(args, "device", None),
                                precision=getattr(args, "precision", None),
                                settings=engine_settings(config, args, **settings),
                                vocoder_backend=getattr(args, "vocoder_backend", None), **extra)
    set_switch_interval(studio.settings.switch_interval_ms)
    for notice in (studio.device_notice, studio.vocoder_notice, *studio.config_notices):
        if notice:
            print(f"warning: {notice}", file=sys.stderr)
    if studio.g2pw_notice:
        print(f"note: {studio.g2pw_notice}", file=sys.stderr)
    return studio


def start_warmup(studio, config, args: argparse.Namespace, app=None):
    """Warm ``studio`` up in the background unless ``--no-warmup``/``warmup: false``; sets and returns
    ``studio.readiness`` ("starting" until the warm-up ends, then "ready"). With the server's ``app``, the
    warm-up runs on its synthesis workers (the threads that serve the requests)."""
    from engine.readiness import Readiness
    from engine.warmup import configured_weight_sets, warm_up_in_background

    warm = warmup_settings(config, args)
    if not warm.enabled or config.missing_files():  # nothing to load yet: requests name their own weights
        studio.readiness = Readiness(ready=True)
        return studio.readiness
    studio.readiness = Readiness()
    print("warming up (load the configured models, one short synthesis per version); /health says "
          "\"starting\" until then", file=sys.stderr)
    context = getattr(getattr(app, "state", None), "context", None)
    submit = context.runner.submit if context is not None else None
    warm_up_in_background(studio, studio.readiness, configured_weight_sets(config, studio.default_weights), warm,
                          submit=submit)
    return studio.readiness
