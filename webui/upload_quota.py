"""A bound on what anonymous clients can leave in the page's upload folder.

Each upload is bounded by ``max_upload_bytes`` (the guard) and Gradio removes files older than an hour
(``delete_cache``), but nothing bounded how many uploads pile up within that hour. :class:`UploadQuota`
(ASGI) answers an upload 507 while the folder already holds ``max_files`` files or ``max_bytes`` bytes; the
folder is measured on a worker thread, never on the event loop.
"""

from __future__ import annotations

import json
import os

MAX_FILES = 1000  # files in the upload folder before uploads are refused
MAX_BYTES_PER_UPLOAD_LIMIT = 50  # the folder may hold this many maximal uploads


def folder_usage(folder: str, stop_after: int) -> tuple[int, int]:
    """(files, bytes) under ``folder``; counting stops after ``stop_after`` files."""
    files = size = 0
    stack = [folder]
    while stack and files <= stop_after:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        files += 1
                        size += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return files, size


class UploadQuota:
    """ASGI middleware refusing uploads (``POST .../upload``) while ``folder`` is full."""

    def __init__(self, app, folder: str, max_files: int = MAX_FILES, max_bytes: int = 1 << 30) -> None:
        self.app, self.folder, self.max_files, self.max_bytes = app, folder, max_files, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").endswith("/upload"):
            from starlette.concurrency import run_in_threadpool

            files, size = await run_in_threadpool(folder_usage, self.folder, self.max_files)
            if files >= self.max_files or size >= self.max_bytes:
                body = json.dumps({"message": "the page's upload folder is full; retry later (uploads are removed "
                                              "after an hour)"}).encode()
                await send({"type": "http.response.start", "status": 507,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"60"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
