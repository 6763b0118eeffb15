"""Core ML vocoders: export (``export``), package inspection and the macOS runtime wrapper (``package``).

coremltools is imported inside functions only, through :func:`import_coremltools`: the engine imports
fine without it, and off macOS its import-time warnings (no ``libcoremlpython``, untested torch and
scikit-learn versions) are silenced, since predicting is impossible there anyway.
"""

from __future__ import annotations

import logging
import platform
import sys
from types import ModuleType


def import_coremltools(system: str | None = None) -> ModuleType:
    """``import coremltools`` (ImportError when missing); quiet off macOS (``system`` as ``platform.system()``)."""
    if "coremltools" in sys.modules:
        return sys.modules["coremltools"]
    system = platform.system() if system is None else system
    if system == "Darwin":
        import coremltools

        return coremltools
    logger = logging.getLogger("coremltools")
    before = logger.level
    logger.setLevel(logging.ERROR)  # its warnings at import go through this logger
    try:
        import coremltools
    finally:
        logger.setLevel(before)
    return coremltools
