"""Process environment that must be set before torch is imported (no torch import here)."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

MPS_FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"


def enable_mps_fallback(environ: MutableMapping[str, str] | None = None, platform: str | None = None) -> bool:
    """On macOS, let PyTorch run operators MPS lacks on the CPU. Call before the first ``import torch``.

    A value the user already set wins. Returns True when the variable is (now) enabled.
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if platform != "darwin":
        return False
    environ.setdefault(MPS_FALLBACK_VAR, "1")
    return environ[MPS_FALLBACK_VAR] == "1"


def torch_already_imported() -> bool:
    return "torch" in sys.modules
