"""Fixtures shared by every test folder; plain helpers live in the package :mod:`tests.support`."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.platform_env import passive_cpu_threads
from tests.support.paths import REPO

# before any test imports torch: idle OpenMP workers sleep instead of spinning, so a test run shares a loaded
# machine's cores (several sessions' suites at once) instead of burning them (docs/benchmarks.md, "OpenMP waits");
# the commands leave libgomp's default spin, which is faster only where the cores are otherwise free
passive_cpu_threads()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return REPO.parent / "shared"
