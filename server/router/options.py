"""Command-line options as the router handles them: one model's settings are a mapping from a
flag's canonical long name (``ctx-size``) to its value (``"true"`` / ``"false"`` for a switch),
read from the router's own command line or from a preset INI section, and rendered back into the
child server's command line. Any name of a flag works in a preset (``c``, ``ctx-size``,
``LLAMA_ARG_CTX_SIZE``; a negative switch name inverts the value), as upstream reads presets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")

# preset-only keys (never command-line flags)
LOAD_ON_STARTUP = "load-on-startup"
STOP_TIMEOUT = "stop-timeout"
DEDUP_CACHE_MODELS = "dedup-cache-models"
PRESET_ONLY = (LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS)

# the router's own settings, never passed on to a model's server
ROUTER_ONLY = ("models-dir", "models-preset", "models-max", "models-autoload", "api-key", "api-key-file",
               "ssl-key-file", "ssl-cert-file", "tools", "tools-runtime", "mcp-servers-config", "mcp-servers-json",
               "ui-mcp-proxy", "agent", "host", "port", "help", "version")
# a model's own source, which the router's command line does not override
MODEL_SOURCE = ("model", "hf-repo", "hf-file", "mmproj", "alias", "model-url")


def canonical(flag: Any) -> str:
    longs = [n for n in flag.names if n.startswith("--")]
    return (longs[-1] if longs else flag.names[-1]).lstrip("-")


@dataclass(frozen=True)
class Known:
    flag: Any  # cli.flag_table.Flag
    name: str  # canonical
    negative: bool  # the key was a negative switch name


TABLE: dict[str, Known] = {}


def register(flags: list) -> None:
    """Learn the server's flags (``cli.flag_table``'s, given by the CLI, which this layer sits under)."""
    for flag in flags:
        name = canonical(flag)
        for n in flag.names:
            TABLE[n.lstrip("-")] = Known(flag, name, False)
        for n in flag.negatives:
            TABLE[n.lstrip("-")] = Known(flag, name, True)
        if flag.env:
            TABLE[flag.env] = Known(flag, name, False)


def from_argv(argv: list[str]) -> dict[str, str]:
    """The options of an (already validated) command line."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-"):
            continue
        key, eq, inline = arg.partition("=")
        key = key.lstrip("-")
        if arg.startswith("--"):  # --long_name is --long-name, as the parser reads it
            key = key.replace("_", "-")
        known = TABLE.get(key)
        if known is None:
            continue
        if known.flag.metavar is None:
            out[known.name] = "false" if known.negative else "true"
        elif known.flag.optional_value and not eq and (i >= len(argv) or argv[i].startswith("-")):
            out[known.name] = "on"
        elif eq:
            out[known.name] = inline
        elif i < len(argv):
            out[known.name] = argv[i]
            i += 1
    return out


def normalize_key(key: str, value: str) -> tuple[str, str]:
    """A preset key and value as ``(canonical name, value)``; KeyError for an unknown key."""
    if key in PRESET_ONLY:
        return key, value
    known = TABLE[key]
    if known.flag.metavar is None and known.negative:
        value = "false" if value.strip().lower() in TRUTHY else "true"
    return known.name, value


def to_argv(options: dict[str, str]) -> list[str]:
    out: list[str] = []
    for name, value in options.items():
        if name in PRESET_ONLY:
            continue
        known = TABLE.get(name)
        if known is None:
            continue
        if known.flag.metavar is None:
            if value.strip().lower() in FALSEY:
                if known.flag.negatives:
                    out.append(known.flag.negatives[-1])
            else:
                out.append(f"--{name}" if len(name) > 1 else f"-{name}")
        else:
            out += [f"--{name}" if len(name) > 1 else f"-{name}", value]
    return out


def truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUTHY
