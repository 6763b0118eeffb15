"""Safe reading of official GPT-SoVITS weight files.

Nothing here executes code from a file: every pickle goes through ``torch.load(weights_only=True)``
with an explicit allow-list. The only non-tensor class the official files pickle is the training
``utils.HParams`` attribute bag, which maps to :class:`HParams` below.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import CheckpointError
from engine.loading.file_head import md5_head, read_header
from engine.versions import VOCODER_VERSIONS

# 2-byte tags that `process_ckpt.my_save2` writes over the zip's "PK" (read back by `head2version` in
# the official process_ckpt.py):
# tag -> (symbol version, model version, is_lora)
HEADER_VERSIONS: dict[bytes, tuple[str, str, bool]] = {
    b"00": ("v1", "v1", False),
    b"01": ("v2", "v2", False),
    b"02": ("v2", "v3", False),
    b"03": ("v2", "v3", True),
    b"04": ("v2", "v4", True),
    b"05": ("v2", "v2Pro", False),
    b"06": ("v2", "v2ProPlus", False),
}
VERSION_HEADERS: dict[str, bytes] = {"v2Pro": b"05", "v2ProPlus": b"06"}
LORA_HEADERS: dict[str, bytes] = {"v3": b"03", "v4": b"04"}

# md5 of the first 8 KiB of the official pretrained SoVITS files (`hash_pretrained_dict` in the official
# process_ckpt.py, the first test of `get_sovits_version_from_path_fast`).
PRETRAINED_MD5: dict[str, tuple[str, str, bool]] = {
    "dc3c97e17592963677a4a1681f30c653": ("v2", "v2", False),  # s2G488k.pth (v1; fixed by the weights)
    "43797be674a37c1c83ee81081941ed0f": ("v2", "v3", False),  # s2Gv3.pth
    "6642b37f3dbb1f76882b69937c95a5f3": ("v2", "v2", False),  # s2G2333k.pth
    "4f26b9476d0c5033e04162c486074374": ("v2", "v4", False),  # s2Gv4.pth
    "c7e9fce2223f3db685cdfa1e6368728a": ("v2", "v2Pro", False),  # s2Gv2Pro.pth
    "66b313e39455b57ab1b0bc0b239c9d0a": ("v2", "v2ProPlus", False),  # s2Gv2ProPlus.pth
}
V1_MAX_BYTES = 82978 * 1024  # plain zips smaller than this are v1 (get_sovits_version_from_path_fast, last test)
V2_MAX_BYTES = 700 * 1024 * 1024  # ...smaller than this v2, larger a full v3 fine-tune


class HParams(Mapping):
    """The attribute bag pickled as ``utils.HParams`` in user-trained ``.pth`` files.

    Supports attribute and item access like the official class; nested sections are HParams too.
    """

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            self.__dict__[key] = HParams(**value) if isinstance(value, dict) else value

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dict__)

    def __len__(self) -> int:
        return len(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def to_dict(self) -> dict:
        return {k: v.to_dict() if isinstance(v, HParams) else v for k, v in self.__dict__.items()}

    def __repr__(self) -> str:
        return f"HParams({self.to_dict()!r})"


def as_plain_dict(config: Any) -> dict:
    """A config that may be an HParams, a dict, or nested mixes of both, as plain dicts."""
    if isinstance(config, HParams):
        return config.to_dict()
    if isinstance(config, Mapping):
        return {k: as_plain_dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    raise CheckpointError(f"expected a config mapping, found {type(config).__name__}")


# (class, "module.Name" as written in the pickle). Everything else is refused by torch itself.
_ALLOWED_GLOBALS = [(HParams, "utils.HParams")]
# torch keeps its safe-globals list in a process-wide variable; serialise our scoped changes.
_SAFE_GLOBALS_LOCK = threading.Lock()


def _check_file(path: Path, what: str) -> None:
    if not path.exists():
        raise CheckpointError(f"{what} not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"{what} {path} is a folder; expected a file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{what} {path} is empty (0 bytes); download or copy it again")


def load_torch_file(path: str | os.PathLike, what: str = "weight file") -> Any:
    """Load a ``torch.save`` file without executing code from it.

    Files whose first two bytes are an official version tag get ``PK`` restored in memory.
    Raises CheckpointError naming the file for anything missing, truncated, corrupt or unsafe.
    """
    path = Path(path)
    _check_file(path, what)
    data = path.read_bytes()
    head = data[:2]
    if head in HEADER_VERSIONS:
        data = b"PK" + data[2:]
    elif head != b"PK" and data[:1] != b"\x80":  # \x80: legacy (non-zip) torch pickle
        raise CheckpointError(
            f"{what} {path} is not a PyTorch checkpoint (it starts with {head!r}); "
            "pick a GPT-SoVITS .ckpt/.pth file"
        )
    if head == b"PK" or head in HEADER_VERSIONS:
        try:
            bad_member = zipfile.ZipFile(io.BytesIO(data)).testzip()  # checks every CRC
        except (zipfile.BadZipFile, EOFError, OSError) as e:
            raise CheckpointError(
                f"{what} {path} is truncated or corrupt ({e}); download or copy it again"
            ) from e
        if bad_member is not None:
            raise CheckpointError(f"{what} {path} is corrupt (bad checksum in {bad_member}); download or copy it again")
    try:
        with _SAFE_GLOBALS_LOCK, torch.serialization.safe_globals(_ALLOWED_GLOBALS):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "unsafe content"
        raise CheckpointError(
            f"refused to load {what} {path}: it contains objects outside the allow-list, "
            f"so it could run code ({reason}). Only official GPT-SoVITS files are accepted."
        ) from e
    except (RuntimeError, EOFError, zipfile.BadZipFile, KeyError, ValueError) as e:
        raise CheckpointError(f"{what} {path} is corrupt or not a checkpoint: {e}") from e


def state_dict_of(obj: Any, path: str | os.PathLike, key: str | None = "weight") -> dict[str, torch.Tensor]:
    """The tensor dict inside a loaded file (``obj[key]``, or obj itself when key is None)."""
    sd = obj if key is None else (obj.get(key) if isinstance(obj, Mapping) else None)
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        where = "the file" if key is None else f"key {key!r}"
        raise CheckpointError(f"{path}: {where} holds no state dict of tensors; is this the right kind of file?")
    return dict(sd)


def sovits_version_from_file(path: str | os.PathLike) -> tuple[str, str, bool]:
    """(symbol version, model version, is_lora) before the weights are read: pretrained md5, then the 2-byte
    header, then the file size, as the official ``process_ckpt.py`` ``get_sovits_version_from_path_fast``."""
    path = Path(path)
    _check_file(path, "SoVITS weights")
    known = PRETRAINED_MD5.get(md5_head(path))
    if known is not None:
        return known
    head = read_header(path)
    if head != b"PK":
        if head not in HEADER_VERSIONS:
            raise CheckpointError(f"SoVITS weights {path} start with unknown bytes {head!r}; not a GPT-SoVITS .pth")
        return HEADER_VERSIONS[head]
    size = path.stat().st_size
    if size < V1_MAX_BYTES:
        return ("v1", "v1", False)
    if size < V2_MAX_BYTES:
        return ("v2", "v2", False)
    return ("v2", "v3", False)


def resolve_sovits_version(file_version: tuple[str, str, bool], weights: Mapping[str, torch.Tensor]) -> tuple[str, str, bool]:
    """Correct the file-level guess with the weights (``enc_p.text_embedding`` rows), as the official ``TTS.py``
    ``TTS.init_vits_weights`` does."""
    _, model_version, is_lora = file_version
    emb = weights.get("enc_p.text_embedding.weight")
    symbol_version = "v1" if emb is not None and emb.shape[0] == 322 else "v2"
    if model_version not in VOCODER_VERSIONS and "Pro" not in model_version:
        model_version = symbol_version
    return symbol_version, model_version, is_lora


def save_torch_file(obj: Any, path: str | os.PathLike, header: bytes | None = None, **save_kwargs: Any) -> None:
    """``torch.save`` then, if given, overwrite the first two bytes with an official version tag."""
    buf = io.BytesIO()
    torch.save(obj, buf, **save_kwargs)
    data = buf.getvalue()
    if header is not None:
        if header not in HEADER_VERSIONS:
            raise ValueError(f"unknown version header {header!r}")
        data = header + data[2:]
    Path(path).write_bytes(data)


def detect_sovits_version(path: str | os.PathLike, weights: Mapping[str, torch.Tensor],
                          config: Mapping[str, Any] | None = None) -> tuple[str, str, bool]:
    """(symbol version, model version, is_lora) from the file, then the weights, then the config.

    Beyond the official rules: a file with CFM weights is a v3/v4 model whatever its size says
    (small fine-tunes and our fixtures are plain zips), and then the training config's
    ``version`` (written by the official WebUI) tells v3 from v4; without one, v3 is assumed.
    """
    file_version = sovits_version_from_file(path)
    symbol, model, is_lora = resolve_sovits_version(file_version, weights)
    has_cfm = any(k.startswith("cfm.") for k in weights)
    if has_cfm and not is_lora and md5_head(path) not in PRETRAINED_MD5:
        cfg = config or {}
        named = (cfg.get("model") or {}).get("version") or cfg.get("version")
        model = named if named in VOCODER_VERSIONS else (model if model in VOCODER_VERSIONS else "v3")
    elif not has_cfm and model in VOCODER_VERSIONS and not is_lora:
        model = symbol  # a non-v3 file that happened to be large
    return symbol, model, is_lora


@dataclass(frozen=True)
class StateDictDiff:
    """How a file's tensors differ from a module's state dict (in the module's order; unexpected in the file's)."""

    missing: list[str]  # the module needs them, the file lacks them
    unexpected: list[str]  # the file has them, the module does not use them
    wrong_shape: list[str]  # in both, with different shapes

    def shape_note(self, own: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor]) -> str:
        """'<key>: file (..) vs model (..)' for the first shape mismatch."""
        k = self.wrong_shape[0]
        return f"{k}: file {tuple(given[k].shape)} vs model {tuple(own[k].shape)}"


def state_dict_diff(own: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor]) -> StateDictDiff:
    """Compare a module's ``state_dict()`` with the tensors read from a file."""
    return StateDictDiff(
        missing=[k for k in own if k not in given],
        unexpected=[k for k in given if k not in own],
        wrong_shape=[k for k in own if k in given and tuple(own[k].shape) != tuple(given[k].shape)],
    )
