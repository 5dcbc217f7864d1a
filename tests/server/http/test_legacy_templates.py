"""The built-in ``--no-jinja`` chat formats against prompts recorded from the real llama-server
(``scripts/record_legacy_templates.py`` -> ``data/legacy_templates.json``): every format name and a
set of Jinja sources it detects formats in, byte for byte. The data file holds everything needed
(the template sources included), so no llama.cpp checkout is required."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxcel.server.http.chat.legacy_templates import NAMES, detect, render

DATA = Path(__file__).parent / "data" / "legacy_templates.json"
RECORDED = json.loads(DATA.read_text()) if DATA.exists() else {}
SOURCES: dict[str, str] = RECORDED.get("__sources__", {})

NAME_CASES = [pytest.param(name, case, id=f"{name}-{i}")
              for name, cases in RECORDED.items() if not name.startswith("__")
              for i, case in enumerate(cases)]
FILE_CASES = [pytest.param(case, id=f"{case['file']}-{i}") for i, case in enumerate(RECORDED.get("__files__", []))]

needs_data = pytest.mark.skipif(not RECORDED, reason=f"{DATA.name} not recorded")


def _check(template: str, case: dict) -> None:
    error = case.get("error")
    if error is not None:
        if error["status"] == "startup" and "not supported" in error["message"]:
            # upstream refused the template at startup: no built-in format matches it
            assert detect(template) is None
            return
        pytest.skip(f"upstream failed otherwise: {error}")
    name = detect(template)
    assert name is not None, "upstream rendered this template but nothing was detected"
    assert render(name, case["messages"], case["add_generation_prompt"]) == case["prompt"]


@needs_data
@pytest.mark.parametrize(("name", "case"), NAME_CASES)
def test_name(name, case):
    _check(name, case)
    if "error" not in case:
        assert detect(name) == name


@needs_data
@pytest.mark.parametrize("case", FILE_CASES)
def test_file(case):
    _check(SOURCES[case["file"]], case)


@needs_data
def test_names_are_upstreams_table():
    """The names upstream accepted, in the order the recorder read them from its table."""
    accepted = [name for name, cases in RECORDED.items()
                if not name.startswith("__") and "error" not in cases[0]]
    assert list(NAMES) == accepted


def test_names():
    assert len(NAMES) == 54
    assert len(set(NAMES)) == len(NAMES)


def test_detect():
    assert detect("This is not a chat template") is None
    assert detect("") is None
    assert detect("dots1") is None  # a format upstream detects but does not name
    assert detect("<|userprompt|>{{ x }}<|endofuserprompt|>") == "dots1"
    assert detect("mistral whatever") == "llama2"  # a source starting with "mistral" is in the [INST] family


def test_unknown_format():
    with pytest.raises(ValueError, match="not supported"):
        render("not-a-format", [{"role": "user", "content": "hi"}], True)


def test_content_is_not_a_format_string():
    messages = [{"role": "user", "content": "{content} {role} {0} {"}]
    assert render("chatml", messages, False) == "<|im_start|>user\n{content} {role} {0} {<|im_end|>\n"
