"""Whether a request may come from another site's web page, for a route that must not serve such
pages when the server has no API key: the web UI's CORS proxy (``--ui-mcp-proxy``), which fetches
any URL it is given, localhost ones included.

Browsers tell: a cross-origin ``fetch`` always carries ``Origin`` (``null`` from sandboxed frames and
``file:`` pages), and modern ones add ``Sec-Fetch-Site``. A request is refused when ``Sec-Fetch-Site``
says ``cross-site`` or ``same-site`` (same-site is still another origin: another port of
localhost), or when its ``Origin`` names another host or port than the ``Host`` it was sent to
(or is not an http(s) origin at all).

DNS rebinding makes an attacker's name resolve to this server, so that its page's requests are
same-origin (``Host: evil.example:8080``, no ``Origin`` on a GET). So the ``Host`` must also name
this server in a way no other site controls: an IP address, ``localhost``, or a name the server
was started with (``--host``). Anyone who reaches the server by another name can set an API key.
A request from a program (curl, a script) to the server's address passes.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def server_names(host_flag: str) -> set[str]:
    """The names in a ``--host`` value (comma-separated; an IPv6 address may be bracketed)."""
    return {h.strip().removeprefix("[").removesuffix("]").lower() for h in host_flag.split(",") if h.strip()}


def _split_host(host: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` (``[v6]:port`` too) as (lower-case name, port); None when malformed."""
    try:
        parts = urlsplit("//" + host)
        return (parts.hostname or "").lower(), parts.port or default_port
    except ValueError:
        return None


def _trusted_name(name: str, own_names: set[str]) -> bool:
    """A name no other site can point at this server: an IP address, localhost, a --host name."""
    if name == "localhost" or name in own_names:
        return True
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def cross_origin_reason(headers, own_names: set[str]) -> str | None:
    """Why this request (Starlette ``Headers``) may come from another site's page, or None when it
    cannot. ``own_names``: the host names the server was started with (``server_names``)."""
    site = headers.get("sec-fetch-site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return f"the request comes from another site (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    scheme = "http"
    origin_host = None
    if origin is not None:
        try:
            parts = urlsplit(origin.strip())
            scheme = parts.scheme.lower()
            origin_host = ((parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme, 0))
        except ValueError:
            pass
        if origin_host is None or not origin_host[0] or scheme not in DEFAULT_PORTS:
            return f"the request comes from an opaque or malformed origin ({origin[:100]!r})"
    own = _split_host(headers.get("host", ""), DEFAULT_PORTS[scheme])
    if own is None or not _trusted_name(own[0], own_names):
        name = own[0][:100] if own else ""
        return f"the server was reached by the name {name!r}, which another site may control (DNS rebinding)"
    if origin_host is not None and own != origin_host:
        return f"the request comes from another origin ({origin[:100]})"
    return None
