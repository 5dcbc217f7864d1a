"""Each GGUF family's chat template (llama.cpp's copies in ``models/templates``) renders in mlxcel
exactly as llama-server renders it (with the variables both servers pass every template by default:
``enable_thinking`` true), the prompts llama-server gave for the same conversations are
recorded in ``data/family_templates.json`` (``scripts/record_family_templates.py``), and templates that
print today's date see the recording's date. Skipped when the llama.cpp sources are not at hand
(``llama_cpp_sources``); a recorded template whose source has changed is skipped too, saying so."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import llama_cpp_sources
import pytest

from mlxcel.server.http.chat.template import apply_template, normalize_messages

RECORD = json.loads((Path(__file__).parent / "data" / "family_templates.json").read_text(encoding="utf-8"))
MODELS = llama_cpp_sources.models_dir()
# where mlxcel's server knowingly renders differently, and why
KNOWN = {
    "Apertus-8B-Instruct": "upstream passes enable_thinking=false to a template whose reasoning markers it does not "
                           "detect (its 'Deliberation' switch); mlxcel's server passes true unless --reasoning off",
}


class _RecordedDay(datetime.datetime):
    """``datetime`` frozen on the day of the recording (for templates' ``strftime_now``)."""

    @classmethod
    def now(cls, tz=None):
        return cls.fromisoformat(RECORD["recorded_on"] + "T12:00:00")


@pytest.mark.skipif(MODELS is None, reason="llama.cpp's sources are not here (set MLXCEL_LLAMA_CPP_SRC)")
@pytest.mark.parametrize("name", sorted(RECORD["templates"]))
def test_family_template_renders_as_llama_server(name, smollm2_tokenizer, monkeypatch):
    import transformers.utils.chat_template_utils as chat_template_utils

    monkeypatch.setattr(chat_template_utils, "datetime", _RecordedDay)
    if name in KNOWN:
        pytest.xfail(KNOWN[name])
    path = Path(MODELS) / "templates" / f"{name}.jinja"
    source = path.read_text(encoding="utf-8")
    entry = RECORD["templates"][name]
    if hashlib.sha256(source.encode()).hexdigest() != entry["sha256"]:
        pytest.skip(f"{name}.jinja is not the source that was recorded")
    for case in entry["cases"]:
        got = apply_template(smollm2_tokenizer, source, normalize_messages(case["messages"]),
                             add_generation_prompt=True, extra={"enable_thinking": True, **RECORD["kwargs"]})
        assert got == case["prompt"], case["messages"]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from mlxcel.engine.gguf.file import read_gguf
    from mlxcel.engine.gguf.tokenizer import build_tokenizer
    from mlxcel.engine.model.loading import default_model_path

    path = default_model_path()
    return build_tokenizer(read_gguf(path).metadata, str(path))[0]
