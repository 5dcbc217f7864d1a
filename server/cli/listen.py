"""The sockets the server listens on: ``--host`` is one address or several, comma-separated (IPv4
and IPv6 together, ``::`` binding IPv6 only, as upstream documents), or a UNIX socket path ending
in ``.sock``."""

from __future__ import annotations

import os
import socket


def hosts(value: str) -> list[str]:
    """The addresses of a ``--host`` value (brackets around an IPv6 address are allowed)."""
    out = [h.strip().removeprefix("[").removesuffix("]") for h in value.split(",")]
    return [h for h in out if h] or ["127.0.0.1"]


def bind(value: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address of ``--host`` on ``port`` (a ``.sock`` path: that UNIX
    socket). A failure closes what was opened and raises ``OSError`` naming the address."""
    sockets: list[socket.socket] = []
    try:
        for host in hosts(value):
            if host.endswith(".sock"):
                if os.path.exists(host):
                    os.unlink(host)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(host)
            else:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
            sock.listen(2048)
            sock.set_inheritable(True)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
