"""How the router, and only the router, reaches its children.

Each child ``mlxcel-server`` listens on ``127.0.0.1`` at a free port, where any local process (or a
web page that guesses the port) could reach it; the router's own API key does not cover it. So the
router makes one random credential when it starts (``secrets.token_urlsafe``) and starts every
child with it as its only API key, through the environment (``LLAMA_API_KEY``) rather than the
command line, which ``ps`` shows to every user; the proxy and the router's health checks send it,
and nobody else knows it. Keys the router itself inherited from its environment are not passed
on, so a router key never opens a child directly.

Secret settings of a model (``--hf-token``) travel the same way, and the model list
(``GET /models``) shows a child's command line without its port: upstream's shape, with nothing
that leads to the child.
"""

from __future__ import annotations

import os
import secrets

CHILD_KEY_ENV = "LLAMA_API_KEY"  # the variable the server's --api-key reads
# the router's own key settings, never inherited by a child
INHERITED_KEYS = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")
# options whose values are secrets: given to the child by these environment variables instead
SECRET_OPTIONS = {"hf-token": "HF_TOKEN"}
HIDDEN_FLAGS = ("--port",)  # flags left out of the public listing, with their values


def new_credential() -> str:
    return secrets.token_urlsafe(32)


def split_secrets(options: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A child's options without the secret ones, and those as environment variables."""
    plain = {k: v for k, v in options.items() if k not in SECRET_OPTIONS}
    env = {SECRET_OPTIONS[k]: v for k, v in options.items() if k in SECRET_OPTIONS}
    return plain, env


def child_env(credential: str, secret_env: dict[str, str]) -> dict[str, str]:
    """The environment a child starts with: the router's, less its keys, plus the credential."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_KEYS}
    env.update(secret_env)
    env[CHILD_KEY_ENV] = credential
    return env


def auth_headers(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def public_args(args: list[str]) -> list[str]:
    """``args`` (a child's command line) as ``GET /models`` shows it: without the port."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in HIDDEN_FLAGS:
            skip = True
        elif arg.split("=", 1)[0] not in HIDDEN_FLAGS:
            out.append(arg)
    return out
