"""The weight files the model dropdowns offer: every GPT and SoVITS file in the official folders, each
labelled with the kind and version that :func:`engine.loading.inspection.describe` detects.

``ModelCatalog`` owns a small cache of descriptions keyed by (path, size, mtime), so a refresh only
reads files that are new or changed. Files that are not GPT/SoVITS weights are left out of the lists.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError

log = logging.getLogger(__name__)

PRETRAINED = "GPT_SoVITS/pretrained_models"
# where the official WebUI saves trained weights (relative to the GPT-SoVITS root), plus the pretrained tree
TRAINED_DIRS = ("GPT_weights", "GPT_weights_v2", "GPT_weights_v3", "GPT_weights_v4", "GPT_weights_v2Pro",
                "GPT_weights_v2ProPlus", "SoVITS_weights", "SoVITS_weights_v2", "SoVITS_weights_v3",
                "SoVITS_weights_v4", "SoVITS_weights_v2Pro", "SoVITS_weights_v2ProPlus")
SUFFIXES = {"gpt": (".ckpt",), "sovits": (".pth",)}
KINDS = {"gpt": ("gpt",), "sovits": ("sovits", "sovits-lora")}
MAX_FILES = 500  # a folder tree with more weight files than this is listed only in part


@dataclass(frozen=True)
class ModelFile:
    path: Path  # absolute
    kind: str  # gpt | sovits | sovits-lora
    version: str  # v1 | v2 | v2Pro | ... as detected from the file

    def label(self, base: Path) -> str:
        try:
            shown = self.path.relative_to(base)
        except ValueError:
            shown = self.path
        return f"{shown}  ·  {self.kind} {self.version}"


class ModelCatalog:
    """Lists the GPT and SoVITS files under a GPT-SoVITS root (and any extra folders)."""

    def __init__(self, base_dir: str | os.PathLike, extra_dirs: tuple[str | os.PathLike, ...] = (),
                 max_cached: int = 256) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.extra_dirs = tuple(Path(d).resolve() for d in extra_dirs)
        self.max_cached = max_cached
        self._cache: OrderedDict[tuple[str, int, int], ModelFile | None] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders searched (existing or not): weight files may only be loaded from these."""
        dirs = [self.base_dir / PRETRAINED, *(self.base_dir / d for d in TRAINED_DIRS), *self.extra_dirs]
        return tuple(dict.fromkeys(dirs))

    def files(self, which: str) -> list[ModelFile]:
        """The ``which`` ("gpt" or "sovits") files found now, sorted by path."""
        found = []
        for path in self._candidates(SUFFIXES[which]):
            described = self._describe(path)
            if described is not None and described.kind in KINDS[which]:
                found.append(described)
        return found

    def choices(self, which: str) -> list[tuple[str, str]]:
        """(label, absolute path) pairs for a dropdown."""
        return [(f.label(self.base_dir), str(f.path)) for f in self.files(which)]

    def _candidates(self, suffixes: tuple[str, ...]) -> list[Path]:
        seen: dict[Path, None] = {}
        for folder in self.folders:
            if not folder.is_dir():
                continue
            walk = folder.rglob("*") if folder == self.base_dir / PRETRAINED else folder.iterdir()
            for p in walk:
                if p.suffix in suffixes and p.is_file():
                    seen[p.resolve()] = None
                    if len(seen) >= MAX_FILES:
                        log.warning("more than %d weight files under %s; listing the first ones", MAX_FILES, folder)
                        return sorted(seen)
        return sorted(seen)

    def _describe(self, path: Path) -> ModelFile | None:
        from engine.loading.inspection import describe

        st = path.stat()
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
