"""A bound on what anonymous clients can leave in the page's upload folder.

Each upload is bounded by ``max_upload_bytes`` (the guard) and Gradio removes files older than an hour
(``delete_cache``), but nothing bounded how many uploads pile up within that hour. :class:`UploadQuota`
(ASGI) answers an upload 507 when the folder, plus the uploads under way, would hold more than ``max_files``
files or ``max_bytes`` bytes with it; the folder is measured on a worker thread, never on the event loop.

Uploads that arrive together all see the folder as it was before any of them was written, so each one
admitted holds its declared size (``Content-Length``, or the largest body a request may have when it declares
none) until a measurement that began after it finished can see its file: concurrent uploads cannot overshoot
the quota (they stored 1,221 MiB against 1,000 MiB without this).
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
    """ASGI middleware refusing uploads (``POST .../upload``) that would take ``folder`` over its quota.
    ``per_upload``: the size held for an upload that declares no ``Content-Length`` (the body limit)."""

    def __init__(self, app, folder: str, max_files: int = MAX_FILES, max_bytes: int = 1 << 30,
                 per_upload: int | None = None) -> None:
        self.app, self.folder, self.max_files, self.max_bytes = app, folder, max_files, max_bytes
        self.per_upload = per_upload if per_upload is not None else max_bytes
        self._held: dict[int, list] = {}  # upload number -> [bytes, number of the measurement after its end]
        self._uploads = 0  # uploads admitted so far (numbers them)
        self._measurements = 0  # measurements begun so far (numbers them)

    def held(self) -> tuple[int, int]:
        """(uploads, bytes) held now for uploads under way or not yet seen in the folder."""
        return len(self._held), sum(size for size, _ in self._held.values())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").endswith("/upload"):
            number = await self._admit(scope)
            if number is None:
                await self._refuse(send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self._held[number][1] = self._measurements + 1  # seen by the measurements that begin from now
            return
        await self.app(scope, receive, send)

    async def _admit(self, scope) -> int | None:
        """The upload's number once its size is held, or None when it would take the folder over the quota."""
        from starlette.concurrency import run_in_threadpool

        self._measurements += 1
        measurement = self._measurements
        files, size = await run_in_threadpool(folder_usage, self.folder, self.max_files)
        # back on the event loop: nothing below awaits, so checking and holding are one step
        for number, (_, seen_from) in list(self._held.items()):
            if seen_from is not None and seen_from <= measurement:
                del self._held[number]  # finished before this measurement began: its file is in ``size``
        held_files, held_bytes = self.held()
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        this = int(length) if length.isdigit() else self.per_upload
        if files + held_files >= self.max_files or size + held_bytes + this > self.max_bytes:
            return None
        self._uploads += 1
        self._held[self._uploads] = [this, None]
        return self._uploads

    @staticmethod
    async def _refuse(send) -> None:
        body = json.dumps({"message": "the page's upload folder is full; retry later (uploads are removed "
                                      "after an hour)"}).encode()
        await send({"type": "http.response.start", "status": 507,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"60"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
