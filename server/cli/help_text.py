"""The text of ``mlxcel-server --help``, written from the flag table.

Laid out as upstream's help is, so a llama-server user finds a flag where they expect it: the
sections in upstream's order (``flag_table.SECTIONS``), each flag's names in a 40-column margin,
then what it does, its default and ``(env: LLAMA_ARG_...)`` where the environment can set it.
Three things differ, to keep the help useful: a short block of the flags nearly every launch uses
comes first (so ``--help | head -40`` answers the common question), mlxcel's own flags have a
section of their own, and the flags mlxcel accepts but ignores or refuses are left out of the
sections and listed at the end, grouped by the reason, names only (the compat record under
``compat/llama-server/`` has each one's note too).

Only the flag table and ``ServerConfig`` (for the defaults) are read: ``--help`` answers before
anything heavy is imported (see ``serve``).
"""

from __future__ import annotations

import dataclasses
import textwrap

from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS, SECTIONS, Flag
from mlxcel.server.runtime.config import ServerConfig

WIDTH = 110  # upstream wraps its help at about this width
MARGIN = 40  # the column descriptions start in, as upstream's
HONOURED = ("supported", "divergent")
# the flags nearly every launch uses, by first name: the help's first block
MOST_USED = ("-m", "-hf", "-c", "-np", "--host", "--port", "-ngl", "-n", "-a", "--api-key", "-t")

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServerConfig)
             if f.default is not dataclasses.MISSING}


def usage() -> str:
    by_name = {flag.names[0]: flag for flag in FLAGS}
    lines = ["usage: mlxcel-server [options]", "",
             "llama-server on MLX: every llama-server flag is accepted, and every LLAMA_ARG_* variable shown below",
             "(the command line wins over the environment). What each flag does here: compat/llama-server/.", ""]
    lines += _section("most used", [by_name[name] for name in MOST_USED])
    for title, flags in SECTIONS:
        lines += _section(title, [f for f in flags if f.state in HONOURED])
    lines += _section("mlxcel params (not in llama-server)", EXTENSIONS)
    lines += _grouped("accepted and ignored (each one logs why at startup)", "ignored")
    lines += _grouped("refused (the server does not start with them)", "refused")
    return "\n".join(lines).rstrip() + "\n"


def names_of(flag: Flag) -> str:
    """The names column, as upstream writes it: a short first name padded to 7 columns."""
    names = [*flag.names, *flag.negatives]
    if len(names) > 1 and not names[0].startswith("--"):
        head = f"{names[0] + ',':<7}" + ", ".join(names[1:])
    else:
        head = ", ".join(names)
    return head + (f" {flag.metavar}" if flag.metavar else "")


def description(flag: Flag) -> str:
    """What the flag does, how mlxcel does it, and its default."""
    if flag.state not in HONOURED:
        return f"{flag.state} here: {flag.note}"
    text = "; ".join(part for part in (flag.help, flag.note) if part)
    default = default_of(flag)
    return f"{text} (default: {default})".lstrip() if default else text


def default_of(flag: Flag) -> str:
    """The default to show: the table's own, else the config field's, unless the text says it."""
    if flag.default is not None:
        return flag.default
    if "default" in f"{flag.help} {flag.note}" or not flag.dest or flag.dest not in _DEFAULTS:
        return ""
    value = _DEFAULTS[flag.dest]
    if isinstance(value, bool):
        return "enabled" if value else "disabled"
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None or value == "" else str(value)


def entry(flag: Flag) -> list[str]:
    head = names_of(flag)
    body = textwrap.wrap(description(flag), WIDTH - MARGIN, break_on_hyphens=False, break_long_words=False) or [""]
    if flag.env:
        body.append(f"(env: {flag.env})")
    if len(head) < MARGIN:
        return [f"{head:<{MARGIN}}{body[0]}".rstrip(), *(" " * MARGIN + line for line in body[1:])]
    return [head, *(" " * MARGIN + line for line in body)]


def _section(title: str, flags: list[Flag]) -> list[str]:
    lines = [f"----- {title} -----", ""]
    for flag in flags:
        lines += entry(flag)
    return [*lines, ""]


def _grouped(title: str, state: str) -> list[str]:
    """The flags in ``state``, grouped by their note: the names, then the reason."""
    groups: dict[str, list[str]] = {}
    for flag in FLAGS:
        if flag.state == state:
            groups.setdefault(flag.note, []).extend([*flag.names, *flag.negatives])
    lines = [f"----- {title} -----", ""]
    for note, names in groups.items():
        lines += textwrap.wrap(f"{', '.join(names)}: {note}", WIDTH, subsequent_indent="    ",
                               break_on_hyphens=False, break_long_words=False)
    return [*lines, ""]
