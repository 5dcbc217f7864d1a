"""Schemathesis over the server's own OpenAPI document (``GET /openapi.json``, ``server/http/openapi.py``)
against a real server: no 5xx, every response has a documented status, content type and body
schema, and every schema-violating body (wrong types, missing required fields, wrong methods) is
refused with a 4xx. Both schema-valid and schema-violating requests are sent.

The default suite runs a short, derandomized slice (``MLXCEL_FUZZ_EXAMPLES``, default 8 examples per
operation and mode); ``make fuzz`` runs 150 per operation. The server runs with ``-n 4 -c 256`` so
that any generated request finishes quickly.
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from server_process import ServerProcess

from mlxcel.server.http.api.server_info.openapi import document

EXAMPLES = int(os.environ.get("MLXCEL_FUZZ_EXAMPLES", "8"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]

schema = schemathesis.openapi.from_dict(document())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
SEEN = {"requests": 0, "5xx": 0}


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "2", "-c", "256", "-n", "4", "--props")
    yield proc
    print(f"\nfuzz: {SEEN}")
    proc.stop()


def test_the_served_document_is_the_fuzzed_one(server):
    assert httpx.get(server.url + "/openapi.json", timeout=10).json() == document()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 20,
          suppress_health_check=list(HealthCheck))
def test_no_5xx_and_responses_match_the_document(case, server):
    response = case.call(base_url=server.url, timeout=60)
    SEEN["requests"] += 1
    SEEN["5xx"] += response.status_code >= 500
    case.validate_response(response, checks=CHECKS)
