"""Build tiny random checkpoints on disk in the real formats, for tests and benchmarks.

- ``build_tokenizer(dir)``: a byte-level BPE ``tokenizer.json`` trained offline on a small corpus,
  with ChatML special tokens, plus ``tokenizer_config.json`` carrying a chat template.
- ``build_hf_checkpoint(dir, arch)``: ``config.json`` + ``model.safetensors`` (Hugging Face tensor
  names) for a llama- or qwen2-style model whose weights come from mlx-lm's own model classes,
  seeded, so every run builds the same checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Speculative decoding proposes tokens with a cheap drafter and verifies them with the target.",
    "Once upon a time there was a little robot who loved to count: one, two, three, four, five.",
    "import numpy as np\nx = np.arange(10)\nfor i in range(10):\n    print(i, x[i] * 2)\n",
    "Hello, world! How are you today? I am fine, thank you. What is your name?",
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n",
]


def build_tokenizer(out: Path, vocab_size: int = 384, extra_special: tuple[str, ...] = ()) -> int:
    """Train a byte-level BPE tokenizer; returns its vocabulary size. ``extra_special``: more
    special tokens after the ChatML ones (e.g. a code model's fill-in-the-middle tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + list(extra_special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "chat_template": CHATML_TEMPLATE,
                "model_max_length": 2048,
            },
            indent=1,
        )
    )
    return tok.get_vocab_size()


def base_config(vocab_size: int, *, layers: int = 2, hidden: int = 64) -> dict:
    """The config keys every tiny decoder shares, whatever its family."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "eos_token_id": 2,  # "<|im_end|>"
        "bos_token_id": None,
        "torch_dtype": "float32",
    }


def tiny_config(arch: str, vocab_size: int, *, layers: int = 2, hidden: int = 64, seed_tag: str = "") -> dict:
    base = {**base_config(vocab_size, layers=layers, hidden=hidden), "tie_word_embeddings": False}
    if arch == "llama":
        base.update(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False, mlp_bias=False)
    elif arch == "qwen2":
        base.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True)
    else:
        raise ValueError(arch)
    return base


def random_params(config: dict, seed: int, head_scale: float = 1.0) -> dict[str, mx.array]:
    """float32 parameters of mlx-lm's model for ``config``, seeded: its own initialisation, with
    the embeddings and output head redrawn from N(0, 1) and N(0, (0.5 * head_scale)^2) so a random
    model's logits are peaked enough to be interesting."""
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    params = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    for name in params:
        if name.endswith("embed_tokens.weight"):
            params[name] = mx.random.normal(params[name].shape)
        elif name.endswith("lm_head.weight"):
            params[name] = mx.random.normal(params[name].shape) * (0.5 * head_scale)
    return params


def build_hf_checkpoint(out: Path, arch: str = "llama", *, seed: int = 0, layers: int = 2, hidden: int = 64,
                        logit_scale: float = 1.0, extra_special: tuple[str, ...] = ()) -> Path:
    """Write a tiny random ``arch`` checkpoint to ``out`` and return ``out``.

    ``logit_scale`` multiplies the output head so distributions are more or less peaked;
    ``extra_special`` adds special tokens to the vocabulary (``build_tokenizer``)."""
    vocab = build_tokenizer(out, extra_special=extra_special)
    config = tiny_config(arch, vocab, layers=layers, hidden=hidden)
    params = random_params(config, seed, head_scale=logit_scale)
    if config.get("tie_word_embeddings"):
        params.pop("lm_head.weight", None)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    return out


def perturbed_copy(src: Path, dst: Path, scale: float, seed: int) -> Path:
    """A drafter that mostly agrees with the checkpoint ``src``: its weights plus seeded noise."""
    import shutil

    shutil.copytree(src, dst, dirs_exist_ok=True)
    weights = mx.load(str(src / "model.safetensors"))
    mx.random.seed(seed)
    noisy = {k: v + scale * mx.random.normal(v.shape) * mx.abs(v).mean() if ".layers." in k else v
             for k, v in weights.items()}
    mx.save_safetensors(str(dst / "model.safetensors"), noisy, metadata={"format": "pt"})
    return dst
