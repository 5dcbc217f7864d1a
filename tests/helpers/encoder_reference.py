"""A float64 numpy reference for the tiny BERT-family checkpoints of ``tiny_encoders``, written from
the Hugging Face models' own definitions (BertModel, RobertaForSequenceClassification, nomic-ai's
NomicBertModel, jinaai's JinaBertModel) and reading their Hugging Face tensor names, so it shares
nothing with mlxcel's encoder: not the GGUF names, not llama.cpp's formulas (exact erf GELU here,
ALiBi slopes by the recursive rule of the ALiBi paper, RoBERTa positions from ``pad_token_id + 1``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _linear(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    y = x @ w[f"{name}.weight"].T
    return y + w[f"{name}.bias"] if f"{name}.bias" in w else y


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head: int, bias: np.ndarray | None = None) -> np.ndarray:
    t, h = q.shape
    d = h // n_head
    qh, kh, vh = (z.reshape(t, n_head, d).transpose(1, 0, 2) for z in (q, k, v))
    scores = qh @ kh.transpose(0, 2, 1) / math.sqrt(d)
    if bias is not None:
        scores = scores + bias
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    return (probs @ vh).transpose(1, 0, 2).reshape(t, h)


def _weights(weights: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v.astype(np.float64) for k, v in weights.items() if k.startswith(prefix)}


def bert_hidden(weights: dict, config: dict, ids: list[int]) -> np.ndarray:
    """BertModel's (or RobertaModel's) last hidden state ``[T, H]``, token types all 0."""
    prefix = "roberta." if any(k.startswith("roberta.") for k in weights) else ""
    w = _weights(weights, prefix)
    eps, n_head = config["layer_norm_eps"], config["num_attention_heads"]
    start = config["pad_token_id"] + 1 if prefix == "roberta." else 0  # RoBERTa numbers positions from pad + 1
    positions = np.arange(start, start + len(ids))
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
         + w["embeddings.position_embeddings.weight"][positions])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (_linear(w, f"{p}attention.self.{m}", x) for m in ("query", "key", "value"))
        a = _linear(w, f"{p}attention.output.dense", _attention(q, k, v, n_head))
        x = layer_norm(a + x, w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"], eps)
        f = _linear(w, f"{p}output.dense", gelu(_linear(w, f"{p}intermediate.dense", x)))
        x = layer_norm(f + x, w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"], eps)
    return x


def _rotate(x: np.ndarray, n_head: int, base: float) -> np.ndarray:
    """Rotary embedding over halves of each head (rotary_emb_interleaved = false)."""
    t, h = x.shape
    d = h // n_head
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    angles = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    xh = x.reshape(t, n_head, d)
    half = np.concatenate([-xh[..., d // 2:], xh[..., :d // 2]], -1)
    return (xh * cos[:, None] + half * sin[:, None]).reshape(t, h)


def nomic_hidden(weights: dict, config: dict, ids: list[int]) -> np.ndarray:
    """NomicBertModel (post-norm, rotary, SwiGLU ``fc11(x) * silu(fc12(x))``) ``[T, H]``."""
    w = _weights(weights, "")
    eps, n_head, base = config["layer_norm_epsilon"], config["n_head"], config["rotary_emb_base"]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w["emb_ln.weight"], w["emb_ln.bias"], eps)
    for i in range(config["n_layer"]):
        p = f"encoder.layers.{i}."
        q, k, v = np.split(_linear(w, f"{p}attn.Wqkv", x), 3, axis=-1)
        a = _linear(w, f"{p}attn.out_proj", _attention(_rotate(q, n_head, base), _rotate(k, n_head, base), v, n_head))
        x = layer_norm(a + x, w[f"{p}norm1.weight"], w[f"{p}norm1.bias"], eps)
        f = _linear(w, f"{p}mlp.fc2", _linear(w, f"{p}mlp.fc11", x) * silu(_linear(w, f"{p}mlp.fc12", x)))
        x = layer_norm(f + x, w[f"{p}norm2.weight"], w[f"{p}norm2.bias"], eps)
    return x


def alibi_slopes(n: int) -> np.ndarray:
    """The ALiBi paper's slopes: a geometric series for a power of two, else the closest power's
    series and every other slope of twice that many."""
    def power_of_two(k: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start ** i for i in range(k)]

    if math.log2(n).is_integer():
        return np.array(power_of_two(n))
    closest = 2 ** math.floor(math.log2(n))
    return np.array(power_of_two(closest) + power_of_two(2 * closest)[0::2][: n - closest])


def jina_hidden(weights: dict, config: dict, ids: list[int]) -> np.ndarray:
    """JinaBertModel (ALiBi, symmetric distances; GLU feed-forward ``gelu(first half) * second half``)."""
    w = _weights(weights, "")
    eps, n_head, ff = config["layer_norm_eps"], config["num_attention_heads"], config["intermediate_size"]
    t = len(ids)
    distance = np.abs(np.arange(t)[None, :] - np.arange(t)[:, None])
    bias = -alibi_slopes(n_head)[:, None, None] * distance[None]
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (_linear(w, f"{p}attention.self.{m}", x) for m in ("query", "key", "value"))
        a = _linear(w, f"{p}attention.output.dense", _attention(q, k, v, n_head, bias))
        x = layer_norm(a + x, w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"], eps)
        g = _linear(w, f"{p}mlp.gated_layers", x)
        f = _linear(w, f"{p}mlp.wo", gelu(g[:, :ff]) * g[:, ff:])
        x = layer_norm(f + x, w[f"{p}mlp.layernorm.weight"], w[f"{p}mlp.layernorm.bias"], eps)
    return x


HIDDEN = {"bert": bert_hidden, "roberta": bert_hidden, "nomic-bert": nomic_hidden, "jina-bert-v2": jina_hidden}


def embedding(kind: str, weights: dict, config: dict, ids: list[int], pooling: str) -> np.ndarray:
    """sentence-transformers' pooled embedding (mean or CLS), L2-normalised."""
    hidden = HIDDEN[kind](weights, config, ids)
    v = hidden.mean(0) if pooling == "mean" else hidden[0]
    return v / np.linalg.norm(v)


def classifier_score(kind: str, weights: dict, config: dict, ids: list[int], labelled: bool) -> float:
    """What llama-server scores a sequence classifier with, on the first token: RoBERTa's dense +
    tanh + out_proj; BERT's lone projection as it is when the model has labels (the converter
    stores it as the output layer); a lone projection without labels (jina-reranker-v1) stored as
    the dense layer, whose tanh llama.cpp applies."""
    cls = HIDDEN[kind](weights, config, ids)[0]
    w = {k: v.astype(np.float64) for k, v in weights.items() if k.startswith("classifier.")}
    if "classifier.dense.weight" in w:
        return float(_linear(w, "classifier.out_proj", np.tanh(_linear(w, "classifier.dense", cls)))[0])
    out = _linear(w, "classifier", cls)
    return float(out[0] if labelled else np.tanh(out)[0])
