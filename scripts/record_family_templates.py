"""Record llama-server's rendering of each model family's chat template, for the test that keeps
mlxcel's rendering equal to it.

    .venv/bin/python scripts/record_family_templates.py --llama-server PATH --llama-cpp-src DIR

For every family template in llama.cpp's ``models/templates`` (the list ``FAMILY_TEMPLATES``, the
families mlxcel reads from GGUF), llama-server is started with SmolLM2 (small and quick to load),
``--jinja --chat-template-file T``, and asked ``/apply-template`` for a few conversations (a lone user
turn; system + user; a system, user, assistant, user exchange; a developer turn). The answers go
to ``tests/server/http/data/family_templates.json`` (the template's sha256 beside them, so the test
knows it renders the same source); the comparison with mlxcel's rendering of the same requests,
to ``docs/data/templates-vs-llama-server.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
FAMILY_TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506", "unsloth-mistral-Devstral-Small-2507",
    "mistralai-Ministral-3-14B-Reasoning-2512", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "Qwen-Qwen2.5-7B-Instruct", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen-Qwen3-0.6B",
    "Qwen3-Coder", "Qwen3.5-4B", "google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct",
    "deepseek-ai-DeepSeek-V3.1", "GigaChat3-10B-A1.8B", "openai-gpt-oss-120b", "ibm-granite-granite-3.3-2B-Instruct",
    "LFM2.5-Instruct", "HuggingFaceTB-SmolLM3-3B", "ByteDance-Seed-OSS", "Apertus-8B-Instruct",
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
]
KWARGS = {"date_string": "26 Jul 2024"}
# what mlxcel-server passes every template when started as llama-server is here (startup.template_kwargs)
SERVER_DEFAULTS = {"enable_thinking": True}
DATA = REPO / "tests" / "server" / "http" / "data" / "family_templates.json"
SUMMARY = REPO / "docs" / "data" / "templates-vs-llama-server.json"


def record(binary: str, model: str, template: Path, port: int) -> list[dict]:
    log = open(f"/tmp/llama-server-tmpl-{port}.log", "wb")
    proc = subprocess.Popen([binary, "-m", model, "-c", "512", "-np", "1", "-t", "1", "--jinja", "--chat-template-file",
                             str(template), "--host", "127.0.0.1", "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                return [{"messages": m, "error": f"llama-server exited ({proc.returncode})"} for m in CONVERSATIONS]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not start")
            time.sleep(0.3)
        cases = []
        for messages in CONVERSATIONS:
            r = httpx.post(f"http://127.0.0.1:{port}/apply-template", timeout=60,
                           json={"messages": messages, "chat_template_kwargs": KWARGS})
            case = {"messages": messages}
            case.update({"prompt": r.json()["prompt"]} if r.status_code == 200 else {"error": r.text[:300]})
            cases.append(case)
        return cases
    finally:
        proc.terminate()
        proc.wait(30)


def ours(template: str, cases: list[dict]) -> list[str | None]:
    sys.path.insert(0, str(REPO))
    from mlxcel.engine.model.loading import load_model
    from mlxcel.server.http.chat.template import apply_template, normalize_messages

    global _LOADED
    if "_LOADED" not in globals():
        _LOADED = load_model(None)
    out = []
    for case in cases:
        try:
            out.append(apply_template(_LOADED.tokenizer, template, normalize_messages(case["messages"]),
                                      add_generation_prompt=True, extra={**SERVER_DEFAULTS, **KWARGS}))
        except Exception as exc:
            out.append(f"<error: {exc}>")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--llama-cpp-src", type=Path, required=True)
    ap.add_argument("--port", type=int, default=18290)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from mlxcel.engine.model.loading import default_model_path

    model = str(default_model_path())
    data, summary = {}, {}
    for name in FAMILY_TEMPLATES:
        path = args.llama_cpp_src / "models" / "templates" / f"{name}.jinja"
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        cases = record(args.llama_server, model, path, args.port)
        mine = ours(source, cases)
        recorded = [c for c in cases if "prompt" in c]
        equal = sum(1 for c, m in zip(cases, mine) if "prompt" in c and c["prompt"] == m)
        data[name] = {"sha256": hashlib.sha256(source.encode()).hexdigest(), "cases": recorded}
        summary[name] = {"cases": len(recorded), "equal": equal,
                         "differ": [{"messages": c["messages"], "llama_server": c["prompt"], "mlxcel": m}
                                    for c, m in zip(cases, mine) if "prompt" in c and c["prompt"] != m]}
        print(f"{name}: {equal}/{len(recorded)} equal" + ("" if len(recorded) == len(cases) else
                                                          f" ({len(cases) - len(recorded)} refused by llama-server)"))
    DATA.write_text(json.dumps({"kwargs": KWARGS, "recorded_on": time.strftime("%Y-%m-%d"), "templates": data},
                               indent=1, ensure_ascii=False))
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
