"""Bodies that describe the server and its model: ``/props``, ``/v1/models``, ``/slots``."""

from __future__ import annotations

import time

from mlxcel.server.http.formats.openai import SYSTEM_FINGERPRINT
from mlxcel.server.http.formats.settings import slot_params
from mlxcel.server.http.media import MEDIA_MARKER
from mlxcel.server.runtime.slots import Slot
from mlxcel.server.runtime.task import GenerationOptions

CREATED = int(time.time())


def _ftype(loaded) -> str:
    meta = loaded.metadata or {}
    return str(meta.get("ftype") or meta.get("file_type") or ("F32" if loaded.source == "mlx" else ""))


def props(state) -> dict:
    loaded = state.loaded
    tokenizer = loaded.tokenizer
    bos = loaded.bos_token_id
    eos = sorted(loaded.eos_token_ids)
    default_params = slot_params(state.default_options())
    return {
        "default_generation_settings": {"params": default_params, "n_ctx": state.scheduler.n_ctx},
        "total_slots": len(state.scheduler.slots),
        "model_alias": state.model_name,
        "model_ftype": _ftype(loaded),
        "model_path": str(state.config.model or loaded.path),
        "modalities": {"vision": loaded.vision is not None, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": state.config.slots,
        "endpoint_props": state.config.props,
        "endpoint_metrics": state.config.metrics,
        "ui": bool(state.config.ui),
        "ui_settings": {},
        "chat_template": state.template or "",
        "chat_template_caps": dict(state.template_info.caps) or {
            "supports_object_arguments": False, "supports_parallel_tool_calls": False,
            "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
            "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": False,
            "supports_tools": False, "supports_typed_content": False,
        },
        "bos_token": tokenizer.convert_ids_to_tokens(bos) if bos is not None else "",
        "eos_token": tokenizer.convert_ids_to_tokens(eos[0]) if eos else "",
        "build_info": SYSTEM_FINGERPRINT,
        "is_sleeping": False,
        "cors_proxy_enabled": bool(state.config.ui_mcp_proxy),
    }


def models(state) -> dict:
    loaded = state.loaded
    name = state.model_name
    config = loaded.config or {}
    n_params = state.n_params
    return {
        "models": [{
            "name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "parameters": "",
            "capabilities": ["completion", "multimodal"] if loaded.vision is not None else ["completion"],
            "details": {"parent_model": "", "format": loaded.source, "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
        "object": "list",
        "data": [{
            "id": name,
            "aliases": list(state.aliases),
            "tags": list(state.tags),
            "object": "model",
            "architecture": {"input_modalities": ["text", "image"] if loaded.vision is not None else ["text"],
                             "output_modalities": ["text"]},
            "created": CREATED,
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": loaded.vocab_size,
                "n_ctx": state.scheduler.n_ctx,
                "n_ctx_train": loaded.context_length,
                "n_embd": int(config.get("hidden_size") or 0),
                "n_params": int(n_params),
                "size": int(n_params) * 4,
                "ftype": _ftype(loaded),
            },
        }],
    }


def slot_json(slot: Slot, default: GenerationOptions, speculative: bool = False) -> dict:
    body = {"id": slot.id, "n_ctx": slot.n_ctx, "speculative": speculative, "is_processing": slot.busy}
    run = slot.run
    if run is not None:
        step = run.last_step
        if step is not None:  # the row's last shared verify forward: its rows and tokens, this row's drafts
            body["speculative_step"] = dict(step)
        info = {"id_task": run.task.id, "n_prompt_tokens": len(run.prompt),
                "n_prompt_tokens_processed": run.n_past - run.cache_n, "n_prompt_tokens_cache": run.cache_n,
                "options": run.opts, "n_decoded": len(run.generated), "has_new_line": "\n" in run.text}
    else:
        info = {**slot.last_task, "n_decoded": 0} if slot.last_task else {}  # an idle slot decodes nothing
    if info:
        opts = info["options"]
        n_remain = -1 if opts.n_predict < 0 else max(opts.n_predict - info["n_decoded"], 0)
        body.update({
            "id_task": info["id_task"],
            "n_prompt_tokens": info["n_prompt_tokens"],
            "n_prompt_tokens_processed": info["n_prompt_tokens_processed"],
            "n_prompt_tokens_cache": info["n_prompt_tokens_cache"],
            "params": slot_params(opts),
            "next_token": [{"has_next_token": run is not None, "has_new_line": info["has_new_line"],
                            "n_remain": n_remain if run is not None else -1, "n_decoded": info["n_decoded"]}],
        })
    return body
