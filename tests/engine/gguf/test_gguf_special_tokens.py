"""Control, user-defined and end-of-generation tokens as llama.cpp decides them: by the file's
token types and by the tokens' text (a plain ``</s>`` in Qwen's vocabulary is matched whole, as
llama-server's /tokenize does; GPT-OSS's ``<|end|>`` ends nothing; FIM tokens are control)."""

from __future__ import annotations

from mlxcel.engine.gguf.special_tokens import CONTROL, NORMAL, USER_DEFINED, token_roles
from mlxcel.engine.gguf.tokenizer import build_tokenizer


def _roles(tokens, types=None, **ids):
    meta = {f"tokenizer.ggml.{k}_token_id": v for k, v in ids.items()}
    return token_roles(meta, tokens, types or [NORMAL] * len(tokens))


def test_text_decides_as_much_as_the_type():
    tokens = ["a", "</s>", "<|fim_prefix|>", "<|fim_pad|>", "<|im_end|>", "<tool_call>"]
    roles = _roles(tokens, [NORMAL, NORMAL, NORMAL, NORMAL, CONTROL, USER_DEFINED])
    assert roles.control == {1, 2, 3, 4} and roles.user_defined == {5}
    assert roles.eog == {1, 3, 4}  # </s>, the FIM pad, <|im_end|>; not the FIM prefix


def test_gpt_oss_end_token_is_not_the_end_and_its_channel_tokens_are_printed():
    tokens = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "x"]
    roles = _roles(tokens, [CONTROL] * 6 + [NORMAL])
    assert roles.eog == {4, 5}
    assert {0, 1, 2, 3} <= roles.user_defined and not ({0, 1, 2, 3} & roles.control)


def test_a_normal_end_marker_where_tool_responses_exist():
    tokens = ["</s>", "<|tool_response>", "y"]
    roles = _roles(tokens)
    assert 0 not in roles.eog and 0 not in roles.control and 1 in roles.eog


def test_metadata_ids_win_over_text_and_eos_always_ends():
    tokens = ["<|eot_id|>", "<|im_end|>", "<eos>", "z"]
    roles = _roles(tokens, eot=1, eos=3)
    assert roles.eog == {0, 1, 2, 3}
    assert 0 in roles.control  # an end-of-generation spelling is control whatever the metadata says


def test_a_plain_end_marker_is_matched_whole_in_text():
    """What the real Qwen2.5 vocabulary does: ``</s>`` is a NORMAL token that llama.cpp treats as
    control, so ``]</s>`` tokenizes as ``]`` then ``</s>``, not as BPE pieces."""
    tokens = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["</", "]</", "</s>"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [NORMAL] * len(tokens), "tokenizer.ggml.merges": ["< /", "] </"]}
    tok, ids = build_tokenizer(meta, "t")
    assert tok.encode("]</s>") == [tokens.index("]"), tokens.index("</s>")]
    assert tokens.index("</s>") in ids.eog
