"""llama-server's command line, parsed into a ``runtime.config.ServerConfig``.

The parser is generated from :mod:`flag_table`, so every upstream flag is accepted; ignored and
planned flags are logged, refused ones end the program with one clear message.

As upstream, every flag that has a ``LLAMA_ARG_*`` environment variable (``Flag.env``) can be set
through it, and the command line wins over the environment. A switch is set by ``on``, ``enabled``,
``true`` or ``1`` and cleared by ``off``, ``disabled``, ``false`` or ``0``; a switch with a negative
form is cleared by a truthy ``LLAMA_ARG_NO_*`` too. ``--long_name`` is read as ``--long-name``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Mapping

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.hub_select import split_repo_tag
from mlxcel.engine.sampling.grammar import GBNF, JSON_SCHEMA, GrammarError, compile_grammar
from mlxcel.server.cli import help_text
from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS, Flag
from mlxcel.server.runtime.config import ArgumentError, ServerConfig

log = logging.getLogger(__name__)

def _lora_files(value: str) -> list[tuple[str, float]]:
    """``--lora FNAME[,FNAME...]``: each adapter at scale 1."""
    return [(name, 1.0) for name in (part.strip() for part in value.split(",")) if name]


def _lora_scaled(value: str) -> list[tuple[str, float]]:
    """``--lora-scaled FNAME:SCALE[,...]`` (the last colon splits, so a path may hold colons)."""
    out = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        name, sep, scale = item.rpartition(":")
        try:
            if not sep or not name or not math.isfinite(float(scale)):
                raise ValueError(item)
            out.append((name, float(scale)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"lora-scaled format: FNAME:SCALE (got {item!r})") from None
    return out


_TYPES = {"str": str, "int": int, "float": float, "lora": _lora_files, "lora_scaled": _lora_scaled}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # no usage dump + exit(2): one clean message
        raise ArgumentError(message)


def _key(flag: Flag) -> str:
    return flag.dest or "x_" + flag.names[-1].lstrip("-").replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlxcel-server", add_help=False, allow_abbrev=False)
    for flag in [*FLAGS, *EXTENSIONS]:
        key = _key(flag)
        if flag.names[0] in ("-h",):
            parser.add_argument(*flag.names, dest="help", action="store_true", default=None)
            continue
        if flag.names == ("--version",):
            parser.add_argument("--version", dest="version", action="store_true", default=None)
            continue
        if flag.metavar is None:
            parser.add_argument(*flag.names, dest=key, action="store_const", const=True, default=None)
            if flag.negatives:
                parser.add_argument(*flag.negatives, dest=key, action="store_const", const=False, default=None)
            continue
        kwargs = {"dest": key, "default": None, "metavar": flag.metavar.split()[0],
                  "type": _TYPES[flag.type] if flag.state in ("supported", "divergent") else str}
        if flag.append:
            kwargs["action"] = "append"
        elif flag.optional_value:
            kwargs["nargs"] = "?"
            kwargs["const"] = "on"
        elif flag.nargs != 1:
            kwargs["nargs"] = flag.nargs
        parser.add_argument(*flag.names, **kwargs)
    return parser


TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")


def env_arguments(environ: Mapping[str, str]) -> list[str]:
    """The flags the environment sets, as command-line arguments (to go before the real ones)."""
    out: list[str] = []
    for flag in [*FLAGS, *EXTENSIONS]:
        if not flag.env:
            continue
        value = environ.get(flag.env)
        negative = environ.get(flag.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)) if flag.negatives else None
        if flag.metavar is None:  # a switch
            for text, on in ((value, True), (negative, False)):
                if text is None:
                    continue
                if text.strip().lower() not in TRUTHY + FALSEY:
                    raise ArgumentError(f"environment variable {flag.env if on else flag.env.replace('LLAMA_ARG_', 'LLAMA_ARG_NO_', 1)}"
                                        f"={text!r}: expected one of {', '.join(TRUTHY + FALSEY)}")
                set_on = (text.strip().lower() in TRUTHY) == on
                if set_on:
                    out.append(flag.names[-1])
                elif flag.negatives:
                    out.append(flag.negatives[-1])
        elif value is not None:
            # "--flag=value": a value that begins with "-" (a random key, a negative name) is not a flag
            out += [f"{flag.names[-1]}={value}"] if value.startswith("-") and flag.nargs == 1 else [flag.names[-1], value]
    return out


def _long_dashes(arg: str) -> str:
    """``--ctx_size`` is ``--ctx-size`` (upstream replaces underscores in long flag names)."""
    if arg.startswith("--"):
        name, eq, value = arg.partition("=")
        return name.replace("_", "-") + eq + value
    return arg


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> ServerConfig:
    """``argv`` over the ``LLAMA_ARG_*`` variables of ``environ`` (default: this process's)."""
    env = os.environ if environ is None else environ
    full = env_arguments(env) + [_long_dashes(a) for a in argv]
    ns = vars(build_parser().parse_args(full))
    config = ServerConfig(argv=full)
    for flag in [*FLAGS, *EXTENSIONS]:
        key = _key(flag)
        value = ns.get(key) if key not in ("help", "version") else None
        if flag.names[0] == "-h":
            config.help = bool(ns.get("help"))
            continue
        if flag.names == ("--version",):
            config.version = bool(ns.get("version"))
            continue
        if value is None:
            continue
        name = flag.names[-1]
        if flag.state in ("supported", "divergent"):
            if flag.dest == "list_devices" or flag.names == ("--list-devices",):
                config.list_devices = True
            else:
                setattr(config, flag.dest, value)
        elif flag.state == "refused":
            text = str(value).lower() if not isinstance(value, bool) else str(value).lower()
            if value is False or text in flag.allowed:
                continue
            raise ArgumentError(f"{name} is not supported by mlxcel-server: {flag.note}")
        else:  # ignored / planned
            config.notes.append(f"{name}: {flag.note} (ignored)")
    # --lora and --lora-scaled append to one list, in command-line order: adapter ids are places in it
    config.lora_adapters = [pair for group in ns.get("lora_adapters") or [] for pair in group]
    if config.api_prefix:
        config.api_prefix = "/" + config.api_prefix.strip("/") if config.api_prefix.strip("/") else ""
    if config.parallel == 0 or config.parallel < -1:
        raise ArgumentError("-np/--parallel must be a positive number of slots (or -1 for auto)")
    if config.batch_size <= 0 or config.ubatch_size <= 0:
        raise ArgumentError("-b/--batch-size and -ub/--ubatch-size must be positive")
    if config.max_body_size <= 0 or config.max_prompt_tokens < 0 or (config.max_queue is not None
                                                                     and config.max_queue <= 0):
        raise ArgumentError("--max-body-size and --max-queue must be positive, --max-prompt-tokens >= 0")
    if config.timeout <= 0:
        raise ArgumentError("-to/--timeout must be a positive number of seconds")
    if config.agent is not None:  # upstream's -ag sets (or, with --no-agent, clears) both
        config.tools = "all" if config.agent else None
        config.ui_mcp_proxy = bool(config.agent)
    if config.sleep_idle_seconds == 0 or config.sleep_idle_seconds < -1:
        raise ArgumentError("--sleep-idle-seconds: invalid value: cannot be 0 or less than -1")
    if config.ctx_size < 0:
        raise ArgumentError("-c/--ctx-size must be >= 0 (0 = the model's own context length)")
    if config.media_path and not os.path.isdir(config.media_path):  # as upstream checks it
        raise ArgumentError(f"--media-path: not a directory: {config.media_path}")
    check_surface(config)
    hub_repos(config)
    gcp_environment(config, env)
    if config.reasoning is not None:
        text = config.reasoning.lower()
        if text not in (*TRUTHY, *FALSEY, "auto"):
            raise ArgumentError(f"unknown value for --reasoning: {config.reasoning!r} (on, off or auto)")
        config.reasoning = "on" if text in TRUTHY else "off" if text in FALSEY else "auto"
    if config.reasoning_format not in ("none", "auto", "deepseek", "deepseek-legacy"):
        raise ArgumentError(f"Unknown reasoning format: {config.reasoning_format}")
    if config.reasoning_budget < -1:
        raise ArgumentError("--reasoning-budget: invalid value (-1 for no limit, or a number of tokens)")
    if config.chat_template_kwargs is not None:
        try:
            if not isinstance(json.loads(config.chat_template_kwargs), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise ArgumentError(f"--chat-template-kwargs must be a JSON object: {exc}") from None
    grammar_flags(config)
    return config


def check_surface(config: ServerConfig) -> None:
    """The directories the slot-file and static-file flags name must exist, as upstream requires."""
    for flag, value in (("--slot-save-path", config.slot_save_path), ("--path", config.static_path)):
        if value and not os.path.isdir(value):
            raise ArgumentError(f"{flag}: not a directory: {value}")
    if config.pooling is not None and config.pooling not in ("none", "mean", "cls", "last", "rank"):
        raise ArgumentError(f"--pooling: invalid value {config.pooling!r} (none, mean, cls, last or rank)")


def hub_repos(config: ServerConfig) -> None:
    """``-hf`` / ``-hfd`` must name ``<user>/<model>[:quant]``: a typo ends the command line here,
    before the model loads, with upstream's wording."""
    for flag, value in (("-hf/--hf-repo", config.hf_repo), ("-hfd/--spec-draft-hf", config.draft_hf)):
        if value:
            try:
                split_repo_tag(value)
            except ModelLoadError as exc:
                raise ArgumentError(f"{flag}: {exc}") from None


def grammar_flags(config: ServerConfig) -> None:
    """``--grammar-file`` / ``-jf`` read into ``config.grammar`` / ``config.json_schema``, and the
    grammar compiled once, so a bad one ends the command line instead of every request."""
    for attr, path_attr, flag in (("grammar", "grammar_file", "--grammar-file"),
                                  ("json_schema", "json_schema_file", "-jf/--json-schema-file")):
        path = getattr(config, path_attr)
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    setattr(config, attr, f.read())
            except (OSError, UnicodeDecodeError) as exc:
                raise ArgumentError(f"cannot read {flag} {path}: {exc}") from None
    if config.grammar and config.json_schema is not None:
        raise ArgumentError("--grammar and -j/--json-schema both constrain every request; give one of them")
    try:
        if config.json_schema is not None:
            compile_grammar(JSON_SCHEMA, config.json_schema)
        elif config.grammar:
            compile_grammar(GBNF, config.grammar)
    except GrammarError as exc:
        which = "-j/--json-schema" if config.json_schema is not None else "--grammar"
        raise ArgumentError(f"{which}: {exc}") from None


def usage() -> str:
    """``--help``'s text, written from the flag table (``help_text``)."""
    return help_text.usage()


def gcp_environment(config: ServerConfig, env: Mapping[str, str]) -> None:
    """Google Cloud Vertex AI's custom-container variables, read as upstream reads them: with
    ``AIP_MODE=PREDICTION`` the server answers ``AIP_PREDICT_ROUTE`` (default ``/predict``),
    serves ``/health`` at ``AIP_HEALTH_ROUTE`` too, and listens on ``AIP_HTTP_PORT`` (default 8080)
    whatever ``--port`` says."""
    if env.get("AIP_MODE", "") != "PREDICTION":
        return
    config.gcp_predict_route = env.get("AIP_PREDICT_ROUTE") or "/predict"
    config.gcp_health_route = env.get("AIP_HEALTH_ROUTE") or None
    try:
        port = int(env.get("AIP_HTTP_PORT") or "8080")
    except ValueError:
        raise ArgumentError(f"AIP_HTTP_PORT must be a port number, not {env.get('AIP_HTTP_PORT')!r}") from None
    if port != config.port:
        log.warning("Google Cloud compat: AIP_HTTP_PORT %d overrides --port %d", port, config.port)
    config.port = port
