"""llama-server's command line, parsed into a :class:`ServerConfig`.

The parser is generated from :mod:`flag_table`, so every upstream flag is accepted; ignored and
planned flags are logged, refused ones end the program with one clear message.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS, Flag

log = logging.getLogger(__name__)

_TYPES = {"str": str, "int": int, "float": float}


class ArgumentError(Exception):
    """A bad command line: the message is shown as ``error: ...`` without a traceback."""


# The sampler flags' defaults are the engine's (llama-server's) defaults, stated once.
_SAMPLER = SamplerParams()


@dataclass
class ServerConfig:
    model: str | None = None
    alias: str | None = None
    tags: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = -1  # -t: OpenBLAS threads on a Linux CPU (-1: the device default)
    ctx_size: int = 0
    parallel: int = -1
    n_predict: int = -1
    batch_size: int = 2048
    ubatch_size: int = 512
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    offline: bool = False
    seed: int = -1
    temperature: float = _SAMPLER.temperature
    top_k: int = _SAMPLER.top_k
    top_p: float = _SAMPLER.top_p
    min_p: float = _SAMPLER.min_p
    typical_p: float = _SAMPLER.typical_p
    xtc_probability: float = _SAMPLER.xtc_probability
    xtc_threshold: float = _SAMPLER.xtc_threshold
    repeat_last_n: int = _SAMPLER.repeat_last_n
    repeat_penalty: float = _SAMPLER.repeat_penalty
    presence_penalty: float = _SAMPLER.presence_penalty
    frequency_penalty: float = _SAMPLER.frequency_penalty
    dry_multiplier: float = _SAMPLER.dry_multiplier
    dry_base: float = _SAMPLER.dry_base
    dry_allowed_length: int = _SAMPLER.dry_allowed_length
    dry_penalty_last_n: int = _SAMPLER.dry_penalty_last_n
    dry_sequence_breaker: list[str] | None = None
    ignore_eos: bool = False
    logit_bias: list[str] | None = None
    samplers: str | None = None
    sampler_seq: str | None = None
    api_key: str | None = None
    api_key_file: str | None = None
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    api_prefix: str = ""
    metrics: bool = False
    props: bool = False
    slots: bool = True
    jinja: bool = True
    chat_template: str | None = None
    chat_template_file: str | None = None
    chat_template_kwargs: str | None = None
    timeout: int = 3600
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    max_body_size: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 0
    max_queue: int | None = None  # None: MLXCEL_MAX_QUEUE, else 256
    cache_prompt: bool = True
    slot_prompt_similarity: float = 0.1
    log_disable: bool = False
    log_file: str | None = None
    verbose: bool = False
    verbosity: int = 3
    help: bool = False
    version: bool = False
    list_devices: bool = False
    # speculative decoding (resolved by speculation.resolve)
    draft_model: str | None = None
    draft_hf: str | None = None
    spec_type: str | None = None
    spec_draft_n_max: int | None = None
    spec_draft_n_min: int | None = None
    spec_ngram_simple_size_n: int | None = None
    spec_ngram_simple_size_m: int | None = None
    spec_draft_sampling: str | None = None
    spec_default: bool = False
    draft_kind: str | None = None
    draft_adaptive: str | None = None
    notes: list[str] = field(default_factory=list)  # what was ignored, for the startup log

    @property
    def n_slots(self) -> int:
        return self.parallel if self.parallel > 0 else 4

    def api_keys(self) -> list[str]:
        keys = [k.strip() for k in (self.api_key or "").split(",") if k.strip()]
        if self.api_key_file:
            try:
                with open(self.api_key_file, encoding="utf-8") as f:
                    for line in f:
                        line = line.strip()
                        if line and not line.startswith("#"):
                            keys.append(line)
            except OSError as exc:
                raise ArgumentError(f"cannot read --api-key-file {self.api_key_file}: {exc}") from None
        return keys


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


def parse_args(argv: list[str]) -> ServerConfig:
    ns = vars(build_parser().parse_args(argv))
    config = ServerConfig()
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
    if config.ctx_size < 0:
        raise ArgumentError("-c/--ctx-size must be >= 0 (0 = the model's own context length)")
    return config


def parse_logit_bias_flag(entries: list[str] | None) -> dict[int, float]:
    """``-l 15043+1`` / ``-l 15043-1`` / ``-l 15043-inf``."""
    out: dict[int, float] = {}
    for entry in entries or []:
        for i in range(1, len(entry)):
            if entry[i] in "+-":
                try:
                    out[int(entry[:i])] = float(entry[i:])
                except ValueError:
                    break
                break
        else:
            raise ArgumentError(f"--logit-bias {entry!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
        if not out:
            raise ArgumentError(f"--logit-bias {entry!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
    return out


def usage() -> str:
    lines = ["usage: mlxcel-server [options]", "",
             "Drop-in replacement for llama-server on MLX. Every llama-server flag is accepted;",
             "see compat/llama-server/ for what each one does here.", ""]
    for flag in [*FLAGS, *EXTENSIONS]:
        names = ", ".join(flag.names + flag.negatives)
        meta = f" {flag.metavar}" if flag.metavar else ""
        state = "" if flag.state == "supported" else f" [{flag.state}]"
        lines.append(f"  {names}{meta}{state}")
        if flag.note:
            lines.append(f"        {flag.note}")
    return "\n".join(lines)
