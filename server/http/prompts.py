"""Turning a request's ``prompt`` into token lists, in every form upstream accepts:

- a string;
- an array of token ids, or of ids and strings mixed (one prompt, pieces concatenated);
- an object ``{"prompt_string": ...}`` (the multimodal form: its ``multimodal_data`` images are read by
  the plan, ``http.media``; on a text model they are refused here);
- an array of any of the above that is not itself a token array: several prompts, one result each.
"""

from __future__ import annotations

from typing import Any

from mlxcel.engine.vision.prompt import MarkerMismatch, PromptMedia, marked_prompt
from mlxcel.server.http.media import MEDIA_MARKER, multimodal_prompt_refused
from mlxcel.server.runtime.errors import invalid

PROMPT_FORMS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                "or a list of mixed strings & tokens.")


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def split_prompts(prompt: Any) -> list[Any]:
    """The individual prompts of a ``prompt`` field."""
    if isinstance(prompt, list) and prompt and not any(_is_token(x) for x in prompt):
        return list(prompt)
    return [prompt]


def tokenize_text(tokenizer, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
    """Token ids of ``text``. ``add_special`` adds the BOS token when the model wants one;
    ``parse_special=False`` tokenizes special-token markup as plain text."""
    tok = getattr(tokenizer, "_tokenizer", tokenizer)
    kwargs = {"add_special_tokens": add_special}
    if not parse_special:
        kwargs["split_special_tokens"] = True
    try:
        ids = tok.encode(text, **kwargs)
    except TypeError:  # a tokenizer without split_special_tokens
        kwargs.pop("split_special_tokens", None)
        ids = tok.encode(text, **kwargs)
    return list(ids)


def bos_prefix(loaded) -> list[int]:
    bos = loaded.bos_token_id
    return [bos] if loaded.add_bos and bos is not None else []


def tokenize_prompt(loaded, prompt: Any) -> list[int]:
    """One prompt (any single form) -> token ids, with BOS when the model adds one."""
    tokenizer = loaded.tokenizer
    if isinstance(prompt, dict):
        if "multimodal_data" in prompt:
            raise multimodal_prompt_refused()
        text = prompt.get("prompt_string")
        if not isinstance(text, str):
            raise invalid(PROMPT_FORMS)
        prompt = text
    if isinstance(prompt, str):
        ids = tokenize_text(tokenizer, prompt, add_special=False)
        return bos_prefix(loaded) + ids
    if isinstance(prompt, list):
        ids: list[int] = []
        for piece in prompt:
            if _is_token(piece):
                ids.append(piece)
            elif isinstance(piece, str):
                ids.extend(tokenize_text(tokenizer, piece, add_special=False))
            else:
                raise invalid(PROMPT_FORMS)
        if prompt and isinstance(prompt[0], str):
            ids = bos_prefix(loaded) + ids
        return ids
    raise invalid(PROMPT_FORMS)


def tokenize_media_prompt(loaded, text: str, images: list) -> tuple[list[int], PromptMedia]:
    """Prompt text whose media markers stand for ``images`` (in order) as token ids, each image holding
    its embeddings' positions, with BOS when the model adds one (``engine.vision.prompt``)."""
    try:
        return marked_prompt(text, MEDIA_MARKER, images, loaded.vision,
                             lambda piece: tokenize_text(loaded.tokenizer, piece, add_special=False), bos_prefix(loaded))
    except MarkerMismatch as exc:
        raise invalid(str(exc)) from None


def check_tokens(ids: list[int], vocab_size: int) -> None:
    if any(t < 0 or t >= vocab_size for t in ids):
        raise invalid("Prompt contains invalid tokens")


# A token never stands for more than (longest vocabulary piece x this) characters of input, even
# after normalization (composition can merge a couple of code points into one).
_NORMALIZATION_SLACK = 4


def longest_piece(tokenizer) -> int:
    """Characters in the longest piece of the vocabulary (special tokens included)."""
    tok = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        return max((len(piece) for piece in tok.get_vocab()), default=1) or 1
    except Exception:  # a tokenizer without a vocabulary listing: no shortcut
        return 0


def least_tokens(prompt: Any, piece_chars: int) -> int:
    """A lower bound on the token count of one prompt (any single form) without tokenizing it, so
    that a prompt far past the context is refused at once instead of after seconds of tokenizing
    (the tokenizer holds the event loop while it runs). 0 when ``piece_chars`` is unknown."""
    if piece_chars <= 0:
        return 0
    per_token = piece_chars * _NORMALIZATION_SLACK
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt_string")
    if isinstance(prompt, str):
        return len(prompt) // per_token
    if isinstance(prompt, list):
        return sum(1 if _is_token(p) else len(p) // per_token if isinstance(p, str) else 0 for p in prompt)
    return 0
