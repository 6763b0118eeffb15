"""Who may drive a server that has no API key: requests named for this machine, never a web page elsewhere.

Without a key anyone who reaches the port may call it, which is the point on a workstation; what must not
work is a web page in the user's browser driving it. Two browser tricks are refused:

- **DNS rebinding**: a page on ``evil.example`` re-resolves its own name to 127.0.0.1 and calls the server as
  "same origin". The ``Host`` header then names ``evil.example``: a request whose Host is not an IP literal,
  a name without a dot (``localhost``, a LAN host), ``*.localhost`` or a name in ``allowed_hosts``
  (``--allowed-host``) is refused (403). Rebinding needs a registered domain, which always has a dot.
- **Cross-site requests**: a page's ``fetch``/form/``<img>`` sends ``Origin`` (for non-GETs) and
  ``Sec-Fetch-Site`` (modern browsers, every request). A request whose Origin is not the Host it was sent to
  (or an allowed host), or whose Sec-Fetch-Site is ``cross-site``/``same-site``, is refused (403).
  ``Origin: null`` is refused too: browsers send it from sandboxed frames, ``file:`` and ``data:`` pages and
  after cross-site redirects, all pages this server did not serve.

Clients that are not browsers (curl, the official api_v2 clients, gradio_client) send neither header, so the
official GET routes that change state (``/set_gpt_weights``...) keep working for them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

def _hostname(host: str) -> str:
    """``host[:port]`` or ``[v6]:port`` -> the name or address, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _listed(name: str, allowed: Sequence[str]) -> bool:
    """``name`` is one of ``allowed``; an entry starting with "." allows every name under it (``.gradio.live``)."""
    return any(name == a or (a.startswith(".") and name.endswith(a)) for a in (x.lower() for x in allowed))


def host_allowed(host: str, allowed: Sequence[str] = ()) -> bool:
    name = _hostname(host)
    if "." not in name or name.endswith(".localhost") or _listed(name, allowed):
        return True  # a name without a dot (localhost, a LAN host) is no domain an attacker can re-resolve
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def origin_refusal(headers: Mapping[bytes, bytes], allowed: Sequence[str] = ()) -> str | None:
    """Why this request looks like a web page driving the server (a message for a 403), or None."""
    host = headers.get(b"host", b"").decode("latin-1")
    if host and not host_allowed(host, allowed):
        return (f"host: {_hostname(host)[:100]!r} is not this server's address; without an API key only "
                "requests to an IP address, localhost or an allowed host name are served (DNS rebinding)")
    origin = headers.get(b"origin", b"").decode("latin-1")
    if origin.strip().lower() == "null":  # an opaque origin: a sandboxed frame, a file: page, a redirect
        return ("origin: 'null' (a sandboxed frame, a file: or data: page, or a redirect) is refused without an "
                "API key; open the page this server serves, or start it with --api-key")
    if origin:
        parts = urlsplit(origin)
        same = parts.netloc.lower() == host.lower()
        if not same and not (parts.hostname and _listed(parts.hostname.lower(), allowed)):
            return ("origin: requests from another web site are refused without an API key; "
                    "start the server with --api-key to serve other origins")
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
    if site in ("cross-site", "same-site"):
        return ("origin: requests from another web site are refused without an API key; "
                "start the server with --api-key to serve other origins")
    return None
