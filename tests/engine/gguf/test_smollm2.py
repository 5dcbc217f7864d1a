"""The shipped SmolLM2-135M-Instruct Q4_1 GGUF, end to end through the GGUF loader."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_gguf

from mlxcel.engine.model.loading import load_model

PARAGRAPH = (
    "The city of Paris is the capital of France. It is known for its museums, its cafes and the Eiffel Tower, "
    "which was built for the World's Fair in 1889. Every year millions of visitors walk along the river Seine, "
    "climb the hill of Montmartre and eat croissants for breakfast."
)


def greedy(loaded, ids: list[int], n: int) -> list[int]:
    cache = loaded.make_cache()
    x, out = mx.array([ids]), []
    for _ in range(n):
        nxt = int(mx.argmax(loaded.model(x, cache=cache)[0, -1]).item())
        out.append(nxt)
        if nxt in loaded.eos_token_ids:
            break
        x = mx.array([[nxt]])
    return out


def perplexity(model, ids: list[int]) -> float:
    logits = model(mx.array([ids]))[0, :-1].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logprobs, mx.array(ids[1:])[:, None], axis=-1).mean()
    return float(mx.exp(nll).item())


@pytest.fixture(scope="module")
def smollm2():
    return load_model(None)


def test_loads_as_llama_with_tied_embeddings(smollm2):
    cfg = smollm2.config
    assert smollm2.source == "gguf" and cfg["model_type"] == "llama"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (30, 576, 9, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["rope_theta"] == 100000.0
    assert cfg["vocab_size"] == 49152 and smollm2.context_length == 8192
    # llama-server's end-of-generation set for this file (its ignore_eos request bans exactly these):
    # <|endoftext|>, <|im_end|>, <reponame>.
    assert smollm2.add_bos is False and smollm2.eos_token_ids == {0, 2, 4}


def test_answers_capital_of_france(smollm2):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    ids = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    answer = smollm2.tokenizer.decode(greedy(smollm2, ids, 20))
    assert "Paris" in answer, answer


def test_completion_starts_like_llama_server(smollm2):
    """llama-server greedy on the same file: " Paris.\\n\\nThe United States has ...". Its CPU
    kernels round activations to 8 bits, so only the opening tokens are expected to agree."""
    ids = smollm2.tokenizer.encode("The capital of France is")
    text = smollm2.tokenizer.decode(greedy(smollm2, ids, 4))
    assert text.startswith(" Paris.\n\n"), text


def test_perplexity_catches_a_wrong_qk_permutation(smollm2, monkeypatch):
    ids = smollm2.tokenizer.encode(PARAGRAPH)
    good = perplexity(smollm2.model, ids)
    assert good < 15, good  # measured ~9.5
    # The same weights with q/k rows left in llama.cpp's order (what skipping the unpermute gives).
    monkeypatch.setenv("MLXCEL_WEIGHTS", "float32")  # plain layers, whose rows we can reorder
    wrong = load_model(None)
    tiny_gguf.permute_qk_in_place(wrong.model, wrong.config)
    bad = perplexity(wrong.model, ids)
    assert bad > 2 * good, (good, bad)  # measured ~34
