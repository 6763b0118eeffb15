"""Who may call the server: API keys (``serve --api-key``/``--api-key-file``) or HTTP Basic logins (the web
UI's ``--auth``). :class:`Access` answers one question per request, in constant time per credential.

API keys are sent as ``Authorization: Bearer <key>`` (what OpenAI clients send) or ``X-API-Key: <key>``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError

Logins = tuple[tuple[str, str], ...]


def _lines(value: str, what: str) -> tuple[list[str], str]:
    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines(), str(path)
    return [value], what


def parse_logins(value: str) -> Logins:
    """``USER:PASS``, or a file with one ``USER:PASS`` per line (blank lines and ``#`` comments skipped)."""
    lines, where = _lines(value, "--auth")
    pairs = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ConfigError(f"{where}:{n}: expected USER:PASS (both non-empty)")
        pairs.append((user, password))
    if not pairs:
        raise ConfigError(f"{where} holds no USER:PASS line")
    return tuple(pairs)


def read_key_file(path: str) -> tuple[str, ...]:
    """API keys from a file, one per line (blank lines and ``#`` comments skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--api-key-file {path}: cannot be read ({e.strerror})") from None
    keys = tuple(k.strip() for k in text.splitlines() if k.strip() and not k.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key")
    return keys


def check_keys(keys: Sequence[str]) -> tuple[str, ...]:
    for key in keys:
        if len(key) < 16 or any(c.isspace() for c in key):
            raise ConfigError("an API key must be at least 16 characters without spaces "
                              "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return tuple(keys)


@dataclass(frozen=True)
class Access:
    """The credentials one server accepts; with none, everything is open."""

    api_keys: tuple[str, ...] = ()
    logins: Logins = ()

    @property
    def required(self) -> bool:
        return bool(self.api_keys or self.logins)

    @property
    def challenge(self) -> str:
        """The WWW-Authenticate header of a 401."""
        return "Bearer" if self.api_keys else 'Basic realm="SoVITS Studio"'

    def allows(self, headers: Mapping[bytes, bytes]) -> bool:
        if not self.required:
            return True
        auth = headers.get(b"authorization", b"")
        if self.api_keys:
            given = headers.get(b"x-api-key", b"")
            if auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            return _any_equal(given, [k.encode() for k in self.api_keys])
        if auth[:6].lower() != b"basic ":
            return False
        try:
            user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        ok = False
        for u, p in self.logins:  # every pair is compared: the time does not say which user exists
            ok |= hmac.compare_digest(user.encode(), u.encode()) & hmac.compare_digest(password.encode(), p.encode())
        return ok


def _any_equal(given: bytes, keys: list[bytes]) -> bool:
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key)
    return bool(given) and ok
