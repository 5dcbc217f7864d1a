"""The docs name only what the tree has: every backticked path and symbol of README.md and
docs/*.md resolves to a file, folder, module, class, member or function that exists, and every
relative link leads to a file and heading that exist.

What counts as a name and how each kind resolves is ``tests/helpers/doc_names.py``'s docstring. Two
docs are left out: ``docs/benchmarks-history.md`` is a dated notebook, which names what the tree had
when each section was written; ``docs/llama-server-compat.md`` names upstream llama.cpp's own files
(``unit/test_*.py`` of its server tests, relative to upstream's tree), SDK methods and the API's
headers and values, which no rule could tell from ours without an allow-list as long as its table
(its links are checked). The rules themselves are tested on a small tree built here, so they can
fail whatever the real tree holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_names import stale_names
from markdown_links import anchors, relative_links, slug
from tree_names import index_tree

REPO = Path(__file__).resolve().parents[1]
NOT_CHECKED = {"benchmarks-history.md", "llama-server-compat.md"}
ALL_DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
DOCS = [p for p in ALL_DOCS if p.name not in NOT_CHECKED]


@pytest.fixture(scope="module")
def repo_tree():
    return index_tree(REPO)


def test_the_code_map_is_among_the_checked_docs():
    assert REPO / "docs" / "architecture.md" in DOCS and REPO / "docs" / "benchmarks.md" in DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_name_a_doc_gives_exists(repo_tree, doc):
    stale = stale_names(repo_tree, doc.read_text(encoding="utf-8"))
    assert not stale, f"{doc.relative_to(REPO)} names what the tree no longer has:\n  " + "\n  ".join(stale)


def broken_links(doc: Path) -> list[str]:
    out = []
    for line, target in relative_links(doc.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            out.append(f"line {line}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"line {line}: {target}: no heading with that anchor")
    return out


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(REPO)} links nowhere:\n  " + "\n  ".join(broken)


def test_anchors_are_githubs(tmp_path):
    assert slug("8 clients against llama-server `-np 8`") == "8-clients-against-llama-server--np-8"
    assert slug("8 plain clients against mlx_lm.server") == "8-plain-clients-against-mlx_lmserver"
    assert slug("The decode loop against mlx-lm (`make bench`)") == "the-decode-loop-against-mlx-lm-make-bench"
    target = tmp_path / "t.md"
    target.write_text("# Top\n\n## Grammar masks\n\n## Grammar masks\n\n```\n# not a heading\n```\n")
    assert anchors(target.read_text()) == {"top", "grammar-masks", "grammar-masks-1"}
    doc = tmp_path / "d.md"
    doc.write_text("See [a](t.md#grammar-masks-1), [b](t.md#not-a-heading), [c](gone.md), [d](https://x.org/y#z), "
                   "[e](#here).\n\n## Here\n")
    assert broken_links(doc) == ["line 1: t.md#not-a-heading: no heading with that anchor", "line 1: gone.md: no such file"]


# A tree with one of each kind of thing a doc names.
SMALL_TREE = {
    ".gitignore": "/models/\n/bench-out/\n",
    "engine/__init__.py": "",
    "engine/decode/__init__.py": "",
    "engine/cache/ragged.py": ("RETAIN = 1\n\nclass StepPlan:\n    width: int = 0\n\n"
                                "class RaggedBatch:\n    def __init__(self):\n        self.rows = []\n\n"
                                "    def forward(self, plan):\n        return plan\n\n"
                                "def joinable(cache):\n    return True\n"),
    "engine/speculative/session.py": ("class Base:\n    def record(self):\n        pass\n\n"
                                      "class SpeculativeSession(Base):\n    def round(self):\n        pass\n\n"
                                      "def decide_together(rounds):\n    return rounds\n"),
    "engine/platform/qmatmul_src/layer.cpp": "struct Pool { void run(); };\n",
    "engine/gguf/structure.py": 'SUFFIX = "ForCausalLMNextN"\n',
    "server/runtime/scheduler.py": "class Scheduler:\n    def _ragged_step(self):\n        pass\n",
    "server/http/app.py": "",
    "tests/engine/cache/test_ragged.py": "def test_rows_keep_their_bits():\n    pass\n",
}


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    for rel, text in SMALL_TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return index_tree(root)


def spans(*names: str) -> str:
    return "\n".join(f"Text naming `{n}` in a sentence." for n in names)


EXISTING = ["engine/cache/ragged.py", "cache/ragged.py", "ragged.py", "server/http/", "http/", "qmatmul_src/layer.cpp",
            "engine/cache/ragged.RaggedBatch.forward()", "cache/ragged.joinable", "Scheduler._ragged_step()",
            "cache.ragged", "mlxcel.engine.decode", "ragged.RETAIN", "ragged.StepPlan.width", "session.round()",
            "session.decide_together()", "SpeculativeSession.record", "RaggedBatch.rows", "SpeculativeSession",
            "joinable()", "Pool::run", "ForCausalLMNextN", "TokenizerWrapper",
            "tests/engine/cache/test_ragged.py::test_rows_keep_their_bits", "test_ragged.py::test_rows_keep_their_bits"]

STALE = ["engine/decode/padded.py", "decode/padded.py", "padded.py", "server/grpc/", "qmatmul_src/gone.cpp",
         "engine/cache/ragged.RaggedBatch.backward()", "runtime/task.Task", "Scheduler._verify_batch",
         "decode.padded", "mlxcel.engine.decoder", "ragged.verify_rows", "ragged.StepPlan.height",
         "session.prepare_round()", "SpeculativeSession.decide", "SpeculativeRound", "SpeculativeRound.run",
         "verify_batch()", "Pool::stop", "gone.decide_round()",
         "tests/engine/cache/test_ragged.py::test_gone", "tests/engine/test_padded.py::test_rows"]

NOT_NAMES = ["--spec-type ngram-simple", "-md", "--no-ui", "MLXCEL_AMX=0", "MLXCEL_*", "OPENBLAS_NUM_THREADS",
             "Q4_K", "GET", "POST /v1/chat/completions", "/completion", "/slots/:id", "/tmp/bench.py",
             "~/.cache/mlxcel/", "https://example.com/a.py", '{"n_predict": 8}', "data: [DONE]",
             "stream_options.include_usage", "general.architecture", "timings.draft_n", "model.norm", "draft_n",
             "mx.eval()", "client.chat.completions.parse()", "config.json", "model.gguf", "models/q.gguf",
             "bench-out/final2", ".cache/llama-server/bin/llama-server", "x = decode(y)", "position_key(seed, t)",
             "tok/s", "Q4_0/Q4_1/Q8_0", "text/event-stream", "127.0.0.1", "0.3.21", "std::atomic::wait",
             "…::test_gone", "compat/.../flags.json", "tests/engine/<sub-package>/", "fkernel*", "None",
             "ValueError", "ragged"]


def test_names_that_exist_resolve(small_tree):
    assert stale_names(small_tree, spans(*EXISTING)) == []


@pytest.mark.parametrize("name", STALE)
def test_a_stale_name_is_reported_with_its_line(small_tree, name):
    reported = stale_names(small_tree, "# A doc\n\nIntro.\n\n" + spans(name))
    assert len(reported) == 1 and reported[0].startswith(f"line 5: `{name}`: "), reported


def test_flags_variables_commands_fields_and_snippets_are_not_names(small_tree):
    assert stale_names(small_tree, spans(*NOT_NAMES)) == []


def test_code_blocks_are_not_prose(small_tree):
    text = ("Before.\n\n```sh\nrun `engine/decode/padded.py`\n```\n\n"
            "    `engine/decode/padded.py` in an indented block\n\n"
            "After, a span that wraps: `engine/decode/\npadded.py` (a space inside: not a name), and `padded.py`.\n")
    assert stale_names(small_tree, text) == ["line 10: `padded.py`: no such file or folder"]
