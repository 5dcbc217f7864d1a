"""Write docs/gguf-architectures.md: what each GGUF architecture does in mlxcel, measured.

    .venv/bin/python scripts/gguf_arch_table.py [--llama-cpp-src DIR] [--out docs/gguf-architectures.md]

Per ``general.architecture`` (every row is run, not claimed):

- layout: whether the test suite's GGUF writer lays each tiny checkpoint out exactly as llama.cpp's
  ``convert_hf_to_gguf.py`` does (``scripts/check_gguf_layout.py``, recorded in
  ``docs/data/gguf-layout-check.json``: tensor names, shapes, values and ``{arch}.*`` metadata);
- loads / logits: the tiny random model of the test suite (``tests/helpers/tiny_archs``), written as
  llama.cpp's converter lays it out (``gguf_convert``), loaded, and compared with mlx-lm's logits
  on the same weights (max |difference| over a 40-token prompt; greedy tokens through the cache);
- tokenizer: the pre-tokenizers that family's files carry, each checked against llama.cpp's own
  tokenizer cases (``ggml-vocab-*.gguf``) when the llama.cpp sources are given, and the real files
  compared with llama-server (``docs/data/gguf-vs-llama-server.json``, from
  ``scripts/compare_gguf_llama_server.py``);
- chat template: the family's templates from llama.cpp's ``models/templates`` rendered by mlxcel
  (system + user + assistant + user, with the generation prompt), and where recorded, equal to
  llama-server's ``/apply-template`` (``docs/data/templates-vs-llama-server.json``);
- speculation: prompt lookup and a draft model (the model drafting for itself) run greedily on
  the tiny model and must give plain decoding's tokens; a kind refused for the model's caches is
  listed with the reason. MTP and DFlash-family drafters need their own checkpoints: not run here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "helpers")]

# family notes: which models write this architecture, and the pre-tokenizers / templates their files carry
FAMILIES: dict[str, dict] = {
    "llama": {"models": "Llama 1-3.3, Mistral 7B / Nemo / Small, Mixtral, SmolLM 1-2, CodeLlama",
              "pre": ["llama-spm", "llama-bpe", "smollm", "tekken"],
              "templates": ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                            "meta-llama-Llama-3.3-70B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
                            "Mistral-Small-3.2-24B-Instruct-2506", "unsloth-mistral-Devstral-Small-2507",
                            "mistralai-Ministral-3-14B-Reasoning-2512", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B"]},
    "qwen2": {"models": "Qwen 1.5 / 2 / 2.5 (+ Coder, Math), DeepSeek-R1-Distill-Qwen",
              "pre": ["qwen2", "deepseek-r1-qwen"],
              "templates": ["Qwen-Qwen2.5-7B-Instruct", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"]},
    "qwen3": {"models": "Qwen3 dense", "pre": ["qwen2"], "templates": ["Qwen-Qwen3-0.6B"]},
    "qwen2moe": {"models": "Qwen1.5-MoE, Qwen2-57B-A14B", "pre": ["qwen2"], "templates": []},
    "qwen3moe": {"models": "Qwen3-30B-A3B / 235B-A22B, Qwen3-Coder", "pre": ["qwen2"], "templates": ["Qwen3-Coder"]},
    "qwen3next": {"models": "Qwen3-Next-80B-A3B", "pre": ["qwen2"], "templates": []},
    "qwen35": {"models": "Qwen3.5 dense", "pre": ["qwen35"], "templates": ["Qwen3.5-4B"]},
    "qwen35moe": {"models": "Qwen3.5 MoE", "pre": ["qwen35"], "templates": []},
    "gemma": {"models": "Gemma, CodeGemma", "pre": ["gemma (SPM)"], "templates": []},
    "gemma2": {"models": "Gemma 2", "pre": ["gemma-2 (SPM)"], "templates": ["google-gemma-2-2b-it"]},
    "gemma3": {"models": "Gemma 3 (text)", "pre": ["gemma (SPM)"], "templates": []},
    "gemma3n": {"models": "Gemma 3n (text tower)", "pre": ["gemma (SPM)"], "templates": []},
    "phi3": {"models": "Phi-3, Phi-3.5, Phi-4-mini", "pre": ["phi-3 (SPM)", "gpt-4o"],
             "templates": ["microsoft-Phi-3.5-mini-instruct"]},
    "deepseek2": {"models": "DeepSeek V2 / V2.5 / V3 / R1, GigaChat 3 (Kimi K2: pre-tokenizer refused)",
                  "pre": ["deepseek-llm", "deepseek-v3", "gigachat"],
                  "templates": ["deepseek-ai-DeepSeek-V3.1", "GigaChat3-10B-A1.8B"]},
    "gpt-oss": {"models": "gpt-oss-20b / 120b", "pre": ["gpt-4o"], "templates": ["openai-gpt-oss-120b"]},
    "olmo2": {"models": "OLMo 2, OLMo 3", "pre": ["dbrx", "olmo"], "templates": []},
    "granite": {"models": "Granite 3.x dense", "pre": ["refact", "gpt-2"],
                "templates": ["ibm-granite-granite-3.3-2B-Instruct"]},
    "granitemoe": {"models": "Granite 3.x MoE", "pre": ["refact", "gpt-2"], "templates": []},
    "starcoder2": {"models": "StarCoder 2", "pre": ["starcoder"], "templates": []},
    "lfm2": {"models": "LFM2, LFM2.5", "pre": ["lfm2"], "templates": ["LFM2.5-Instruct"]},
    "smollm3": {"models": "SmolLM3", "pre": ["llama-bpe"], "templates": ["HuggingFaceTB-SmolLM3-3B"]},
    "seed_oss": {"models": "Seed-OSS", "pre": ["seed-coder"], "templates": ["ByteDance-Seed-OSS"]},
    "olmoe": {"models": "OLMoE", "pre": ["olmo"], "templates": []},
    "ernie4_5": {"models": "ERNIE 4.5 dense", "pre": ["SPM"], "templates": []},
    "exaone4": {"models": "EXAONE 4.0", "pre": ["exaone4"], "templates": []},
}
# the llama.cpp vocabulary test file that checks a pre-tokenizer name, where one exists
VOCAB_FILES = {"llama-spm": "llama-spm", "llama-bpe": "llama-bpe", "qwen2": "qwen2", "qwen35": "qwen35",
               "deepseek-llm": "deepseek-llm", "starcoder": "starcoder", "refact": "refact", "gpt-2": "gpt-2",
               "phi-3 (SPM)": "phi-3", "command-r": "command-r", "mpt": "mpt", "falcon": "falcon",
               "deepseek-coder": "deepseek-coder"}
CHAT = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "What is 2 + 2?"}]


def tiny_rows(root: Path) -> dict[str, list[dict]]:
    import gguf_convert
    import mlx.core as mx
    import tiny_archs
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel.engine.model.loading import load_model

    prompt = [(7 * i + 3) % 380 + 3 for i in range(40)]
    rows: dict[str, list[dict]] = {}
    for case_id, case in tiny_archs.CASES.items():
        row = {"case": case_id, "model_type": None}
        try:
            hf = tiny_archs.build(case, root / case_id, seed=11)
            path = gguf_convert.convert(hf, root / f"{case_id}.gguf", case.gguf_arch)
            ours = load_model(path)
            ref = tiny_archs.reference_model(case, hf)
            a = ours.model(mx.array([prompt]))[0].astype(mx.float32)
            b = ref(mx.array([prompt]))[0].astype(mx.float32)
            row.update(model_type=ours.config["model_type"], loads=True, max_diff=float(mx.abs(a - b).max().item()))
            row["greedy_equal"] = _greedy(ours.model, prompt, ours.make_cache()) == _greedy(ref, prompt,
                                                                                             make_prompt_cache(ref))
            other = tiny_archs.build(case, root / f"{case_id}-draft", seed=12)
            draft = load_model(gguf_convert.convert(other, root / f"{case_id}-draft.gguf", case.gguf_arch))
            row["speculation"] = _speculation(ours, draft, prompt)
        except Exception as exc:  # a row that fails says so in the table
            row.update(loads=False, error=f"{type(exc).__name__}: {exc}"[:200])
        rows.setdefault(case.gguf_arch, []).append(row)
        print(f"  {case_id}: {row.get('max_diff', row.get('error'))}", flush=True)
    return rows


def _greedy(model, ids, cache, n=8):
    import mlx.core as mx

    out, x = [], mx.array([ids])
    for _ in range(n):
        nxt = int(mx.argmax(model(x, cache=cache)[0, -1]).item())
        out.append(nxt)
        x = mx.array([[nxt]])
    return out


def _speculation(lm, draft, prompt) -> dict[str, str]:
    """Prompt lookup, and a draft model (another random model of the same family, so some drafts
    are rejected and both caches are rewound), each against plain decoding's tokens."""
    from target_only import speculative_tokens, target_only_tokens

    from mlxcel.drafters.draft_model import DraftModelDrafter
    from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
    from mlxcel.engine.sampling.params import SamplerParams

    params = SamplerParams(temperature=0.0, seed=1)
    repeated = prompt[:12] * 4  # something prompt lookup finds again
    plain = target_only_tokens(lm, repeated, params, 24)
    out = {}
    for name, make in (("prompt-lookup", lambda: PromptLookupDrafter(1, 3)),
                       ("draft-model", lambda: DraftModelDrafter(draft, target_vocab_size=lm.vocab_size))):
        try:
            tokens, counters = speculative_tokens(lm, make(), repeated, params, 24, k=4)
            if tokens != plain:
                out[name] = "WRONG (differs from plain decoding)"
            else:
                rejected = counters.proposed - counters.accepted
                out[name] = (f"exact ({counters.accepted}/{counters.proposed} drafts accepted"
                             + (", none rejected: no rewind tried)" if rejected == 0 else ")"))
        except Exception as exc:
            out[name] = f"refused: {exc}"[:160]
    return out


def vocab_results(models: Path | None) -> dict[str, str]:
    if models is None:
        return {}
    from mlxcel.engine.gguf.file import read_gguf
    from mlxcel.engine.gguf.tokenizer import build_tokenizers_object

    out = {}
    for name, stem in VOCAB_FILES.items():
        path = models / f"ggml-vocab-{stem}.gguf"
        if not path.is_file():
            continue
        tok, _ = build_tokenizers_object(read_gguf(path).metadata, path.name)
        texts = (models / f"{path.name}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        want = [line.strip() for line in (models / f"{path.name}.out").read_text(encoding="utf-8").split("\n")]
        ok = sum(tok.encode(t, add_special_tokens=False).ids == [int(x) for x in w.split()] for t, w in zip(texts, want))
        out[name] = f"{ok}/{len(texts)}"
    return out


def template_results(models: Path | None) -> dict[str, str]:
    if models is None:
        return {}
    import tiny_checkpoints

    from mlxcel.server.http.chat.template import apply_template

    with tempfile.TemporaryDirectory() as d:
        tiny_checkpoints.build_tokenizer(Path(d))
        from mlx_lm.tokenizer_utils import TokenizerWrapper
        from transformers import PreTrainedTokenizerFast

        tok = TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_file=str(Path(d) / "tokenizer.json"),
                                                       bos_token="<|endoftext|>", eos_token="<|im_end|>"))
        out = {}
        for fam in FAMILIES.values():
            for name in fam["templates"]:
                path = models / "templates" / f"{name}.jinja"
                if not path.is_file():
                    continue
                try:
                    text = apply_template(tok, path.read_text(encoding="utf-8"), CHAT, add_generation_prompt=True,
                                          extra={"date_string": "26 Jul 2024"})
                    out[name] = "renders" if "What is 2 + 2?" in text else "renders, drops a message"
                except Exception as exc:
                    out[name] = f"fails: {exc}"[:120]
    return out


def _recorded(name: str) -> dict:
    path = REPO / "docs" / "data" / name
    return json.loads(path.read_text()) if path.is_file() else {}


def render(rows, vocab, templates, real, recorded_templates, layout, models_dir) -> str:
    from mlxcel.engine.gguf.architectures import ARCHITECTURES

    lines = [
        "# GGUF architectures in mlxcel",
        "",
        "What a llama.cpp GGUF file of each `general.architecture` does in mlxcel, measured by",
        "`scripts/gguf_arch_table.py` (see its docstring for how each column is obtained; rerun it after a change).",
        f"Generated {time.strftime('%Y-%m-%d')}; llama.cpp sources for the tokenizer and template columns: "
        f"{'yes' if models_dir else 'not given (columns say so)'}.",
        "",
        "| architecture | models | mlx-lm class | test file = convert_hf_to_gguf.py's | loads, logits vs mlx-lm (max abs diff), greedy | tokenizer | chat templates | speculation (greedy, tiny model) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arch in ARCHITECTURES:
        fam = FAMILIES.get(arch, {"models": "", "pre": [], "templates": []})
        cases = rows.get(arch, [])
        classes = ", ".join(sorted({c["model_type"] for c in cases if c.get("model_type")})) or "—"
        logits = "; ".join(
            (f"{c['case']}: yes, {c['max_diff']:.1e}, {'same' if c['greedy_equal'] else 'DIFFERENT'}" if c.get("loads")
             else f"{c['case']}: NO ({c.get('error')})") for c in cases) or "not tested"
        layouts = [f"{c['case']}: {layout.get(c['case'], 'not checked')}" for c in cases]
        layouts += [f"{k}: {v}" for k, v in layout.items() if ":" in k and k.split(":")[0] in {c["case"] for c in cases}]
        toks = []
        for pre in fam["pre"]:
            toks.append(f"{pre}: {vocab[pre]} llama.cpp cases" if pre in vocab else f"{pre}")
        for fname, rec in real.items():
            if rec.get("architecture") == arch:
                ok = sum(c["ok"] for c in rec["tokenize"])
                greedy = sum(g["agree"] for g in rec["greedy"])
                toks.append(f"**{fname}: /tokenize {ok}/{len(rec['tokenize'])} = llama-server; greedy {greedy}/"
                            f"{sum(g['of'] for g in rec['greedy'])} tokens agree (see below)**")
        temps = []
        for t in fam["templates"]:
            status = templates.get(t, "not checked")
            if t in recorded_templates:
                r = recorded_templates[t]
                status += f", {r['equal']}/{r['cases']} conversations = llama-server's /apply-template"
            temps.append(f"{t}: {status}")
        temps = temps or ["the file's own (Jinja)"]
        spec = cases[0].get("speculation", {}) if cases else {}
        specs = "; ".join(f"{k}: {v}" for k, v in spec.items()) or "—"
        lines.append(f"| `{arch}` | {fam['models']} | {classes} | {'; '.join(layouts)} | {logits} | "
                     f"{'; '.join(toks) or '—'} | {'; '.join(temps)} | {specs} |")
    lines += ["", "## Known differences from llama-server", "",
              "- `gemma2`: mlx-lm's gemma2 attends over the whole context; llama.cpp uses a 4096-token sliding window on "
              "every other layer. The two are the same computation up to the window, so a Gemma 2 file is served with "
              "its context capped at the window (a warning says so at load).",
              "- `phi3` LongRoPE: mlx-lm rotates with the long factors at every length, as llama-server does with its "
              "default context (the trained one); llama-server started with `-c` at or below the original context "
              "would use the short factors.",
              "- Speculation on recurrent layers (`lfm2`, `qwen3next`, `qwen35`, `qwen35moe`): a rejected draft needs the "
              "recurrent state rewound, which mlxcel refuses rather than approximates; on sliding-window layers "
              "(`gemma3`, `gemma3n`, `gpt-oss`, `olmo2` with OLMo 3's windows) a draft model's own cache cannot rewind "
              "once the window has wrapped. The speculation column shows where each happens on the tiny models "
              "(windows of 8 tokens; real windows are 512-4096).",
              "- Gemma 3 scales the embeddings by sqrt(hidden) rounded to bfloat16 in mlx-lm (as in the reference "
              "implementation); llama.cpp uses the exact value. The real-file comparison below includes that.",
              "- A GGUF's MTP / NextN layers (Qwen3-Next, Qwen3.5) are not run: `--draft-kind mtp` reads them from a "
              "Hugging Face checkpoint.",
              "- Quantized weights stay quantized: on a CPU in mlxcel's own kernel blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K "
              "and Q6_K as stored, other types re-packed to Q8_0), on the MLX-native path (Metal, CUDA) as MLX's "
              "quantized weights, exactly or re-quantized per type ([below](#quantized-weights-on-the-mlx-native-path)); "
              "the resident size is logged at load.", "",
              "## Real files against llama-server", "",
              "`scripts/compare_gguf_llama_server.py` (llama-server built from the pinned llama.cpp sources, "
              "`-t 1 -np 1`): `/tokenize` over a battery of texts with and without `add_special`, and greedy "
              "continuations of five prompts (16 tokens) on llama-server's own prompt ids. Where the two first "
              "differ, the margin between the two candidates is given from both sides, with the largest "
              "log-probability disagreement of the two implementations before that point.", ""]
    if not real:
        lines.append("Not recorded yet.")
    for fname, rec in real.items():
        ok = sum(c["ok"] for c in rec["tokenize"])
        lines.append(f"### {fname} (`{rec['architecture']}` -> {rec['model_type']}, pre-tokenizer "
                     f"`{rec['tokenizer_pre']}`, {rec['weight_mib']} MiB resident, loads in {rec['load_s']} s)")
        lines.append("")
        lines.append(f"- `/tokenize`: {ok} of {len(rec['tokenize'])} cases equal")
        for c in rec["tokenize"]:
            if not c["ok"]:
                lines.append(f"  - differs: {c['text']!r} (add_special {c['add_special']})")
        for g in rec["greedy"]:
            d = g["first_divergence"]
            if d is None:
                lines.append(f"- greedy {g['prompt'][:40]!r}: {g['agree']}/{g['of']} tokens agree")
            else:
                lines.append(f"- greedy {g['prompt'][:40]!r}: first {g['agree']} of {g['of']} agree; then ours "
                             f"{d['ours_piece']!r} vs llama-server {d['llama_server_piece']!r}: margin "
                             f"{d['our_margin']:.3f} logits (ours), {d['llama_server_margin'] if d['llama_server_margin'] is None else round(d['llama_server_margin'], 3)} "
                             f"(llama-server); largest disagreement before {g['max_logprob_disagreement']:.3f}; "
                             f"{'explained by the implementations’ rounding' if d['explained'] else 'NOT explained'}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp-src", type=Path, help="llama.cpp source tree (for models/ and models/templates)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "gguf-architectures.md")
    args = ap.parse_args()
    import llama_cpp_sources

    models = (args.llama_cpp_src / "models") if args.llama_cpp_src else llama_cpp_sources.models_dir()
    with tempfile.TemporaryDirectory() as d:
        rows = tiny_rows(Path(d))
    vocab = vocab_results(models)
    templates = template_results(models)
    text = render(rows, vocab, templates, _recorded("gguf-vs-llama-server.json"),
                  _recorded("templates-vs-llama-server.json"), _recorded("gguf-layout-check.json"), models)
    args.out.write_text(text + _kept_section(args.out, QUANT_SECTION))
    print(f"wrote {args.out}")


QUANT_SECTION = "## Quantized weights on the MLX-native path"


def _kept_section(path: Path, heading: str) -> str:
    """The section under ``heading`` of the file at ``path``, carried over when the file is
    written again (``scripts/measure_gguf_mlx_error.py`` measures it; this script does not)."""
    text = path.read_text() if path.exists() else ""
    start = text.find(heading)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end + 1]


if __name__ == "__main__":
    main()
