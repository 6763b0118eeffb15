"""Fixtures shared by every test folder; plain helpers live in the package :mod:`tests.support`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return REPO.parent / "shared"
