"""``/infill`` on a tiny checkpoint whose vocabulary has Qwen-style FIM tokens: the prompt the
server assembles is compared with llama-server's documented repo-level layout (tools/server/README.md,
"POST /infill"), written out here by hand, tokenized piece by piece with the ``tokenizers``
library itself; and the model-side detection of FIM tokens (vocabulary, GGUF metadata)."""

from __future__ import annotations

import httpx
import pytest
import tiny_checkpoints
import tiny_gguf
from server_process import ServerProcess, load_capture
from tokenizers import Tokenizer

from mlxcel.engine.model.fim_tokens import FimTokens, model_fim_tokens
from mlxcel.server.http.api.native.infill import check_fim, infill_tokens
from mlxcel.server.runtime.errors import ApiError

QWEN_FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|fim_repo|>", "<|file_sep|>")
N_CTX, N_BATCH, N_PREDICT = 256, 128, 16  # the server's -c (one slot), -b and -n: the truncation budget

PREFIX = "#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n"
PROMPT = "    int n_threads = llama_"
SUFFIX = "}\n"
EXTRA = [{"filename": "llama.h", "text": "LLAMA_API int32_t llama_n_threads();\n"}]


@pytest.fixture(scope="module")
def fim_dir(checkpoints_root):
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-fim", "llama", seed=3,
                                                extra_special=QWEN_FIM)


@pytest.fixture(scope="module")
def tok(fim_dir):
    return Tokenizer.from_file(str(fim_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(fim_dir):
    proc = ServerProcess("-m", str(fim_dir), "-c", str(N_CTX), "-np", "1", "-b", str(N_BATCH), "-n", str(N_PREDICT),
                         "--temp", "0")
    yield proc
    proc.stop()


def enc(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def special(tok: Tokenizer, text: str) -> int:
    return tok.token_to_id(text)


def infill(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/infill", json={"n_predict": 4, **body}, timeout=120)


def test_layout_with_extra_context(server, tok):
    r = infill(server, input_extra=EXTRA, input_prefix=PREFIX, prompt=PROMPT, input_suffix=SUFFIX)
    assert r.status_code == 200, r.text
    body = r.json()
    # the README's repo-level pattern, literally
    assert body["prompt"] == ("<|fim_repo|>myproject\n<|file_sep|>llama.h\n" + EXTRA[0]["text"]
                              + "<|file_sep|>filename\n<|fim_prefix|>" + PREFIX + PROMPT
                              + "<|fim_suffix|>" + SUFFIX + "<|fim_middle|>")
    expected = ([special(tok, "<|fim_repo|>"), *enc(tok, "myproject\n"), special(tok, "<|file_sep|>"),
                 *enc(tok, "llama.h\n"), *enc(tok, EXTRA[0]["text"]), special(tok, "<|file_sep|>"),
                 *enc(tok, "filename\n"), special(tok, "<|fim_prefix|>"), *enc(tok, PREFIX), *enc(tok, PROMPT),
                 special(tok, "<|fim_suffix|>"), *enc(tok, SUFFIX), special(tok, "<|fim_middle|>")])
    assert body["tokens_evaluated"] == len(expected)
    assert body["tokens_predicted"] == 4 and body["stop_type"] == "limit"


def test_layout_without_extra_or_prompt(server):
    body = infill(server, input_prefix="def f(", input_suffix="):\n").json()
    assert body["prompt"] == ("<|fim_repo|>myproject\n<|file_sep|>filename\n<|fim_prefix|>def f("
                              "<|fim_suffix|>):\n<|fim_middle|>")


def test_truncation_budget(server, tok):
    """Prefix: its last 3/4 * n_batch tokens; suffix: its first n_batch/4 - 2 - len(prompt);
    extra context: its last n_ctx - n_batch - 2 * n_predict tokens."""
    prefix = "".join(f"x{i} = {i}\n" for i in range(60))
    suffix = "".join(f"print(y{i})\n" for i in range(30))
    extra = [{"filename": f"m{i}.py", "text": f"def g{i}(a, b):\n    return a * {i} + b\n"} for i in range(20)]
    prompt = "z = "
    body = infill(server, input_prefix=prefix, input_suffix=suffix, input_extra=extra, prompt=prompt).json()
    sep, rep = special(tok, "<|file_sep|>"), special(tok, "<|fim_repo|>")
    extra_ids = [rep, *enc(tok, "myproject\n")]
    for chunk in extra:
        extra_ids += [sep, *enc(tok, chunk["filename"] + "\n"), *enc(tok, chunk["text"])]
    extra_ids += [sep, *enc(tok, "filename\n")]
    prefix_ids, suffix_ids, prompt_ids = enc(tok, prefix), enc(tok, suffix), enc(tok, prompt)
    n_prefix = min(len(prefix_ids), 3 * (N_BATCH // 4))
    n_suffix = min(len(suffix_ids), N_BATCH // 4 - 2 - len(prompt_ids))
    n_extra = min(N_CTX - N_BATCH - 2 * N_PREDICT, len(extra_ids))
    assert len(prefix_ids) > n_prefix and len(suffix_ids) > n_suffix and len(extra_ids) > n_extra  # all cut
    expected = [*extra_ids[-n_extra:], special(tok, "<|fim_prefix|>"), *prefix_ids[-n_prefix:], *prompt_ids,
                special(tok, "<|fim_suffix|>"), *suffix_ids[:n_suffix], special(tok, "<|fim_middle|>")]
    assert body["tokens_evaluated"] == len(expected)
    assert body["prompt"] == tok.decode(expected, skip_special_tokens=False)


def test_completion_fields_and_stream(server):
    """/infill takes /completion's fields: here a stream with return_tokens and n_predict."""
    with httpx.stream("POST", server.url + "/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 3,
                                                            "stream": True, "return_tokens": True}, timeout=60) as r:
        assert r.status_code == 200
        text = r.read().decode()
    events = [line for line in text.split("\n\n") if line.startswith("data: ")]
    assert '"stop": true' in events[-1].replace('"stop":true', '"stop": true')


def test_a_prediction_on_infill_drafts_and_is_counted(server):
    """/infill takes a predicted output as /completion does: the middle is the same, its counts come back."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "temperature": 0, "ignore_eos": True}
    plain = infill(server, **body).json()
    r = infill(server, **body, prediction={"type": "content", "content": plain["content"]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"] == plain["content"]
    assert got["accepted_prediction_tokens"] + got["rejected_prediction_tokens"] > 0
    assert "accepted_prediction_tokens" not in plain


@pytest.mark.parametrize("body", [
    {"input_extra": [{}]},
    {"input_extra": [{"filename": "ok"}]},
    {"input_extra": [{"filename": 123}]},
    {"input_extra": [{"filename": 123, "text": "abc"}]},
    {"input_extra": [{"filename": 123, "text": 456}]},
    {"input_extra": {"text": "not an array"}},
    {"prompt": 5},
    {"input_suffix": None, "input_prefix": 3},
])
def test_bad_infill_fields_are_400(server, body):
    r = infill(server, **{"input_prefix": PREFIX, "input_suffix": SUFFIX, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_missing_suffix_is_400(server):
    r = httpx.post(server.url + "/infill", json={"input_prefix": "a"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == '"input_suffix" is required'


def test_spm_and_snippet_layouts(fim_dir, tok):
    """--spm-infill puts the suffix part first; without repo / file-separator tokens each chunk is
    preceded by the plain snippet line and no filename line closes the context."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import AutoTokenizer

    hf = TokenizerWrapper(AutoTokenizer.from_pretrained(str(fim_dir)))  # what a loaded model holds
    pre, suf, mid = (special(tok, t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    plain = FimTokens(pre=pre, suf=suf, mid=mid)
    common = dict(prefix=enc(tok, "int a;"), suffix=enc(tok, "int c;"), prompt=enc(tok, "int b"), n_batch=2048,
                  n_predict=-1, n_ctx=4096, bos=[])
    spm = infill_tokens(hf, plain, extra=[], spm=True, **common)
    assert tok.decode(spm, skip_special_tokens=False) == "<|fim_suffix|>int c;<|fim_prefix|>int a;int b<|fim_middle|>"
    snippet = infill_tokens(hf, plain, extra=[{"text": "x = 1\n"}], spm=False, **common)
    assert tok.decode(snippet, skip_special_tokens=False) == (
        "\n\n--- snippet ---\n\nx = 1\n<|fim_prefix|>int a;int b<|fim_suffix|>int c;<|fim_middle|>")


def test_fim_tokens_from_gguf_metadata(tmp_path):
    """GGUF metadata names the roles even when the token texts are no known spelling; the
    vocabulary search finds the rest."""
    src = tiny_checkpoints.build_hf_checkpoint(tmp_path / "hf", "llama", seed=4,
                                               extra_special=("<a>", "<b>", "<c>", "<fim_pad>"))
    vocab = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab()
    path = tiny_gguf.write_gguf(src, tmp_path / "fim.gguf", extra_metadata={
        "tokenizer.ggml.fim_pre_token_id": vocab["<a>"], "tokenizer.ggml.fim_suf_token_id": vocab["<b>"],
        "tokenizer.ggml.fim_mid_token_id": vocab["<c>"]})
    from mlxcel.engine.model.gguf_loader import load_gguf

    loaded = load_gguf(path)
    fim = model_fim_tokens(loaded.tokenizer, loaded.vocab_size, loaded.metadata["token_ids"])
    assert (fim.pre, fim.suf, fim.mid, fim.pad) == (vocab["<a>"], vocab["<b>"], vocab["<c>"], vocab["<fim_pad>"])
    assert fim.rep is None and fim.sep is None and fim.missing() == ""


def test_no_fim_tokens_is_upstreams_501():
    with pytest.raises(ApiError) as err:
        check_fim(FimTokens(mid=7))
    assert err.value.status == 501
    assert err.value.body()["error"] == load_capture("err_infill").json()["error"] | {
        "message": "Infill is not supported by this model: prefix token is missing. suffix token is missing. "}
    with pytest.raises(ApiError) as err:
        check_fim(None)
    assert err.value.body() == load_capture("err_infill").json()
