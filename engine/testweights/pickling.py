"""Write checkpoints whose pickled configs look exactly like the official ``utils.HParams`` ones.

User-trained SoVITS ``.pth`` files pickle their hyper-parameters as the training code's
``utils.HParams`` class. Our :class:`engine.loading.checkpoints.HParams` plays that role here, so the
pickler below records it under the official name; the files then load with the same allow-list
as real ones (and fail the same way in any loader that cannot map that class).
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any

from engine.loading.checkpoints import HParams, save_torch_file

OFFICIAL_MODULE, OFFICIAL_NAME = "utils", "HParams"


class _OfficialNamePickler(pickle._Pickler):  # the pure-Python pickler lets us name a global
    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is HParams:
            self.write(pickle.GLOBAL + f"{OFFICIAL_MODULE}\n{OFFICIAL_NAME}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


_pickle_module = types.SimpleNamespace(Pickler=_OfficialNamePickler, __name__="official_hparams_pickle")


def to_hparams(config: dict) -> HParams:
    """A plain nested dict as the official attribute bag."""
    return HParams(**config)


def save_with_official_hparams(obj: Any, path: str | Path, header: bytes | None = None) -> None:
    """``torch.save(obj)`` with HParams pickled as ``utils.HParams``; optional 2-byte version tag."""
    save_torch_file(obj, path, header, pickle_module=_pickle_module, pickle_protocol=2)
