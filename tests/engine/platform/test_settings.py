"""``engine/platform/settings.py``: every ``MLXCEL_*`` switch parsed and checked once, a bad value one
error naming its variable; the module stays light; no other product module reads a switch itself;
and ``docs/settings.md`` lists exactly the switches the tree reads, with each ``Settings`` field's
default and kind. The scanners are tried on planted sources first, so each check can fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from switch_names import doc_tables, native_names, python_names, shell_names, stray_reads

from mlxcel.engine.platform import settings as settings_module
from mlxcel.engine.platform.settings import (
    KINDS,
    SWITCHES,
    Settings,
    SettingsError,
    from_environ,
    set_switches,
    settings,
    switched,
    value_in,
    variable,
)

REPO = Path(__file__).resolve().parents[3]
PRODUCT = ("engine", "drafters", "server")
SETTINGS_PY = REPO / "engine" / "platform" / "settings.py"
# reads keyed by a loop variable over other programs' variables (mlx.launch's), file by file
ALLOWED_KEYS = {REPO / "engine" / "distributed" / "world.py": frozenset({"name"})}
KERNEL_SOURCES = REPO / "engine" / "platform" / "qmatmul_src"
SHELL_SOURCES = [REPO / "Makefile", REPO / "docker" / "Dockerfile", *(REPO / "scripts").glob("*.sh"),
                 REPO / "scripts" / "with-blas"]
DOC = REPO / "docs" / "settings.md"
SWITCH_TABLE = "The switches"
REMOVED_TABLE = "Removed"


# -- parsing ----------------------------------------------------------------------------------------

def test_unset_and_empty_are_the_defaults():
    assert from_environ({}) == Settings()
    assert from_environ({f.metadata["var"]: "  " for f in SWITCHES}) == Settings()
    s = Settings()
    assert (s.weights, s.cpu_kernels, s.unified_step, s.lockstep_stall_s, s.exactness_probe, s.fault_inject) == \
        (None, True, True, 120.0, "auto", ())


@pytest.mark.parametrize("var,text,field,want", [
    ("MLXCEL_WEIGHTS", "Q", "weights", "quantized"),
    ("MLXCEL_WEIGHTS", "dequantize", "weights", "float32"),
    ("MLXCEL_DTYPE", "BF16", "dtype", "bfloat16"),
    ("MLXCEL_FUSED_OPS", "Off", "fused_ops", False),
    ("MLXCEL_SPECULATIVE_ACCEPT_DIAG", " yes ", "speculative_accept_diag", True),
    ("MLXCEL_BLAS_PRELOADED", "1", "blas_preloaded", True),
    ("MLXCEL_LOG", "WARN", "log", "warning"),
    ("MLXCEL_OPENBLAS_CORETYPE", "Keep", "openblas_coretype", "keep"),
    ("MLXCEL_OPENBLAS_CORETYPE", "Zen", "openblas_coretype", "Zen"),
    ("MLXCEL_GRAMMAR_THREADS", "0", "grammar_threads", 1),  # at least one, as the reader always took it
    ("MLXCEL_MAX_CONNECTIONS_PER_IP", "-3", "max_connections_per_ip", 0),
    ("MLXCEL_MAX_QUEUE", "0", "max_queue", 1),
    ("MLXCEL_LOCKSTEP_STALL_S", "2.5", "lockstep_stall_s", 2.5),
    ("MLXCEL_VERIFY_COST", "25, 6.4", "verify_cost", (25.0, 6.4)),
    ("MLXCEL_VERIFY_COST", "none", "verify_cost", "off"),
    ("MLXCEL_VERIFY_COST", "LEARN", "verify_cost", "learn"),
    ("MLXCEL_EXACTNESS_PROBE", "PASS", "exactness_probe", "pass"),
    ("MLXCEL_FAULT_INJECT", "prefill:a b,forward:c", "fault_inject", (("prefill", "a b"), ("forward", "c"))),
])
def test_each_switch_reads_its_spellings(var, text, field, want):
    assert variable(field) == var
    assert getattr(from_environ({var: text}), field) == want


@pytest.mark.parametrize("var,text", [
    ("MLXCEL_UNIFIED_STEP", "maybe"), ("MLXCEL_FUSED_LAYER", "2"), ("MLXCEL_WEIGHTS", "int4"),
    ("MLXCEL_DTYPE", "float64"), ("MLXCEL_LOG", "verbose"), ("MLXCEL_MAX_QUEUE", "lots"),
    ("MLXCEL_MAX_CONNECTIONS_PER_IP", "1.5"), ("MLXCEL_GRAMMAR_THREADS", "all"), ("MLXCEL_LOCKSTEP_STALL_S", "0"),
    ("MLXCEL_LOCKSTEP_STALL_S", "nan"), ("MLXCEL_OPENBLAS_CORETYPE", "Skylake X"), ("MLXCEL_VERIFY_COST", "25"),
    ("MLXCEL_VERIFY_COST", "-1,2"), ("MLXCEL_VERIFY_COST", "inf,1"), ("MLXCEL_EXACTNESS_PROBE", "maybe"),
    ("MLXCEL_FAULT_INJECT", "decode:x"), ("MLXCEL_FAULT_INJECT", "prefill"),
    ("MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT", "2"),
])
def test_a_bad_value_is_one_error_naming_the_variable(var, text):
    with pytest.raises(SettingsError) as error:
        from_environ({var: text})
    assert str(error.value).startswith(f"{var}={text!r}: ")


def test_every_field_is_a_documented_kind_with_a_meaning():
    assert len({f.metadata["var"] for f in SWITCHES}) == len(SWITCHES)
    for f in SWITCHES:
        assert f.metadata["var"].startswith("MLXCEL_") and f.metadata["kind"] in KINDS, f.name
        assert len(f.metadata["meaning"]) > 20, f.name


# -- read once, read again on purpose ---------------------------------------------------------------

def test_read_once_then_again_when_asked(monkeypatch):
    monkeypatch.delenv("MLXCEL_UNIFIED_STEP", raising=False)
    first = settings()
    assert settings() is first and first.unified_step is True
    os.environ["MLXCEL_UNIFIED_STEP"] = "0"  # behind monkeypatch's back: not seen until a re-read
    try:
        assert settings() is first
        assert settings_module.reload().unified_step is False
    finally:
        del os.environ["MLXCEL_UNIFIED_STEP"]
    assert settings_module.reload().unified_step is True
    monkeypatch.setenv("MLXCEL_RUN_AHEAD", "off")  # the suite's monkeypatch re-reads
    assert settings().run_ahead is False


def test_set_switches_writes_the_environment_and_reads_it_again(monkeypatch):
    monkeypatch.delenv("MLXCEL_WEIGHTS", raising=False)
    monkeypatch.delenv("MLXCEL_MAX_CONNECTIONS_PER_IP", raising=False)
    with switched(weights="quantized", max_connections_per_ip=0) as inside:
        assert inside is settings() and (inside.weights, inside.max_connections_per_ip) == ("quantized", 0)
        assert os.environ["MLXCEL_WEIGHTS"] == "quantized"  # the processes started now inherit it
    assert "MLXCEL_WEIGHTS" not in os.environ and settings().weights is None
    with pytest.raises(SettingsError, match="MLXCEL_DTYPE"):
        set_switches(weights="float32", dtype="float64")
    assert "MLXCEL_WEIGHTS" not in os.environ and settings().weights is None  # nothing changed


def test_a_childs_environment_is_read_one_switch_at_a_time():
    child = {"MLXCEL_OPENBLAS_CORETYPE": "keep", "MLXCEL_UNIFIED_STEP": "maybe"}
    assert value_in(child, "openblas_coretype") == "keep"  # the bad switch beside it is the child's to refuse
    with pytest.raises(SettingsError, match="MLXCEL_UNIFIED_STEP"):
        value_in(child, "unified_step")


def test_the_module_imports_nothing_heavy():
    code = ("import sys; import mlxcel.engine.platform.settings as s; s.settings(); "
            "print(sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# -- nobody else reads a switch ---------------------------------------------------------------------

def test_the_read_scanner_finds_every_way_in():
    planted = "\n".join([
        "import os",
        "from os import environ",
        "a = os.environ.get('MLXCEL_X', '1')",
        "b = os.getenv(NAME)",
        "c = os.environ[key]",
        "d = os.environ.setdefault(f'MLXCEL_{kind}', '0')",
        "e = prefix in os.environ",
        "f = dict(os.environ, MLXCEL_Y='1')",
        "g = {'MLXCEL_': 1}",
    ])
    found = stray_reads(planted)
    assert sorted(f.split(":")[0] for f in found if "not a literal" in f) == ["4", "5", "6", "7"], found
    assert {f.split(":")[0] for f in found} == {"2", "3", "4", "5", "6", "7", "8", "9"}, found
    clean = "import os\nh = os.environ.get('HOME', '')\nfor name in VARS:\n    os.environ.get(name)\n"
    assert stray_reads(clean, frozenset({"name"})) == []


def test_no_product_module_reads_a_switch_itself():
    stray = []
    for top in PRODUCT:
        for path in sorted((REPO / top).rglob("*.py")):
            if path == SETTINGS_PY or ".venv" in path.parts:
                continue
            found = stray_reads(path.read_text(encoding="utf-8"), ALLOWED_KEYS.get(path, frozenset()))
            stray += [f"{path.relative_to(REPO)}:{f}" for f in found]
    assert not stray, "read the switch through engine/platform/settings.py:\n  " + "\n  ".join(stray)


# -- the docs table ---------------------------------------------------------------------------------

def tree_names() -> dict[str, str]:
    """Every MLXCEL_* name the tree reads or sets, and one place it does."""
    names = {f.metadata["var"]: "engine/platform/settings.py" for f in SWITCHES}
    for path in sorted(KERNEL_SOURCES.glob("*.[ch]*")):
        names.update(dict.fromkeys(native_names(path.read_text(encoding="utf-8")), str(path.relative_to(REPO))))
    for path in [*sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py")), REPO / "setup.py"]:
        names.update(dict.fromkeys(python_names(path.read_text(encoding="utf-8")), str(path.relative_to(REPO))))
    for path in SHELL_SOURCES:
        if path.exists():
            names.update(dict.fromkeys(shell_names(path.read_text(encoding="utf-8")), str(path.relative_to(REPO))))
    return names


def table_mismatches(tree: dict[str, str], tables: dict[str, dict[str, list[str]]]) -> list[str]:
    listed = {name for title, rows in tables.items() if title != REMOVED_TABLE for name in rows}
    out = [f"{name} (read in {where}) is not in docs/settings.md" for name, where in sorted(tree.items())
           if name not in listed]
    out += [f"docs/settings.md lists {name}, which nothing reads" for name in sorted(listed - set(tree))]
    out += [f"{name} is listed as removed, but {tree[name]} still names it"
            for name in sorted(set(tables.get(REMOVED_TABLE, {})) & set(tree))]
    return out


def test_the_table_check_finds_a_missing_and_a_stale_row():
    doc = ("## The switches\n\n| variable | default | kind | meaning |\n|---|---|---|---|\n"
           "| `MLXCEL_A` | on | user | a |\n| `MLXCEL_OLD` | on | user | gone |\n\n"
           "## Removed\n\n| variable | what | why |\n|---|---|---|\n| `MLXCEL_GONE` | x | y |\n")
    tree = dict.fromkeys(python_names("mode = os.environ.get('MLXCEL_A')"), "x.py")
    tree.update(dict.fromkeys(python_names("env = dict(os.environ, MLXCEL_NEW='1')"), "t.py"))
    tree.update(dict.fromkeys(native_names('int n = env_int("MLXCEL_K", 3);'), "k.cpp"))
    tree.update(dict.fromkeys(shell_names("MLXCEL_GONE=1 make"), "Makefile"))
    assert table_mismatches(tree, doc_tables(doc)) == [
        "MLXCEL_GONE (read in Makefile) is not in docs/settings.md",
        "MLXCEL_K (read in k.cpp) is not in docs/settings.md",
        "MLXCEL_NEW (read in t.py) is not in docs/settings.md",
        "docs/settings.md lists MLXCEL_OLD, which nothing reads",
        "MLXCEL_GONE is listed as removed, but Makefile still names it",
    ]


def test_the_docs_table_lists_exactly_the_switches_the_tree_reads():
    mismatches = table_mismatches(tree_names(), doc_tables(DOC.read_text(encoding="utf-8")))
    assert not mismatches, "\n".join(mismatches)


def shown(default) -> str:
    """How the table's default column starts for a field's default."""
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or default == ():
        return "unset"
    if isinstance(default, str):
        return f"`{default}`"
    return f"{default:g}" if isinstance(default, float) else str(default)


def test_the_settings_table_is_the_settings_class():
    rows = doc_tables(DOC.read_text(encoding="utf-8"))[SWITCH_TABLE]
    assert list(rows) == [f.metadata["var"] for f in SWITCHES], "the table's rows in the class's order"
    for f in SWITCHES:
        default, kind, _meaning = rows[f.metadata["var"]]
        assert default.startswith(shown(f.default)), (f.name, default)
        assert kind == f.metadata["kind"], (f.name, kind)
