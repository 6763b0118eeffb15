"""Where the repository, the test assets and the golden fixtures live, and how to find fixture folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "tests" / "assets"


def conformance_root() -> Path:
    """The fixture root: $SOVITS_CONFORMANCE_DIR, else ../shared/conformance beside the clone."""
    return Path(os.environ.get("SOVITS_CONFORMANCE_DIR", REPO.parent / "shared" / "conformance"))


def fixture_folders(kind: str, marker: str) -> list[Path]:
    """Every folder under ``<root>/<kind>`` (or the root itself) that holds ``marker``."""
    base = conformance_root() / kind
    if not base.is_dir():
        return []
    return sorted({p.parent for p in base.rglob(marker)})


def folder_params(kind: str, marker: str) -> list:
    """pytest params for each fixture folder, with the folder name as the test id."""
    folders = fixture_folders(kind, marker)
    if not folders:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no {kind} fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in folders]

