"""The official ``tts_infer.yaml`` format: read, validate, resolve. Never written back.

A file has version sections (``v1 v2 v2Pro v2ProPlus v3 v4``) and an optional ``custom`` section,
each with the seven official keys. ``device`` and ``is_half`` may be left out (or ``device: auto``): the engine
then picks the device itself (cuda, then mps, then cpu) and the precision to match (``engine.runtime``); a device
the file names stays its choice. Sections in the file replace the built-in defaults section by
section; the active section is ``custom`` when present, else ``v2`` (official ``TTS.py``
``TTS_Config.__init__``). Paths that are
empty or missing fall back to the same key of the active version's section, as the official code does.

SoVITS Studio extension keys (all optional; the official code never sees a file that uses them):

* ``vocoder_path``, ``vocoder_backend``, ``vocoder_coreml_package``, ``sv_weights_path``: per version.
  A section's value serves the version it names, so one file can hold the v3 BigVGAN folder (in its
  ``v3`` section) and the v4 ``vocoder.pth`` (in ``v4``); the active section's values serve its own
  version (:meth:`InferConfig.extension`).
* ``g2pw_model_path``: the G2PW model folder for Mandarin polyphones (v2 and later), read from the active
  section; empty: the official location ``GPT_SoVITS/text/G2PWModel`` (where ``download`` puts it).
* ``precision``: ``auto``, ``fp32``, ``fp16`` or ``bf16`` for every stage, or a mapping of stages
  (``t2s sovits vocoder ssl bert sv``, plus ``default``) to those names; overrides ``is_half``.
* the operating knobs of :data:`KNOBS` (cache and pool sizes, the memory watermark, warm-up, the
  scheduler's slot count), read from the active section. Their defaults live in the settings
  dataclass each one sets, nowhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from engine.data import load_json
from engine.errors import ConfigError
from engine.versions import VERSIONS

SECTIONS = ("custom", *VERSIONS)
PATH_KEYS = ("t2s_weights_path", "vits_weights_path", "bert_base_path", "cnhuhbert_base_path")
VOCODER_BACKENDS = ("torch", "coreml")
PRECISION_NAMES = ("auto", "fp32", "fp16", "bf16")
PRECISION_STAGES = ("t2s", "sovits", "vocoder", "ssl", "bert", "sv")  # engine.runtime.STAGES
MIB = 1 << 20


@dataclass(frozen=True)
class Knob:
    """An operating knob: a config key (and the CLI flag ``--key-with-dashes``) that sets one field of
    a settings dataclass. The default is that field's default (read, never repeated here)."""

    key: str
    owner: str  # "module:Class" of the settings dataclass
    field: str
    kind: type  # int | float | bool | str
    help: str
    scale: int = 1  # config/CLI unit -> field unit (MiB -> bytes)

    def settings_class(self) -> type:
        import importlib

        module, _, name = self.owner.partition(":")
        return getattr(importlib.import_module(module), name)

    def default(self) -> Any:
        """The default in config/CLI units."""
        value = next(f for f in fields(self.settings_class()) if f.name == self.field).default
        return value // self.scale if self.scale != 1 else value


ENGINE = "engine.options:EngineSettings"
WARMUP = "engine.warmup:WarmupSettings"
KNOBS = (
    Knob("reference_cache_entries", ENGINE, "reference_cache_entries", int, "prepared references kept (LRU)"),
    Knob("reference_threads", ENGINE, "reference_threads", int,
         "threads that prepare new references on a GPU (their HuBERT / speaker-model runs batched together)"),
    Knob("reference_cache_mb", ENGINE, "reference_cache_bytes", int, "MiB of prepared references kept", MIB),
    Knob("model_pool_mb", ENGINE, "model_pool_bytes", int, "MiB of model weights kept loaded (LRU)", MIB),
    Knob("memory_watermark", ENGINE, "memory_watermark", float,
         "fraction of memory above which caches shrink, idle models go and requests are refused"),
    Knob("on_memory_pressure", ENGINE, "on_memory_pressure", str,
         "after the degrade steps: cpu (discrete GPUs only), wait or refuse"),
    Knob("warmup", WARMUP, "enabled", bool, "load the configured models and synthesise once at start"),
    Knob("slots", ENGINE, "scheduler_slots", int, "requests the scheduler decodes together (0: from free memory)"),
    Knob("scheduler_queue", ENGINE, "scheduler_queue", int, "requests waiting for a slot; one more gets 503"),
    Knob("max_schedulers", ENGINE, "max_schedulers", int,
         "model sets served at once (each holds a slot pool); a new set while all are busy gets 503"),
    Knob("text_processes", ENGINE, "text_processes", int,
         "processes that read request texts off the engine's GIL (-1: 2 on CUDA, none elsewhere; 0: none)"),
    Knob("acoustic_compile", ENGINE, "acoustic_compile", bool,
         "CUDA: the streamed chunks' voicing compiled (torch.compile, channels-last: 2.1x the voicing; warm-up about 2 min)"),
    Knob("acoustic_pipeline", ENGINE, "acoustic_pipeline", bool,
         "CUDA: queue each acoustic round's kernels before the previous round's audio is delivered"),
    Knob("switch_interval_ms", ENGINE, "switch_interval_ms", float,
         "the GIL switch interval of a serving process in ms (0: Python's 5 ms; smaller: decode steps wait less "
         "for the GIL)"),
    Knob("prefill_graphs", ENGINE, "prefill_graphs", bool,
         "CUDA: prefills replay CUDA graphs captured per bucket of rows and width (false: eager prefills)"),
    Knob("prefill_wait_ms", ENGINE, "prefill_wait_ms", int,
         "CUDA: how long a new sentence may wait for others to share its prefill while rows decode (0: none)"),
    Knob("stream_context_tokens", ENGINE, "stream_context_tokens", int,
         "token streaming: tokens before a chunk its encoders see (0: the whole sentence, official; N: faster, "
         "approximate)"),
)
KNOB_KEYS = {k.key: k for k in KNOBS}


@dataclass(frozen=True)
class Section:
    """One section of ``tts_infer.yaml``: the seven official keys and our optional extensions."""

    version: str
    t2s_weights_path: str
    vits_weights_path: str
    bert_base_path: str
    cnhuhbert_base_path: str
    device: str = "auto"  # cpu, cuda, cuda:N, mps; auto (or left out): cuda, then mps, then cpu
    is_half: bool | None = None  # None (left out): the precision that suits the device (engine.runtime)
    # SoVITS Studio extensions (optional in files; the official code ignores nothing else, so
    # files using them are ours).
    vocoder_backend: str = "torch"  # torch | coreml (coreml only takes effect on macOS)
    vocoder_path: str = ""  # BigVGAN folder (v3) or vocoder.pth (v4); empty: the official location
    sv_weights_path: str = ""  # ERes2NetV2 checkpoint (v2Pro*); empty: the official location
    vocoder_coreml_package: str = ""  # the .mlpackage used when vocoder_backend is coreml
    g2pw_model_path: str = ""  # the G2PW model folder (Mandarin polyphones, v2+); empty: the official location
    max_tokens_per_sentence: int = 0  # a cap on semantic tokens per sentence (25 = 1 s); 0: the model's own
    # (applied by serve, webui, cluster and synth; the Python API takes SynthesisOptions(early_stop_num=...))
    random_weights: bool = False  # a random-weight test set (make-test-weights): noise, not speech
    precision: str = ""  # auto | fp32 | fp16 | bf16 for every stage; "" = from is_half
    stage_precisions: tuple[tuple[str, str], ...] = ()  # (stage, precision) from a `precision` mapping
    knobs: tuple[tuple[str, Any], ...] = ()  # (knob key, value) of the KNOBS set in this section

    @property
    def knob_values(self) -> dict[str, Any]:
        return dict(self.knobs)


_EXTENSION_KEYS = {"vocoder_backend", "vocoder_path", "sv_weights_path", "vocoder_coreml_package",
                   "max_tokens_per_sentence", "random_weights", "g2pw_model_path"}
G2PW_FOLDER = Path("GPT_SoVITS/text/G2PWModel")  # official chinese2.py's model_dir (relative to its root)
_AUTO_KEYS = {"device", "is_half"}  # official keys that may be left out: the engine picks (engine.runtime)
_OFFICIAL_KEYS = ({f.name for f in fields(Section)} - _EXTENSION_KEYS - _AUTO_KEYS
                  - {"precision", "stage_precisions", "knobs"})
_KEY_TYPES: dict[str, type] = {f.name: {"bool": bool, "bool | None": bool, "int": int}.get(str(f.type), str)
                               for f in fields(Section) if f.name not in ("stage_precisions", "knobs")}
_KNOWN_KEYS = set(_KEY_TYPES) | set(KNOB_KEYS)


def _parse_precision(value: Any, where: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    names = ", ".join(PRECISION_NAMES)
    if isinstance(value, str):
        if value not in PRECISION_NAMES:
            raise ConfigError(f"{where}.precision is {value!r}; use one of {names}, or a mapping of stages")
        return value, ()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}.precision must be one of {names} or a mapping of stages, found {value!r}")
    default = ""
    stages = []
    for stage, name in value.items():
        if stage != "default" and stage not in PRECISION_STAGES:
            raise ConfigError(f"{where}.precision.{stage}: unknown stage; stages are default, "
                              f"{', '.join(PRECISION_STAGES)}")
        allowed = PRECISION_NAMES if stage == "default" else PRECISION_NAMES[1:]
        if name not in allowed:
            raise ConfigError(f"{where}.precision.{stage} is {name!r}; use one of {', '.join(allowed)}")
        if stage == "default":
            default = name
        else:
            stages.append((stage, name))
    return default, tuple(stages)


def _parse_knob(knob: Knob, value: Any, where: str) -> Any:
    kind = knob.kind
    ok = (isinstance(value, bool) if kind is bool
          else isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
          else isinstance(value, int) and not isinstance(value, bool) if kind is int
          else isinstance(value, str))
    if not ok:
        raise ConfigError(f"{where}.{knob.key} must be {_KIND_WORDS[kind]}, found {value!r}")
    return float(value) if kind is float else value


_KIND_WORDS = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}


def _parse_section(name: str, raw: Any, where: str) -> Section:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: section {name!r} must be a mapping of keys, found {type(raw).__name__}")
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} in section {name!r}; known keys: {', '.join(sorted(_KNOWN_KEYS))}"
        )
    missing = sorted(_OFFICIAL_KEYS - set(raw))
    if missing:
        raise ConfigError(f"{where}: section {name!r} lacks key(s) {', '.join(missing)}")
    values: dict[str, Any] = {}
    knobs = []
    for key, value in raw.items():
        if key == "precision":
            values["precision"], values["stage_precisions"] = _parse_precision(value, f"{where}: key {name}")
            continue
        if key in KNOB_KEYS:
            knobs.append((key, _parse_knob(KNOB_KEYS[key], value, f"{where}: key {name}")))
            continue
        want = _KEY_TYPES[key]
        if value is None and key in _AUTO_KEYS:  # `device:` / `is_half:` with no value: the engine picks
            continue
        if value is None and want is str:
            value = ""
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)) or (want is int and value < 0):
            kind = {bool: "true/false", int: "a whole number >= 0"}.get(want, "a string")
            raise ConfigError(f"{where}: key {name}.{key} must be {kind}, found {value!r}")
        values[key] = value
    if values["version"] not in VERSIONS:
        raise ConfigError(f"{where}: key {name}.version is {values['version']!r}; use one of {', '.join(VERSIONS)}")
    if values.get("vocoder_backend", "torch") not in VOCODER_BACKENDS:
        raise ConfigError(f"{where}: key {name}.vocoder_backend must be one of {', '.join(VOCODER_BACKENDS)}")
    return Section(**values, knobs=tuple(knobs))


def default_sections() -> dict[str, Section]:
    """``TTS_Config.default_configs`` of the official code (no ``custom`` section)."""
    raw = load_json("tts_infer_default.json")["TTS_Config.default_configs"]
    return {name: _parse_section(name, body, "built-in defaults") for name, body in raw.items()}


@dataclass(frozen=True)
class InferConfig:
    """A parsed ``tts_infer.yaml`` merged over the defaults. ``active`` is the section in use."""

    sections: Mapping[str, Section]
    source: str = "built-in defaults"
    base_dir: Path = field(default_factory=Path.cwd)

    @property
    def active_name(self) -> str:
        return "custom" if "custom" in self.sections else "v2"

    @property
    def active(self) -> Section:
        return self.sections[self.active_name]

    def path(self, key: str) -> Path:
        """A weight path of the active section, with the official fallback to the version's section."""
        if key not in PATH_KEYS:
            raise KeyError(key)
        chosen = getattr(self.active, key)
        if not chosen or not self._abs(chosen).exists():
            fallback = self.sections.get(self.active.version)
            if fallback is not None and getattr(fallback, key):
                chosen = getattr(fallback, key)
        return self._abs(chosen) if chosen else Path()

    def extension(self, key: str, version: str) -> str:
        """A per-version extension value (``vocoder_path``, ``vocoder_backend``, ``vocoder_coreml_package``,
        ``sv_weights_path``) for models of ``version``: the active section's when it names ``version``,
        else the ``version`` section's; "" when neither sets it (the official location / the default)."""
        if key not in _EXTENSION_KEYS:
            raise KeyError(key)
        for section in (self.active, self.sections.get(version)):
            if section is not None and section.version == version and getattr(section, key):
                return getattr(section, key)
        return ""

    def extension_path(self, key: str, version: str) -> Path | None:
        """:meth:`extension` as a path resolved against the base folder; None when not set."""
        value = self.extension(key, version)
        return self._abs(value) if value else None

    def problems(self) -> list[str]:
        """Settings that parse but cannot do what they say; callers show them as warnings."""
        out = []
        for name, s in self.sections.items():
            if s.vocoder_coreml_package and s.vocoder_backend != "coreml":
                out.append(f"{name}.vocoder_coreml_package is set but {name}.vocoder_backend is "
                           f"{s.vocoder_backend!r}: the package is not used (set vocoder_backend: coreml)")
            if s.vocoder_backend == "coreml" and not s.vocoder_coreml_package:
                out.append(f"{name}.vocoder_backend is 'coreml' but {name}.vocoder_coreml_package is empty: "
                           "the torch vocoder is used (export one with `sovits-studio export-coreml`)")
            if s.vocoder_path and s.version not in ("v3", "v4"):
                out.append(f"{name}.vocoder_path is set but {name} is a {s.version} section: only v3 and v4 use a "
                           "separate vocoder (put it in the v3 or v4 section)")
            elif s.vocoder_path:
                path = self._abs(s.vocoder_path)
                want_folder = s.version == "v3"
                if path.exists() and path.is_dir() != want_folder:
                    out.append(f"{name}.vocoder_path {s.vocoder_path!r} is a {'file' if want_folder else 'folder'}, "
                               f"but {s.version} needs {'the BigVGAN folder' if want_folder else 'vocoder.pth'}; "
                               f"put the other version's vocoder in its own section ({'v4' if want_folder else 'v3'})")
        return out

    def g2pw_folder(self) -> Path:
        """The G2PW model folder: the active section's ``g2pw_model_path``, else the official location."""
        return self._abs(self.active.g2pw_model_path) if self.active.g2pw_model_path else self.base_dir / G2PW_FOLDER

    def missing_files(self) -> dict[str, Path]:
        """Weight paths (after fallback) that do not exist, by key: what the user still has to get."""
        return {k: p for k in PATH_KEYS if not (p := self.path(k)).exists() or p == Path()}

    def _abs(self, p: str) -> Path:
        path = Path(os.path.expanduser(p))
        return path if path.is_absolute() else self.base_dir / path


def parse_config(data: Any, source: str = "<dict>", base_dir: str | os.PathLike | None = None) -> InferConfig:
    """Validate an already-parsed yaml document (a dict of sections)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections ({', '.join(SECTIONS)}), found {type(data).__name__}")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section {unknown[0]!r}; sections are {', '.join(SECTIONS)}")
    sections = default_sections()
    for name, body in data.items():
        sections[name] = _parse_section(name, body, source)
    return InferConfig(sections=sections, source=source, base_dir=Path(base_dir) if base_dir else Path.cwd())


def load_config(path: str | os.PathLike, base_dir: str | os.PathLike | None = None) -> InferConfig:
    """Read a ``tts_infer.yaml``. Relative weight paths resolve against ``base_dir`` (default: cwd,
    as in the official code, where they are relative to the GPT-SoVITS folder)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    return parse_config(data, str(path), base_dir)
