"""The one answer to a request that a cluster part lost (a replica or a gateway stopped under it): 503 with
``Retry-After``, in the error shape of its path (OpenAI's under ``/v1/``, api_v2's elsewhere)."""

from __future__ import annotations

import json
from typing import Any

RETRY_AFTER_S = 1


def unavailable_body(path: str, message: str) -> bytes:
    body: dict[str, Any] = {"message": message}
    if path.startswith("/v1/"):
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": "replica_unavailable"}}
    return json.dumps(body).encode()


def unavailable_headers() -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode())]
