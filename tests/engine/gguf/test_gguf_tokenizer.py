"""The tokenizer rebuilt from GGUF metadata: SmolLM2's against ids the real llama-server
returned for the same file (the captures in ``shared/reference/llama-server``) and against transformers'
own GGUF tokenizer; the tiny GGUFs' against the tokenizer.json they were converted from."""

from __future__ import annotations

import pytest
import tiny_checkpoints
import tiny_gguf

from mlxcel.engine.gguf.file import read_gguf
from mlxcel.engine.gguf.tokenizer import build_tokenizer, merges_from_scores
from mlxcel.engine.model.loading import default_model_path, load_model

# (text, ids) pairs captured from llama-server's /tokenize serving SmolLM2-135M-Instruct.Q4_1.gguf.
LLAMA_SERVER_IDS = [
    ("The capital of France is", [504, 3575, 282, 4649, 314]),
    ("Hello 媽 🤗", [19556, 13223, 120, 138, 15107, 114, 241]),
]
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
# llama-server's /apply-template output for MESSAGES, and its prompt token count for them.
LLAMA_SERVER_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                       "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
LLAMA_SERVER_PROMPT_TOKENS = 27

SAMPLES = [
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))",
    "Numbers: 3.14159, 2024-06-01, 1234567890 and   multiple   spaces\t\ttabs",
    "Ünïcödé — naïve café, 東京, Ελληνικά, emoji 🚀🤗",
    "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure they'll say it's John's, we've done it.  \n\n  trailing  ",
]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    path = default_model_path()
    wrapper, ids = build_tokenizer(read_gguf(path).metadata, str(path))
    return wrapper, ids


def test_smollm2_matches_llama_server_ids(smollm2_tokenizer):
    tok, _ = smollm2_tokenizer
    for text, ids in LLAMA_SERVER_IDS:
        assert tok.encode(text) == ids
        assert tok.decode(ids) == text


def test_smollm2_special_tokens(smollm2_tokenizer):
    tok, ids = smollm2_tokenizer
    assert tok.encode("<|im_start|>user") == [1, 4093]
    assert (ids.bos, ids.eos, ids.add_bos) == (1, 2, False)
    assert tok.eos_token_ids == {0, 2, 4}  # as llama-server's ignore_eos capture bans: 0, 2, 4
    assert tok.decode([1, 4093, 2]) == "<|im_start|>user<|im_end|>"


def test_smollm2_chat_template_is_chatml(smollm2_tokenizer):
    tok, _ = smollm2_tokenizer
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert prompt == LLAMA_SERVER_PROMPT
    assert len(tok.apply_chat_template(MESSAGES, add_generation_prompt=True)) == LLAMA_SERVER_PROMPT_TOKENS


def test_smollm2_streaming_detokenizer_reassembles_text(smollm2_tokenizer):
    tok, _ = smollm2_tokenizer
    for text in SAMPLES:
        detok = tok.detokenizer
        detok.reset()
        for t in tok.encode(text):
            detok.add_token(t)
        detok.finalize()
        assert detok.text == tok.decode(tok.encode(text))


def test_smollm2_matches_transformers_gguf_tokenizer(smollm2_tokenizer):
    """transformers' GGUF tokenizer conversion, an independent implementation."""
    from transformers import AutoTokenizer

    ours, _ = smollm2_tokenizer
    path = default_model_path()
    try:
        ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except ImportError as exc:  # its GGUF path may want torch
        pytest.skip(f"transformers cannot read GGUF tokenizers here: {exc}")
    for text in SAMPLES + [t for t, _ in LLAMA_SERVER_IDS]:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=True), text
        assert ours.decode(ids) == ref.decode(ids)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_tokenizer_equals_its_source(arch, tmp_path, tiny_llama_dir, tiny_qwen_dir):
    hf_dir = tiny_llama_dir if arch == "llama" else tiny_qwen_dir
    ours = load_model(tiny_gguf.write_gguf(hf_dir, tmp_path / "t.gguf")).tokenizer
    ref = load_model(hf_dir).tokenizer
    for text in SAMPLES + tiny_checkpoints.CORPUS:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.decode(ours.encode(text)) == ref.decode(ref.encode(text))
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=True) == ref.apply_chat_template(
        MESSAGES, add_generation_prompt=True)


def test_pre_tokenizer_choice_matters(tmp_path, tiny_qwen_dir):
    """Guard for the test above: the same vocabulary split GPT-2's way encodes differently."""
    path = tiny_gguf.write_gguf(tiny_qwen_dir, tmp_path / "t.gguf")
    meta = dict(read_gguf(path).metadata)
    qwen_split, _ = build_tokenizer(meta, "qwen2")
    meta["tokenizer.ggml.pre"] = "gpt-2"
    gpt2_split, _ = build_tokenizer(meta, "gpt2")
    text = "def add(a, b):\n    return a + b"
    assert qwen_split.encode(text) != gpt2_split.encode(text)


def test_sentencepiece_vocab_from_scores():
    """A tiny SentencePiece-style ('llama') vocabulary: byte fallback, space prefix, merges from scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [
        "▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"]
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    scores[-1], scores[-6] = 10.0, 9.0  # the whole words win over their parts
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    meta = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    tok, ids = build_tokenizer(meta, "spm")
    vocab = {t: i for i, t in enumerate(tokens)}
    assert ids.add_bos  # SentencePiece vocabularies add BOS unless told otherwise
    assert tok.encode("hello world") == [1, vocab["▁hello"], vocab["▁world"]]
    assert tok.encode("hello ü")[:2] == [1, vocab["▁hello"]]
    assert tok.encode("hello ü")[-2:] == [3 + 0xC3, 3 + 0xBC]  # byte fallback for a token not in the vocab
    assert tok.decode(tok.encode("hello world ü"), skip_special_tokens=True) == "hello world ü"
    merges = merges_from_scores(tokens, vocab, scores)
    assert merges[0] == ("▁wor", "ld")  # from the highest-scored token
