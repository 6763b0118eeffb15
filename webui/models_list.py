"""The weight files the model pickers offer: every GPT and SoVITS file in the official folders, the
config's folder tree and the working folder, each with a short name and the version it is for.

A SoVITS file records its version (detected by :func:`engine.loading.inspection.describe`). A GPT
file does not: its structure only tells the v1 symbol set from the v2 one, which every later version
shares. The official code decides a GPT file's version by where it lies (``GPT_weights_v3`` holds
GPT models trained for v3) and by its pretrained table (``s1v3.ckpt`` is the pretrained GPT of v3,
v4, v2Pro and v2ProPlus), and so does :func:`gpt_versions`. GPT and SoVITS files belong together
when they use the same symbol set (:func:`mismatch`).

``ModelCatalog`` owns a bounded cache of descriptions keyed by (path, size, mtime), so a rescan only
reads files that are new or changed. Files that are not GPT/SoVITS weights are left out of the lists, and
so is anything the file system cannot resolve (a symlink loop, a dangling link, a folder it may not read):
a listing never fails on one entry, at start or on a rescan.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.versions import VERSIONS

log = logging.getLogger(__name__)

PRETRAINED = "GPT_SoVITS/pretrained_models"
# where the official WebUI saves trained weights (relative to the GPT-SoVITS root)
TRAINED_DIRS = ("GPT_weights", "GPT_weights_v2", "GPT_weights_v3", "GPT_weights_v4", "GPT_weights_v2Pro",
                "GPT_weights_v2ProPlus", "SoVITS_weights", "SoVITS_weights_v2", "SoVITS_weights_v3",
                "SoVITS_weights_v4", "SoVITS_weights_v2Pro", "SoVITS_weights_v2ProPlus")
# the official pretrained GPT files by name (config.py's pretrained_gpt_name): the versions each serves
PRETRAINED_GPT = {
    "s1bert25hz-2kh-longer-epoch=68e-step=50232.ckpt": ("v1",),
    "s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt": ("v2",),
    "s1v3.ckpt": ("v3", "v4", "v2Pro", "v2ProPlus"),
}
SUFFIXES = {"gpt": (".ckpt",), "sovits": (".pth",)}
KINDS = {"gpt": ("gpt",), "sovits": ("sovits", "sovits-lora")}
MAX_FILES = 500  # per scan: a folder tree with more weight files than this is listed only in part
MAX_DEPTH = 4  # how deep the config's folder and the working folder are searched
SKIPPED = {".git", ".venv", "venv", "node_modules", "__pycache__", ".cache", "site-packages"}


@dataclass(frozen=True)
class ModelFile:
    path: Path  # absolute
    kind: str  # gpt | sovits | sovits-lora
    version: str  # as detected from the file: v1 | v2 | v2Pro | ... (GPT: v1 or v2, the symbol set)

    @property
    def versions(self) -> tuple[str, ...]:
        """The model versions this file is for (a GPT file: see :func:`gpt_versions`)."""
        return gpt_versions(self.path, self.version) if self.kind == "gpt" else (self.version,)

    @property
    def tag(self) -> str:
        return "/".join(self.versions) + (" LoRA" if self.kind == "sovits-lora" else "")


def gpt_versions(path: Path, symbols: str) -> tuple[str, ...]:
    """The versions a GPT file serves: by the official pretrained names, then by its weight folder."""
    if symbols == "v1":
        return ("v1",)
    if path.name in PRETRAINED_GPT:
        return PRETRAINED_GPT[path.name]
    folder = path.parent.name
    if folder.startswith("GPT_weights_") and folder[len("GPT_weights_"):] in VERSIONS:
        return (folder[len("GPT_weights_"):],)
    return tuple(v for v in VERSIONS if v != "v1")  # any version of the v2 symbol set


def symbol_set(version: str) -> str:
    return "v1" if version == "v1" else "v2"


def mismatch(gpt: ModelFile, sovits: ModelFile) -> tuple[str, ...] | None:
    """None when the two belong together; else the SoVITS versions this GPT file pairs with."""
    if symbol_set(gpt.version) == symbol_set(sovits.version):
        return None
    return tuple(v for v in VERSIONS if symbol_set(v) == symbol_set(gpt.version))


class ModelCatalog:
    """Lists the GPT and SoVITS files under a GPT-SoVITS root, extra folders and their subfolders."""

    def __init__(self, base_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = (),
                 max_cached: int = 256) -> None:
        self.base_dir = _resolved(base_dir) or Path(os.path.abspath(base_dir))
        self.extra_dirs = tuple(_resolved(d) or Path(os.path.abspath(d)) for d in extra_dirs)
        self.max_cached = max_cached
        self._cache: OrderedDict[tuple[str, int, int], ModelFile | None] = OrderedDict()
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}  # a picker's value (a short name) -> the file's path, as last listed
        self._listed: dict[str, bool] = {}  # "gpt"/"sovits": the last listing found at least one file

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders searched (existing or not): weight files may only be loaded from these."""
        dirs = [self.base_dir / PRETRAINED, *(self.base_dir / d for d in TRAINED_DIRS), *self.extra_dirs]
        return tuple(dict.fromkeys(dirs))

    def files(self, which: str) -> list[ModelFile]:
        """The ``which`` ("gpt" or "sovits") files found now, by version then name."""
        found = []
        for path in self._candidates(SUFFIXES[which]):
            described = self.describe(path)
            if described is not None and described.kind in KINDS[which]:
                found.append(described)
        order = {v: i for i, v in enumerate(VERSIONS)}
        return sorted(found, key=lambda f: (order.get(f.versions[0], len(order)), f.path.name.lower(), str(f.path)))

    def choices(self, which: str) -> list[tuple[str, str]]:
        """(label, absolute path) pairs for a picker: ``version · file name`` (plus its folder when two
        files share a name), grouped by version."""
        files = self.files(which)
        names = [f.path.name for f in files]
        labels = []
        for f in files:
            shown = f.path.name if names.count(f.path.name) == 1 else f"{f.path.parent.name}/{f.path.name}"
            labels.append((f"{f.tag} · {shown}", str(f.path)))
        return labels

    def picker_choices(self, which: str) -> list[tuple[str, str]]:
        """(label, value) pairs for a picker whose values are the short labels themselves: the page never
        sees a path (:meth:`resolve` turns a value back into its file on the server)."""
        pairs = self.choices(which)
        with self._lock:
            self._keys.update({label: path for label, path in pairs})
            while len(self._keys) > 2 * MAX_FILES:  # bounded: the oldest names go first
                self._keys.pop(next(iter(self._keys)))
            self._listed[which] = bool(pairs)
        return [(label, label) for label, _ in pairs]

    def key_for(self, path: str | os.PathLike, which: str) -> str:
        """The picker value that stands for ``path``: its label when listed, else its file name (which
        :meth:`resolve` maps back to ``path``)."""
        path = str(_resolved(path) or os.path.abspath(path))
        labels = {p: label for label, p in self.choices(which)}
        key = labels.get(path, Path(path).name)
        with self._lock:
            self._keys[key] = path
        return key

    def resolve(self, value: str | None) -> str | None:
        """The file a picker value stands for; a value that is no short name is returned as it is."""
        if not value:
            return value
        with self._lock:
            found = self._keys.get(value)
        if found is None and " · " in value:  # listed since the last listing: list again
            for which in ("gpt", "sovits"):
                self.picker_choices(which)
            with self._lock:
                found = self._keys.get(value)
        return found or value

    @property
    def listed_any(self) -> bool:
        """Whether the last listing found any weight file (a page with empty pickers says so)."""
        return any(self._listed.values())

    def describe(self, path: str | os.PathLike) -> ModelFile | None:
        """The file's kind and version (cached), or None when it is no weight file we know."""
        from engine.loading.inspection import describe

        path = _resolved(path)
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            info = describe(path)
            described = ModelFile(path, str(info.get("kind", "")), str(info.get("version", "")))
        except EngineError as e:  # not a weight file we know: leave it out of the lists
            log.info("not listed: %s (%s)", path, e)
            described = None
        with self._lock:
            self._cache[key] = described
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return described

    def _candidates(self, suffixes: tuple[str, ...]) -> list[Path]:
        seen: dict[Path, None] = {}
        flat = {self.base_dir / d for d in TRAINED_DIRS}
        for folder in self.folders:
            for p in _walk(folder, 0 if folder in flat else MAX_DEPTH):
                if p.suffix in suffixes and (resolved := _resolved(p)) is not None:
                    seen[resolved] = None
                    if len(seen) >= MAX_FILES:
                        log.warning("more than %d weight files under %s; listing the first ones", MAX_FILES, folder)
                        return sorted(seen)
        return sorted(seen)


def _resolved(path: str | os.PathLike) -> Path | None:
    """``path`` with every symlink followed, or None when it cannot be (a loop: RuntimeError on Python 3.11,
    OSError later; a name the file system refuses)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        log.info("not listed: %s (%s)", path, e)
        return None


def _walk(folder: Path, depth: int):
    """Files under ``folder``, ``depth`` levels of subfolders down (hidden and tool folders skipped; an entry
    the file system cannot follow, such as a symlink loop, is skipped too)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        try:
            is_file = entry.is_file()
            is_dir = not is_file and depth > 0 and entry.is_dir()
        except OSError as e:  # ELOOP: "Too many levels of symbolic links"
            log.info("not listed: %s (%s)", entry.path, e.strerror)
            continue
        if is_file:
            yield Path(entry.path)
        elif is_dir and entry.name not in SKIPPED and not entry.name.startswith("."):
            yield from _walk(Path(entry.path), depth - 1)
