"""``POST /infill``: fill-in-the-middle, with the prompt assembled as llama-server assembles it.

The request is a ``/completion`` request (every field of it works the same) plus ``input_prefix``,
``input_suffix`` (required; a string, or a mixed array of token ids and strings), ``input_extra``
(optional chunks of other files, ``[{"filename", "text"}]``) and ``prompt`` (optional text that
goes after the middle token, the start of the infill itself). The tokens are laid out as
upstream's repo-level pattern (arXiv 2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n    (the extra context)
    [BOS] [FIM_PRE]{prefix}{prompt} [FIM_SUF]{suffix} [FIM_MID]

Without a repo token the ``myproject`` line is left out; without a file-separator token each
chunk is preceded by a plain ``\\n\\n--- snippet ---\\n\\n`` line instead and no final
``filename`` line is written. ``--spm-infill`` puts the suffix part before the prefix part. Upstream's
budget: at most ``3/4 * n_batch`` prefix tokens (the end of the prefix is kept), at most
``n_batch/4 - 2 - len(prompt)`` suffix tokens (the start is kept), and the extra context cut to
``n_ctx - n_batch - 2 * n_predict`` tokens (its end is kept), where ``n_batch`` is ``-b``,
``n_predict`` the server's ``-n`` and ``n_ctx`` a slot's context. Prefix, suffix, file names and
chunk texts are tokenized without parsing special tokens; ``prompt`` with.

Written here: the layout is llama-server's own, and no library assembles it.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.model.fim_tokens import FimTokens
from mlxcel.server.http.plan import CompletionPlan, native_plan
from mlxcel.server.http.prompts import bos_prefix, tokenize_text
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import invalid, not_supported

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
EXTRA_FORM = '"input_extra" must be an array of {"filename": string, "text": string}'


def check_fim(fim: FimTokens | None) -> FimTokens:
    """The model's FIM tokens, or upstream's 501 naming what is missing."""
    missing = FimTokens().missing() if fim is None else fim.missing()
    if missing:
        raise not_supported(f"Infill is not supported by this model: {missing}")
    return fim


def _mixed(tokenizer, value: Any, field: str) -> list[int]:
    """A string, or an array of token ids and strings, as tokens (special tokens not parsed)."""
    if isinstance(value, str):
        return tokenize_text(tokenizer, value, add_special=False, parse_special=False)
    if isinstance(value, list):
        out: list[int] = []
        for piece in value:
            if isinstance(piece, int) and not isinstance(piece, bool):
                out.append(piece)
            elif isinstance(piece, str):
                out.extend(tokenize_text(tokenizer, piece, add_special=False, parse_special=False))
            else:
                raise invalid(f'"{field}" must be a string or an array of token ids and strings')
        return out
    raise invalid(f'"{field}" must be a string or an array of token ids and strings')


def check_extra(body: dict) -> list[dict]:
    """``input_extra`` checked with upstream's messages (absent: no chunks)."""
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise invalid(EXTRA_FORM)
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise invalid('extra_context chunk\'s "filename" field must be a string')
    return extra


def infill_tokens(tokenizer, fim: FimTokens, *, prefix: list[int], suffix: list[int], extra: list[dict],
                  prompt: list[int], n_batch: int, n_predict: int, n_ctx: int, spm: bool,
                  bos: list[int]) -> list[int]:
    """The infill prompt (see the module docstring); ``bos`` is ``[bos]`` when the model adds one."""

    def text(s: str) -> list[int]:
        return tokenize_text(tokenizer, s, add_special=False, parse_special=False)

    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep, *text("myproject\n")]
    for chunk in extra:
        if fim.sep is not None:
            extra_tokens += [fim.sep, *text(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += text(SNIPPET_SEPARATOR)
        extra_tokens += text(chunk["text"])
    if fim.sep is not None:
        extra_tokens += [fim.sep, *text("filename\n")]

    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))

    prefix_part = [fim.pre, *prefix[len(prefix) - n_prefix:], *prompt]
    suffix_part = [fim.suf, *suffix[:n_suffix]]
    first, second = (suffix_part, prefix_part) if spm else (prefix_part, suffix_part)
    head = extra_tokens[len(extra_tokens) - n_extra:] if n_extra else []
    return [*head, *bos, *first, *second, fim.mid]


def infill_plan(state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
    """``POST /infill``: the model's FIM tokens checked first (501), then the infill fields, then the
    assembled prompt planned as a ``/completion`` request."""
    fim = check_fim(state.fim)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise invalid('"prompt" must be a string')
    for field in ("input_prefix", "input_suffix"):
        if field not in body:
            raise invalid(f'"{field}" is required')
    extra = check_extra(body)
    tokenizer = state.loaded.tokenizer
    tokens = infill_tokens(
        tokenizer, fim,
        prefix=_mixed(tokenizer, body["input_prefix"], "input_prefix"),
        suffix=_mixed(tokenizer, body["input_suffix"], "input_suffix"),
        extra=extra,
        prompt=tokenize_text(tokenizer, prompt, add_special=False) if prompt else [],
        n_batch=state.config.batch_size, n_predict=state.config.n_predict, n_ctx=state.scheduler.n_ctx,
        spm=state.config.spm_infill, bos=bos_prefix(state.loaded))
    return native_plan(state, {**body, "prompt": tokens}, t_arrival)
