"""Embedding and rerank requests as upstream reads them, and the bodies it answers.

Inputs (``input``, or ``content`` for the native shape): one prompt in any form ``/completion``
takes (a string, token ids, mixed, ``{"prompt_string"}``), an OpenAI content object
``{"content": [{"type": "text", "text": ...}, ...]}`` (text parts joined), or an array of those.
Strings are tokenized with the model's special tokens (BOS, and EOS where the model adds one; a
WordPiece vocabulary's ``[CLS] text [SEP]``, as llama.cpp's WordPiece tokenizer always does).
Rerank prompts: the model's own rerank template with ``{query}`` and ``{document}`` filled in, or
``BOS query [EOS] [SEP] document [EOS]`` as the vocabulary asks.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from mlxcel.server.http.prompts import (
    PROMPT_FORMS,
    bos_prefix,
    check_tokens,
    least_tokens,
    tokenize_prompt,
    tokenize_text,
)
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import context_exceeded, context_exceeded_at_least, invalid

NOT_MULTIMODAL = ("image_url", "input_audio", "input_video")


def _eos(loaded) -> list[int]:
    """The file's EOS token where it asks for one at the end of a text (its ``eos_token_id``: the
    set of tokens that end generation may hold others, a WordPiece ``[PAD]`` among them)."""
    if not loaded.metadata.get("add_eos"):
        return []
    eos = loaded.config.get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    ends = sorted(loaded.eos_token_ids)
    return ends[:1]


def _closing(loaded) -> list[int]:
    """What ends an embedding input: a WordPiece vocabulary's separator (llama.cpp's WordPiece
    tokenizer closes every text with it, whatever the file's add-EOS flag), else :func:`_eos`."""
    sep = loaded.metadata.get("sep_token_id")
    if loaded.metadata.get("tokenizer_model") == "bert" and isinstance(sep, int):
        return [sep]
    return _eos(loaded)


def _sep(loaded) -> list[int]:
    sep = loaded.metadata.get("sep_token_id")  # an encoder's, with llama.cpp's WordPiece default
    if sep is None:
        sep = (loaded.metadata.get("token_ids") or {}).get("tokenizer.ggml.seperator_token_id")
    return [sep] if loaded.metadata.get("add_sep") and isinstance(sep, int) else []


def _content_text(parts: Any) -> str:
    if not isinstance(parts, list):
        raise invalid('"content" must be an array of content parts')
    text = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind in NOT_MULTIMODAL:
            raise invalid(f"{kind} input is not supported: mlxcel-server is text-only")
        else:
            raise invalid(f"unsupported content part type: {kind!r}")
    return "".join(text)


def input_tokens(state: ServerState, entry: Any) -> list[int]:
    """One embedding input as tokens (special tokens added to text), checked against the context."""
    loaded = state.loaded
    if isinstance(entry, dict) and "content" in entry:
        entry = _content_text(entry["content"])
    if isinstance(entry, str):
        _least_fitting(state, entry)
        tokens = bos_prefix(loaded) + tokenize_text(loaded.tokenizer, entry, add_special=False) + _closing(loaded)
    elif isinstance(entry, (list, dict)):
        tokens = tokenize_prompt(loaded, entry)
        if isinstance(entry, dict) or entry and isinstance(entry[0], str):  # text first: closed as text is
            tokens += _closing(loaded)
    else:
        raise invalid(PROMPT_FORMS)
    if not tokens:
        raise invalid("Input content cannot be empty")
    check_tokens(tokens, loaded.vocab_size)
    if len(tokens) > state.scheduler.n_ctx:
        raise context_exceeded(len(tokens), state.scheduler.n_ctx)
    state.limits.check_prompt(len(tokens))
    return tokens


def embedding_inputs(state: ServerState, value: Any) -> list[list[int]]:
    """Every input of ``input`` / ``content`` (an array that is not itself a token array is several)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        raise invalid(PROMPT_FORMS)
    many = isinstance(value, list) and not any(isinstance(x, int) and not isinstance(x, bool) for x in value)
    entries = list(value) if many else [value]
    if not entries:
        raise invalid('"input" must not be empty')
    return [input_tokens(state, e) for e in entries]


def check_encoding(body: dict) -> bool:
    """Whether ``encoding_format`` asks for base64 (``float``, the default, does not)."""
    fmt = body.get("encoding_format", "float")
    if fmt == "base64":
        return True
    if fmt != "float":
        raise invalid("The format to return the embeddings in. Can be either float or base64")
    return False


def check_normalize(body: dict, default: int) -> int:
    value = body.get("embd_normalize", default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("Field 'embd_normalize': type must be number")
    return value


def native_body(vectors: list[np.ndarray]) -> list[dict]:
    """``/embedding``: per input its rows (one row when pooled)."""
    return [{"index": i, "embedding": (v if v.ndim == 2 else v[None]).tolist()} for i, v in enumerate(vectors)]


def oai_body(body: dict, model_name: str, vectors: list[np.ndarray], n_tokens: list[int], use_base64: bool) -> dict:
    data = []
    for i, v in enumerate(vectors):
        if use_base64:
            data.append({"embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii"), "index": i,
                         "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": v.tolist(), "index": i, "object": "embedding"})
    total = sum(n_tokens)
    return {"model": body.get("model", model_name), "object": "list",
            "usage": {"prompt_tokens": total, "total_tokens": total}, "data": data}


# -- rerank ----------------------------------------------------------------------------------------

def rerank_request(body: dict) -> tuple[str, list[str], int, bool]:
    """``query``, the documents (``documents``, or TEI's ``texts``), ``top_n`` and whether the
    request is TEI-shaped, checked with upstream's messages."""
    if "query" not in body:
        raise invalid('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise invalid('"query" must be a string')
    tei = "texts" in body
    docs = body.get("documents", body.get("texts"))
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise invalid('"documents" must be a non-empty string array')
    top_n = body.get("top_n", len(docs))
    if isinstance(top_n, bool) or not isinstance(top_n, int):
        raise invalid("Field 'top_n': type must be number")
    return query, docs, top_n, tei


def rerank_inputs(state: ServerState, template: str | None, query: str, docs: list[str]) -> list[list[int]]:
    """Every document's rerank prompt as tokens, each checked against the context. Without a
    template the query is tokenized once, not once per document. Seconds of work for a large
    request: called in a worker thread."""
    loaded = state.loaded
    n_ctx = state.scheduler.n_ctx
    least_query = _least_fitting(state, query)
    head: list[int] = []
    if template is None:
        head = bos_prefix(loaded) + _plain_tokens(loaded, query) + _eos(loaded) + _sep(loaded)
    prompts = []
    for doc in docs:
        _least_fitting(state, doc, least_query)
        if template is not None:
            text = template.replace("{query}", query).replace("{document}", doc)
            tokens = tokenize_text(loaded.tokenizer, text, add_special=False)
        else:
            tokens = head + _plain_tokens(loaded, doc) + _eos(loaded)
        if not tokens:
            raise invalid("Input content cannot be empty")
        if len(tokens) > n_ctx:
            raise context_exceeded(len(tokens), n_ctx)
        prompts.append(tokens)
    return prompts


def _plain_tokens(loaded, text: str) -> list[int]:
    """A rerank text without special tokens parsed in it (the vocabulary's own layout adds them)."""
    return tokenize_text(loaded.tokenizer, text, add_special=False, parse_special=False)


def _least_fitting(state: ServerState, text: str, more: int = 0) -> int:
    """The fewest tokens ``text`` can be (``prompts.least_tokens``), plus ``more`` already counted
    beside it: past the context, the input is refused before seconds of tokenizing it."""
    least = least_tokens(text, state.piece_chars) + more
    if least > state.scheduler.n_ctx:
        raise context_exceeded_at_least(least, state.scheduler.n_ctx)
    return least


def rerank_body(body: dict, model_name: str, docs: list[str], scores: list[float], n_tokens: list[int],
                top_n: int, tei: bool) -> Any:
    label = "score" if tei else "relevance_score"
    with_text = tei and bool(body.get("return_text", False))
    elements = []
    for i, score in enumerate(scores):
        elem = {"index": i, label: score}
        if with_text:
            elem["text"] = docs[i]
        elements.append(elem)
    elements.sort(key=lambda e: e[label], reverse=True)  # stable: equal scores keep document order
    results = elements[:max(0, top_n)]
    if tei:
        return results
    total = sum(n_tokens)
    return {"model": body.get("model", model_name), "object": "list",
            "usage": {"prompt_tokens": total, "total_tokens": total}, "results": results}
