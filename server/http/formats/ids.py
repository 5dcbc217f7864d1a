"""The ids the response objects of every API carry (``chatcmpl-...``, ``resp_...``, ``msg_...``,
``rs_...``): a prefix and 32 random letters and digits, from the OS's random source, so that no
id says anything about another or about the server."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(32))
