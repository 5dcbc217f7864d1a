#!/usr/bin/env python
"""Record what the real llama-server prints for its built-in (``--no-jinja``) chat formats, as the
reference for ``server/http/legacy_templates.py``.

For every built-in format name (plus names upstream does not know, which must fail), one
``llama-server -m <SmolLM2 GGUF> --no-jinja --chat-template NAME`` is started in turn and sent a
battery of conversations on ``POST /apply-template`` (with ``add_generation_prompt`` given
explicitly each time). Then the same is done with ``--chat-template-file`` for the Jinja templates
shipped in llama.cpp's ``models/templates`` (one or two per format upstream detects in them, a few it
detects nothing in, and a few synthetic sources), where upstream picks the format from the source.

The output, ``tests/server/http/data/legacy_templates.json``, is self-contained::

    {NAME: [{"messages": [...], "add_generation_prompt": bool, "prompt": str}
            | {..., "error": {"status": int | "startup", "message": str}}],
     "__files__": [{"file": basename, "messages": ..., "add_generation_prompt": ..., "prompt" | "error": ...}],
     "__sources__": {basename: jinja text}}

    ./scripts/build_llama_server.sh        # once: .cache/llama-server/bin/llama-server
    .venv/bin/python scripts/record_legacy_templates.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LLAMA_SERVER = REPO / ".cache" / "llama-server" / "bin" / "llama-server"
UPSTREAM = REPO / ".cache" / "llama-server" / "src" / "llama.cpp"
OUT = REPO / "tests" / "server" / "http" / "data" / "legacy_templates.json"
sys.path.insert(0, str(REPO / "scripts" / "conformance"))

from run import default_model  # noqa: E402  (the built-in SmolLM2 GGUF, found without importing mlxcel)

PORTS = range(18300, 18400)

# names upstream must refuse (llama-server exits at startup)
UNKNOWN_NAMES = ("dots1", "not-a-template", "ChatML")


def _m(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# (messages, add_generation_prompt) for each name
BATTERY: list[tuple[list[dict], bool]] = [
    ([_m("system", "You are a helpful assistant."), _m("user", "Hello!")], True),
    ([_m("user", "Hello!")], True),
    ([_m("system", "Be brief."), _m("user", "Hi"), _m("assistant", "Hello, how can I help?"),
      _m("user", "What is 2+2?")], True),
    ([_m("system", "  \n Be brief.\t\n"), _m("user", "\n  Hi there  \n"), _m("assistant", " Hello! \n\n"),
      _m("user", "\t\vWhy?\f\r ")], True),
    ([_m("user", "one"), _m("assistant", "two"), _m("user", "three"), _m("assistant", "four"),
      _m("user", "five")], True),
    ([_m("system", "Be brief."), _m("user", "Hi"), _m("assistant", "Hello, how can I help?"),
      _m("user", "What is 2+2?")], False),
    ([_m("user", "Hi"), _m("assistant", "Hel")], False),
    ([_m("system", "first"), _m("system", "second"), _m("user", "Hi"), _m("system", "late"),
      _m("user", "again")], True),
    ([_m("system", "sys"), _m("user", "call it"), _m("assistant_tool_call", '[{"name": "f"}]'),
      _m("tool", '{"ok": true}'), _m("function", "fn"), _m("developer", "dev"), _m("narrator", "odd"),
      _m("user", "thanks")], True),
    ([_m("user", "braces {content} {role} %s \\n \u00e9\u4e2d\u6587 \U0001f600"),
      _m("assistant", "")], False),
    ([_m("user", "")], True),
    ([], True),
]

# fewer cases per template file: detection is what these test
FILE_BATTERY = [BATTERY[2], BATTERY[3]]

# from llama.cpp's models/templates: the smallest file for each format detected in them (and
# gpt-oss, whose source upstream patches before use), plus two it detects nothing in
TEMPLATE_FILES = (
    "inclusionai-ling-3.0-flash.jinja", "GLM-4.7-Flash.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "google-gemma-2-2b-it.jinja", "openai-gpt-oss-120b.jinja", "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "ibm-granite-granite-4.0.jinja", "ibm-granite-granite-4.1.jinja", "moonshotai-Kimi-K2.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja", "microsoft-Phi-3.5-mini-instruct.jinja",
    "llama-cpp-rwkv-world.jinja", "ByteDance-Seed-OSS.jinja", "upstage-Solar-Open-100B.jinja",
    "MiniMax-M1.jinja", "GigaChat3-10B-A1.8B.jinja",
)

# sources for formats that no shipped template file triggers, to check detection
SYNTHETIC = {
    "synthetic-dots1.jinja": "{% for m in messages %}<|userprompt|>{{ m['content'] }}<|endofuserprompt|>{% endfor %}",
    "synthetic-mistral-prefix.jinja": "mistral: {{ messages[0]['content'] }}",
    "synthetic-unknown.jinja": "This is not a chat template",
}


def upstream_names() -> list[str]:
    """The names in upstream's LLM_CHAT_TEMPLATES table, in source order."""
    text = (UPSTREAM / "src" / "llama-chat.cpp").read_text()
    table = text[text.index("LLM_CHAT_TEMPLATES = {"):]
    table = table[:table.index("};")]
    return [line.split('"')[1] for line in table.splitlines() if line.strip().startswith('{ "')]


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18300-18399")


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class Server:
    """One llama-server with the given template flag; ``error`` is set when it did not come up."""

    def __init__(self, binary: Path, model: Path, template_args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        cmd = [str(binary), "-m", str(model), "--no-jinja", *template_args, "--port", str(self.port),
               "--host", "127.0.0.1", "-c", "512", "-np", "1", "-t", "1", "--no-warmup"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.error: str | None = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.error = self._startup_message(self.proc.stderr.read())
                return
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        self.error = "timed out waiting for /health"

    @staticmethod
    def _startup_message(stderr: str) -> str:
        lines = stderr.strip().splitlines()
        wanted = [ln for ln in lines if "error" in ln.lower() or "not supported" in ln.lower()]
        return "\n".join(wanted[-4:] or lines[-1:]) or "exited"

    def apply(self, messages: list[dict], add_generation_prompt: bool) -> dict:
        status, body = post(self.url + "/apply-template",
                            {"messages": messages, "add_generation_prompt": add_generation_prompt})
        if status == 200:
            return {"prompt": body["prompt"]}
        message = body.get("error", {}).get("message", "") if isinstance(body.get("error"), dict) else str(body)
        return {"error": {"status": status, "message": message}}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def record(binary: Path, model: Path, template_args: list[str], battery) -> list[dict]:
    server = Server(binary, model, template_args)
    try:
        cases = []
        for messages, gen in battery:
            case = {"messages": messages, "add_generation_prompt": gen}
            if server.error is not None:
                case["error"] = {"status": "startup", "message": server.error}
            else:
                case.update(server.apply(messages, gen))
            cases.append(case)
        return cases
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=LLAMA_SERVER)
    ap.add_argument("--model", type=Path, default=None, help="any GGUF (default: the built-in SmolLM2)")
    ap.add_argument("--templates", type=Path, default=UPSTREAM / "models" / "templates")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    model = args.model or default_model()

    names = upstream_names()
    result: dict[str, object] = {}
    for name in [*names, *UNKNOWN_NAMES]:
        result[name] = record(args.binary, model, ["--chat-template", name], BATTERY)
        outcome = "error: " + result[name][0]["error"]["message"][:80] if "error" in result[name][0] else "ok"
        print(f"{name:20s} {outcome}", file=sys.stderr)

    files = []
    sources = {name: (args.templates / name).read_text() for name in TEMPLATE_FILES}
    sources.update(SYNTHETIC)
    with tempfile.TemporaryDirectory() as tmpdir:
        path = Path(tmpdir) / "template.jinja"
        for name, source in sources.items():
            path.write_text(source)
            for case in record(args.binary, model, ["--chat-template-file", str(path)], FILE_BATTERY):
                files.append({"file": name, **case})
            print(f"{name:60s} {'error' if 'error' in files[-1] else 'ok'}", file=sys.stderr)
    result["__files__"] = files
    result["__sources__"] = sources

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
