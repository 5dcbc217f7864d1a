"""A tiny real checkpoint whose greedy output is scripted: each token's successor is chosen when
the checkpoint is built, so a test knows what the model will write (a tool call, a thinking
block, an answer) without mocking anything the server does.

How: one llama layer whose attention and MLP write nothing (their output projections are
zero), so the last hidden state is the current token's embedding; the output head's row for
token ``j`` is the sum of the (unit) embeddings of the tokens ``j`` follows. Random embeddings
in 128 dimensions are nearly orthogonal, so the scripted successor wins by a wide margin (about
34 against a noise of about 3 on this vocabulary); a token with several successors ranks them by
their weights, and ``logit_bias`` banning the first picks the next. Every scripted piece of text
is one token: pieces the BPE vocabulary lacks are added to the tokenizer (non-special added
tokens, as Qwen's ``<think>`` and ``<tool_call>`` are).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import tiny_checkpoints

SCALE = 3.0


def build_scripted_checkpoint(out: Path, chat_template: str, chains: list[list[str]],
                              branches: dict[str, list[tuple[str, float]]] | None = None, *, seed: int = 0,
                              hidden: int = 128) -> Path:
    """Write the checkpoint to ``out``. ``chains``: lists of text pieces, each followed by the next
    (the last by whatever it is scripted to, e.g. ``<|im_end|>``, the EOS). ``branches``: pieces
    with several successors and their weights (the highest wins unless banned)."""
    from tokenizers import AddedToken, Tokenizer

    tiny_checkpoints.build_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pieces = {p for chain in chains for p in chain}
    for first, nexts in (branches or {}).items():
        pieces |= {first, *(n for n, _ in nexts)}
    vocab = tok.get_vocab()
    missing = sorted(p for p in pieces if p not in vocab and len(tok.encode(p, add_special_tokens=False).ids) != 1)
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in missing])
    tok.save(str(out / "tokenizer.json"))
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["chat_template"] = chat_template
    config_path.write_text(json.dumps(tok_config, indent=1))

    def one(piece: str) -> int:
        ids = tok.encode(piece, add_special_tokens=False).ids
        assert len(ids) == 1, f"{piece!r} is {len(ids)} tokens"
        return ids[0]

    successors: dict[int, list[tuple[int, float]]] = {}
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            successors.setdefault(one(a), []).append((one(b), 1.0))
    for first, nexts in (branches or {}).items():
        successors.setdefault(one(first), []).extend((one(n), w) for n, w in nexts)

    vocab_size = tok.get_vocab_size()
    config = tiny_checkpoints.tiny_config("llama", vocab_size, layers=1, hidden=hidden)
    params = tiny_checkpoints.random_params(config, seed)
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((vocab_size, hidden)).astype(np.float32)
    unit = embed / np.linalg.norm(embed, axis=1, keepdims=True)
    head = np.zeros((vocab_size, hidden), dtype=np.float32)
    for token, nexts in successors.items():
        for nxt, weight in nexts:
            head[nxt] += SCALE * weight * unit[token]
    params["model.embed_tokens.weight"] = mx.array(embed)
    params["lm_head.weight"] = mx.array(head)
    for name in list(params):
        if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            params[name] = mx.zeros_like(params[name])
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    return out
