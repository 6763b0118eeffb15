"""The official ``tts_infer.yaml`` format: read, validate, resolve. Never written back.

A file has version sections (``v1 v2 v2Pro v2ProPlus v3 v4``) and an optional ``custom`` section,
each with the seven official keys. Sections in the file replace the built-in defaults section by
section; the active section is ``custom`` when present, else ``v2`` (official ``TTS.py``
``TTS_Config.__init__``). Paths that are
empty or missing fall back to the same key of the active version's section, as the official code does.
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


@dataclass(frozen=True)
class Section:
    """One section of ``tts_infer.yaml``: the seven official keys and our optional extensions."""

    device: str
    is_half: bool
    version: str
    t2s_weights_path: str
    vits_weights_path: str
    bert_base_path: str
    cnhuhbert_base_path: str
    # SoVITS Studio extensions (optional in files; the official code ignores nothing else, so
    # files using them are ours).
    vocoder_backend: str = "torch"  # torch | coreml (coreml only takes effect on macOS)
    vocoder_path: str = ""  # BigVGAN folder (v3) or vocoder.pth (v4); empty: the official location
    sv_weights_path: str = ""  # ERes2NetV2 checkpoint (v2Pro*); empty: the official location
    vocoder_coreml_package: str = ""  # the .mlpackage used when vocoder_backend is coreml
    max_tokens_per_sentence: int = 0  # a cap on semantic tokens per sentence (25 = 1 s); 0: the model's own
    random_weights: bool = False  # a random-weight test set (make-test-weights): noise, not speech


_OFFICIAL_KEYS = {f.name for f in fields(Section)} - {"vocoder_backend", "vocoder_path", "sv_weights_path",
                                                     "vocoder_coreml_package", "max_tokens_per_sentence",
                                                     "random_weights"}
_KEY_TYPES = {f.name: {"bool": bool, "int": int}.get(str(f.type), str) for f in fields(Section)}


def _parse_section(name: str, raw: Any, where: str) -> Section:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: section {name!r} must be a mapping of keys, found {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_KEY_TYPES))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} in section {name!r}; known keys: {', '.join(sorted(_KEY_TYPES))}"
        )
    missing = sorted(_OFFICIAL_KEYS - set(raw))
    if missing:
        raise ConfigError(f"{where}: section {name!r} lacks key(s) {', '.join(missing)}")
    values = {}
    for key, value in raw.items():
        want = _KEY_TYPES[key]
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
    return Section(**values)


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
