"""The page's file inputs take only files a client uploaded to this server.

The page is mounted into the API's app, not launched, so Gradio skips its own "uploaded by a user" check
(it runs only for a launched ``Blocks``) and would copy any server path (``/etc/passwd``, ``/dev/zero``, a
FIFO) or fetch any URL a client names in an API call. :func:`uploads_only` puts the check back on one
component, before Gradio touches the file: the path, at most :data:`MAX_PATH_CHARS` long, must resolve to
a regular file inside Gradio's upload folder (or one of the page's own example folders). Every refusal
reads the same, so an answer never tells whether a path exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MAX_PATH_CHARS = 4096
REFUSAL = "upload the file: the page reads only files uploaded to this server"


def is_uploaded(path: Any, roots: tuple[Path, ...]) -> bool:
    """True when ``path`` is a regular file inside one of ``roots`` (symlinks followed), checked without
    opening it; any path too long, malformed, looping or outside is False."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    if not isinstance(text, str) or len(text) > MAX_PATH_CHARS or "\x00" in text or "://" in text:
        return False
    try:
        resolved = Path(text).resolve()
        inside = any(resolved.is_relative_to(root) for root in roots)
        return inside and resolved.is_file()  # a FIFO or a device is not a regular file
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the file system refuses, a surrogate
        return False


def uploads_only(component, extra_roots: tuple[Path, ...] = ()):
    """``component`` (a ``gr.Audio``/``gr.File`` input) refusing every file that was not uploaded here."""
    import gradio as gr

    roots = (Path(component.GRADIO_CACHE).resolve(), *(Path(r).resolve() for r in extra_roots))
    move, move_async = component.move_resource_to_block_cache, component.async_move_resource_to_block_cache

    def checked(path):
        if path is not None and not is_uploaded(path, roots):
            raise gr.Error(REFUSAL)
        return path

    component.move_resource_to_block_cache = lambda path: move(checked(path))
    component.async_move_resource_to_block_cache = lambda path: move_async(checked(path))
    return component
