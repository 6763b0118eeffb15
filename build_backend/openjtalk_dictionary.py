"""PEP 517 build backend: setuptools, plus the OpenJTalk dictionary of the Japanese frontend.

The Japanese frontend runs the original OpenJTalk library (``pyopenjtalk`` 0.4.1, the one the official
GPT-SoVITS installs) on the dictionary that ships inside the ``pyopenjtalk-plus`` wheel (the one the
conformance fixtures were made with). Both distributions install the import package ``pyopenjtalk``, so
they cannot share an environment: ``pyopenjtalk-plus`` is only a *build* requirement, and before
setuptools builds the wheel (or the editable install) this backend copies its dictionary folder to
``engine/text/openjtalk_dic/``, which the wheel carries as package data. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the PEP 517 hooks this module does not wrap

DICTIONARY_DIST = "pyopenjtalk-plus"
DICTIONARY_FOLDER = ("pyopenjtalk", "dictionary")
TARGET = Path(__file__).resolve().parent.parent / "engine" / "text" / "openjtalk_dic"


def _dictionary_files() -> list[Path]:
    try:
        dist = importlib.metadata.distribution(DICTIONARY_DIST)
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(dist.locate_file(f)) for f in dist.files or () if tuple(f.parts[:-1]) == DICTIONARY_FOLDER]


def _same(src: Path, dst: Path) -> bool:
    return dst.is_file() and dst.stat().st_size == src.stat().st_size and dst.stat().st_mtime >= src.stat().st_mtime


def install_dictionary() -> None:
    """Copy the dictionary of the build environment's pyopenjtalk-plus to ``engine/text/openjtalk_dic``."""
    files = _dictionary_files()
    if not files:
        if (TARGET / "sys.dic").is_file():
            return  # copied by an earlier build (e.g. a rebuild without build isolation)
        raise RuntimeError(
            f"{DICTIONARY_DIST} is a build requirement (its wheel carries the OpenJTalk dictionary) but the "
            "build environment lacks it: build with pip's default build isolation, or install "
            f"{DICTIONARY_DIST} into the build environment first"
        )
    TARGET.mkdir(parents=True, exist_ok=True)
    for src in files:
        dst = TARGET / src.name
        if not _same(src, dst):
            part = dst.with_name(dst.name + ".part")
            shutil.copy2(src, part)
            os.replace(part, dst)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    install_dictionary()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    install_dictionary()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
