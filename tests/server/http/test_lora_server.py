"""LoRA adapters through real servers (``--lora``, ``--lora-scaled``, ``--lora-init-without-apply``,
``/lora-adapters``, a request's ``lora``), on a tiny Q8_0 GGUF (the packed CPU kernels: a row's bits
do not depend on the batch) with a GGUF adapter and an mlx-lm adapter directory written as
``convert_lora_to_gguf.py`` and ``mlx_lm.lora`` write them (``tests/helpers/tiny_lora.py``).

Three servers: the base model alone; the model with both adapters, speculating with prompt lookup
(so the adapters' verify rows are tested beside plain ones); the same two adapters loaded without
being applied."""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import tiny_gguf
import tiny_lora
from concurrent_requests import concurrently, metric
from gguf import GGMLQuantizationType as Q
from server_process import ServerProcess, post_ok, run_server_command, running

N = 24
PROMPT = "The quick brown fox jumps over the lazy dog."
REPEATS = "a b c d e f g a b c d e f g a b c d e f g a b c"  # prompt lookup drafts from here on
BOTH = [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]  # the adapted server's global scales
NONE = [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 0.9, "seed": 42, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@pytest.fixture(scope="module")
def files(tiny_llama_dir, checkpoints_root):
    root = checkpoints_root / "server-lora"
    root.mkdir(exist_ok=True)
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    a = tiny_lora.random_factors(config, tiny_lora.EVERY_LINEAR, rank=4, seed=11, magnitude=0.2)
    b = {**tiny_lora.random_factors(config, tiny_lora.ATTENTION, rank=2, seed=12, magnitude=0.3),
         **tiny_lora.head_factors(config, seed=13)}
    wide = tiny_lora.random_factors({**config, "hidden_size": 96}, tiny_lora.ATTENTION, rank=2, seed=14)
    return {"model": tiny_gguf.write_gguf(tiny_llama_dir, root / "q8.gguf", tiny_gguf.uniform(Q.Q8_0)),
            "a": tiny_lora.write_gguf_adapter(tiny_llama_dir, root / "a.gguf", a, alpha=8.0, dtype=Q.F16),
            "b": tiny_lora.write_mlx_adapter(root / "b", b, scale=2.0),
            "wide": tiny_lora.write_gguf_adapter(tiny_llama_dir, root / "wide.gguf", wide)}


@pytest.fixture(scope="module")
def servers(files):
    model = ("-m", str(files["model"]), "-np", "8", "-ub", "16", "--metrics", "--slots")
    adapters = ("--lora", str(files["a"]), "--lora-scaled", f"{files['b']}:0.5")
    # no cost model: a row drafts whatever prompt lookup proposes, so verify rows run in every forward
    with running(base=partial(ServerProcess, *model),
                 adapted=partial(ServerProcess, *model, *adapters, "--spec-type", "ngram-simple",
                                 env={"MLXCEL_VERIFY_COST": "off"}),
                 deferred=partial(ServerProcess, *model, *adapters, "--lora-init-without-apply")) as procs:
        yield procs


def complete(server, prompt=PROMPT, lora=None, **fields) -> dict:
    body = {"prompt": prompt, "n_predict": N, "ignore_eos": True, "return_tokens": True, "cache_prompt": False,
            "n_probs": 2, **GREEDY, **fields}
    if lora is not None:
        body["lora"] = lora
    return post_ok(server, "/completion", body)


def scales(server) -> list[float]:
    return [a["scale"] for a in httpx.get(server.url + "/lora-adapters", timeout=10).json()]


def test_get_and_post_lora_adapters_round_trip(servers, files):
    s = servers["adapted"]
    listed = httpx.get(s.url + "/lora-adapters", timeout=10).json()
    assert listed == [{"id": 0, "path": str(files["a"]), "scale": 1.0, "task_name": "", "prompt_prefix": ""},
                      {"id": 1, "path": str(files["b"]), "scale": 0.5, "task_name": "", "prompt_prefix": ""}]
    assert httpx.get(servers["base"].url + "/lora-adapters", timeout=10).json() == []
    with_globals = complete(s)["tokens"]
    assert with_globals == complete(s, lora=BOTH)["tokens"]  # a request that lists none runs at the global ones
    try:
        r = httpx.post(s.url + "/lora-adapters", json=[{"id": 1, "scale": 0.25}], timeout=10)
        assert r.status_code == 200 and r.json() == {"success": True}
        assert scales(s) == [0.0, 0.25]  # an adapter the body leaves out goes to 0, as upstream
        assert complete(s)["tokens"] == complete(s, lora=[{"id": 1, "scale": 0.25}])["tokens"] != with_globals
    finally:
        httpx.post(s.url + "/lora-adapters", json=BOTH, timeout=10)
    assert scales(s) == [1.0, 0.5] and complete(s)["tokens"] == with_globals


def test_a_request_scale_changes_the_output_under_the_same_seed(servers):
    s = servers["adapted"]
    for sampling in (GREEDY, SEEDED):
        outputs = [complete(s, lora=[{"id": 0, "scale": x}], **sampling)["tokens"] for x in (0.0, 0.5, 1.0)]
        assert len({tuple(o) for o in outputs}) == 3, sampling
        again = complete(s, lora=[{"id": 0, "scale": 0.5}], **sampling)["tokens"]
        assert again == outputs[1]


def test_scale_zero_is_the_base_model_exactly(servers):
    # tokens and reported probabilities: the base server's, the adapters all at 0
    for sampling in (GREEDY, SEEDED):
        base = complete(servers["base"], **sampling)
        zero = complete(servers["adapted"], lora=NONE, **sampling)
        assert zero["tokens"] == base["tokens"]
        assert zero["completion_probabilities"] == base["completion_probabilities"]


def test_init_without_apply_loads_at_scale_zero(servers):
    deferred, adapted, base = servers["deferred"], servers["adapted"], servers["base"]
    assert scales(deferred) == [0.0, 0.0]
    assert complete(deferred)["tokens"] == complete(base)["tokens"]
    assert complete(deferred, lora=BOTH)["tokens"] == complete(adapted)["tokens"]
    try:
        assert httpx.post(deferred.url + "/lora-adapters", json=BOTH, timeout=10).json() == {"success": True}
        assert complete(deferred)["tokens"] == complete(adapted)["tokens"]
    finally:
        httpx.post(deferred.url + "/lora-adapters", json=NONE, timeout=10)


MIX = [None, NONE, [{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}], [{"id": 0, "scale": 0.3}],
       [{"id": 0, "scale": 0.7}, {"id": 1, "scale": 2.0}], [{"id": 1, "scale": -0.5}], BOTH]


def mixed_bodies() -> list[dict]:
    """Eight requests, each with its own adapter mix: odd ones seeded, even ones greedy; half
    speculating on a repetitive prompt, half plain."""
    bodies = []
    for i, lora in enumerate(MIX):
        body = {"prompt": REPEATS if i % 4 < 2 else PROMPT + f" {i}", "n_predict": N, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False, **(SEEDED if i % 2 else GREEDY)}
        if i % 2:
            body["seed"] = 100 + i
        if i % 3 == 0:
            body["speculative.n_max"] = 0
        if lora is not None:
            body["lora"] = lora
        bodies.append(body)
    return bodies


def test_rows_with_different_adapters_share_forwards_and_equal_each_alone(servers):
    s = servers["adapted"]
    bodies = mixed_bodies()
    alone = [post_ok(s, "/completion", b)["tokens"] for b in bodies]
    steps, rows = metric(s.url, "mlxcel:verify_steps_total"), metric(s.url, "mlxcel:verify_rows_total")
    together = concurrently(s.url, bodies)
    assert [r["tokens"] for r in together] == alone
    d_steps = metric(s.url, "mlxcel:verify_steps_total") - steps
    d_rows = metric(s.url, "mlxcel:verify_rows_total") - rows
    assert d_steps > 0 and d_rows / d_steps > 1.5, (d_steps, d_rows)  # the rows really shared forwards


def test_speculation_with_an_adapter_equals_plain_decoding(servers):
    s = servers["adapted"]
    for sampling in (GREEDY, SEEDED):
        for lora in ([{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.5}]):
            drafted = complete(s, REPEATS, lora, n_probs=0, **sampling)  # (n_probs would decline speculation)
            plain = complete(s, REPEATS, lora, n_probs=0, **sampling, **{"speculative.n_max": 0})
            assert drafted["timings"].get("draft_n", 0) > 0, "prompt lookup drafted nothing"
            assert drafted["tokens"] == plain["tokens"], (sampling, lora)


def test_a_slot_reuses_its_cached_prompt_only_at_the_same_scales(servers):
    s, base = servers["adapted"], servers["base"]
    body = {"id_slot": 3, "cache_prompt": True}
    complete(s, lora=[{"id": 0, "scale": 1.0}], **body)
    other = complete(s, lora=NONE, **body)
    assert other["timings"]["cache_n"] == 0  # the cache holds another model's keys and values
    assert other["tokens"] == complete(base)["tokens"]
    same = complete(s, lora=NONE, **body)
    assert same["timings"]["cache_n"] > 0 and same["tokens"] == other["tokens"]


@pytest.mark.parametrize("lora, needle", [
    ([{"id": 2, "scale": 1.0}], "Field 'lora': Error: invalid adapter id 2"),
    ([{"id": -1, "scale": 1.0}], "invalid adapter id -1"),
    (5, "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
    ([{"id": 0}], "must be an array of objects"),
    ([{"id": "0", "scale": 1}], "must be an array of objects"),
    ([{"id": 0, "scale": "1"}], "must be an array of objects"),
])
def test_bad_lora_lists_are_400s(servers, lora, needle):
    s = servers["adapted"]
    r = httpx.post(s.url + "/completion", json={"prompt": "hi", "n_predict": 2, "lora": lora}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert needle in r.json()["error"]["message"], r.text
    if isinstance(lora, list):
        r = httpx.post(s.url + "/lora-adapters", json=lora, timeout=10)
        assert r.status_code == 400, r.text
    assert scales(s) == [1.0, 0.5]  # nothing changed


def test_post_lora_adapters_refuses_what_is_not_an_array(servers):
    for server in (servers["adapted"], servers["base"]):
        r = httpx.post(server.url + "/lora-adapters", json={"id": 0, "scale": 1}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "Request body must be an array"
    r = httpx.post(servers["base"].url + "/lora-adapters", json=[{"id": 0, "scale": 1}], timeout=10)
    assert r.status_code == 400 and "no LoRA adapter is loaded" in r.json()["error"]["message"]
    assert httpx.post(servers["base"].url + "/lora-adapters", json=[], timeout=10).json() == {"success": True}


def test_an_adapter_for_another_model_ends_the_start(files):
    proc = run_server_command("-m", str(files["model"]), "--lora", str(files["wide"]), "--port", "0")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "incorrect shape (hint: maybe wrong base model?)" in proc.stderr and "Traceback" not in proc.stderr
