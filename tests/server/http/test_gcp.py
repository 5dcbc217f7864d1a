"""Google Cloud Vertex AI's prediction protocol (``AIP_MODE=PREDICTION``), against a real server:
the port comes from ``AIP_HTTP_PORT``, ``/predict`` dispatches each instance to the route its
``@requestFormat`` names (alias or path), never streams, keeps the route's own errors and the API
key, and ``AIP_HEALTH_ROUTE`` serves the health check."""

from __future__ import annotations

import httpx
import pytest
from server_process import ServerProcess, free_port

from mlxcel.server.http.api.gcp.routes import request_format

KEY = {"Authorization": "Bearer k"}
CHAT = {"@requestFormat": "chatCompletions", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    port = free_port()
    # --port says something else: AIP_HTTP_PORT wins, as upstream
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "512", "-np", "2", "--api-key", "k", port=port,
                         env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "/ping"})
    with httpx.Client(base_url=proc.url, timeout=60, headers=KEY) as c:
        yield c
    proc.stop()


def test_aliases_are_upstreams():
    assert request_format("/v1/chat/completions") == "chatCompletions"
    assert request_format("/apply-template") == "applyTemplate"
    assert request_format("/slots/{id_slot}") == "slots"
    assert request_format("/completion") == "completion"


def test_instances_go_to_their_routes_in_order(client):
    r = client.post("/predict", json={"instances": [
        CHAT, {"@requestFormat": "/tokenize", "content": "hello world"},
        {**CHAT, "stream": True},  # streaming is turned off, not refused
        {"@requestFormat": "completion", "prompt": "a", "n_predict": 2}]})
    assert r.status_code == 200, r.text
    chat, tokens, unstreamed, completion = r.json()["predictions"]
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["object"] == "chat.completion"
    assert tokens["tokens"] and all(isinstance(t, int) for t in tokens["tokens"])
    assert unstreamed["object"] == "chat.completion"
    assert completion["tokens_predicted"] == 2


def test_bad_instances_get_error_bodies_in_place(client):
    r = client.post("/predict", json={"instances": [1, {"x": 1}, {"@requestFormat": "nope"},
                                                    {"@requestFormat": "completion", "prompt": "a", "top_k": "x"}]})
    assert r.status_code == 200
    errors = [p["error"] for p in r.json()["predictions"]]
    assert [e["code"] for e in errors] == [400, 400, 400, 400]
    assert "JSON object" in errors[0]["message"] and "@requestFormat" in errors[1]["message"]
    assert "no handler registered for @requestFormat: nope" == errors[2]["message"]


@pytest.mark.parametrize("body, needle", [({"x": 1}, "instances"), ({"instances": [{}] * 129}, "maximum size")])
def test_bad_bodies_are_400(client, body, needle):
    r = client.post("/predict", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_the_api_key_still_holds_and_the_health_route_answers(client):
    assert httpx.post(str(client.base_url).rstrip("/") + "/predict", json={"instances": [CHAT]}).status_code == 401
    assert client.get("/ping").json() == {"status": "ok"}
