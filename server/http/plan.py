"""A completion request, validated once into a :class:`CompletionPlan`.

Every completion-style route parses its body here and nowhere else: the body's types
(``schema``), the prompt or the chat messages rendered through the template (``prompts``,
``chat.template``), the context and prompt limits, the number of choices, and the sampler and
options merged over the server's defaults (``request_params``). Every range check of a completion
request happens in this module or the ones it calls; routes and response formats hold none. What
comes out is everything the pipeline needs to open tasks and a response format needs to shape
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxcel.engine.sampling.grammar import LARK
from mlxcel.engine.vision.prompt import PromptMedia
from mlxcel.server.http.chat import reasoning
from mlxcel.server.http.chat.output import ChatParsing
from mlxcel.server.http.chat.template import apply_template, normalize_messages
from mlxcel.server.http.chat.tool_calls import call_grammar, check_tools, history_messages
from mlxcel.server.http.grammar_fields import after_reasoning, constrain, request_grammar
from mlxcel.server.http.media import MarkersOnly, MediaCollector, multimodal_images
from mlxcel.server.http.prompts import (
    PROMPT_FORMS,
    check_tokens,
    least_tokens,
    split_prompts,
    tokenize_media_prompt,
    tokenize_prompt,
)
from mlxcel.server.http.request_params import check_unsupported, generation_options, prediction_tokens
from mlxcel.server.http.schema import (
    INT_MAX,
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    check_number_fields,
    check_range,
    validate,
)
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import context_exceeded, context_exceeded_at_least, invalid
from mlxcel.server.runtime.task import GenerationOptions


@dataclass
class CompletionPlan:
    """A validated completion request.

    ``prompts`` holds one token list per prompt; the request runs ``n`` completions of each, task
    ``p * n + k`` being the ``k``-th completion of prompt ``p``. ``rendered`` is a chat request's
    prompt text (the template's output), which the verbose body echoes."""

    prompts: list[list[int]]
    options: GenerationOptions
    n: int
    t_arrival: float
    rendered: str | None = None
    logprobs: bool = False  # an OpenAI body carries logprobs
    top_n: int | None = None  # chat: top_logprobs
    include_usage: bool = False  # stream_options.include_usage
    response_fields: list[str] | None = None  # native: only these fields of each body
    verbose: bool = False  # chat: __verbose carries the native body
    echo: bool = False  # OpenAI completions: the prompt's text before each completion
    chat: ChatParsing | None = None  # chat: what to read out of the output (reasoning, tool calls)
    media: list[PromptMedia | None] = field(default_factory=list)  # per prompt: its images (None: text only)

    @property
    def stream(self) -> bool:
        return self.options.stream

    def prompt_of(self, index: int) -> list[int]:
        """The prompt of task ``index``."""
        return self.prompts[index // self.n]

    def media_of(self, index: int) -> PromptMedia | None:
        """The images of task ``index``'s prompt (None: a text prompt)."""
        p = index // self.n
        return self.media[p] if p < len(self.media) else None


def most_at_once(state: ServerState) -> int:
    """Completions this server can hold at once (slots plus --max-queue); a request asking for
    more could never be queued, so it is refused 400, not 503."""
    return state.limits.max_queue + len(state.scheduler.slots)


def prompt_tokens(state: ServerState, prompt: Any) -> list[int]:
    """One prompt (any form upstream accepts) as token ids, refused when it cannot fit."""
    n_ctx = state.scheduler.n_ctx
    least = least_tokens(prompt, state.piece_chars)
    if least >= n_ctx:
        raise context_exceeded_at_least(least, n_ctx)
    return _fits(state, tokenize_prompt(state.loaded, prompt))


def prompt_input(state: ServerState, prompt: Any, images: list | None = None) -> tuple[list[int], PromptMedia | None]:
    """One prompt as token ids and its images: a chat prompt's (``images``, read from its messages), a
    ``/completion`` prompt object's ``multimodal_data``, or none."""
    if isinstance(prompt, dict) and "multimodal_data" in prompt and state.loaded.vision is not None:
        text = prompt.get("prompt_string")
        if not isinstance(text, str):
            raise invalid(PROMPT_FORMS)
        collector = MediaCollector(state.loaded.vision, state.config.media_path)
        multimodal_images(prompt, collector)
        prompt, images = text, collector.images
    if not images:
        return prompt_tokens(state, prompt), None
    tokens, media = tokenize_media_prompt(state.loaded, prompt, images)
    return _fits(state, tokens), media


def _fits(state: ServerState, tokens: list[int]) -> list[int]:
    """``tokens``, refused when empty, out of the vocabulary or past the context and the prompt limit."""
    n_ctx = state.scheduler.n_ctx
    if not tokens:
        raise invalid("the prompt is empty: it must contain at least one token")
    check_tokens(tokens, state.loaded.vocab_size)
    if len(tokens) >= n_ctx:
        raise context_exceeded(len(tokens), n_ctx)
    state.limits.check_prompt(len(tokens))
    return tokens


@dataclass
class RenderedChat:
    """A chat request's prompt text, and what its output is read with."""

    prompt: str
    generation_prompt: str  # what the generation prompt (and a continued message) adds at the end
    tools: list | None
    tool_choice: str | dict
    images: list = field(default_factory=list)  # the messages' images, one per media marker in ``prompt``


def render_chat(state: ServerState, req: ChatRequest, body: dict) -> str:
    """A chat request's messages through the template in force, as prompt text."""
    return _render(state, req, body).prompt


def chat_body_prompt(state: ServerState, body: dict) -> str:
    """A chat body (validated here) rendered as prompt text: ``/apply-template``'s answer."""
    return render_chat(state, validate(ChatRequest, body), body)


def chat_body_tokens(state: ServerState, body: dict) -> list[int]:
    """A chat body's prompt as token ids (its images' positions included): what the token-counting
    routes count."""
    rendered = _render(state, validate(ChatRequest, body), body)
    if rendered.images:
        return tokenize_media_prompt(state.loaded, rendered.prompt, rendered.images)[0]
    return tokenize_prompt(state.loaded, rendered.prompt)


def _check_messages(messages: list[dict]) -> None:
    for msg in messages:
        role = msg.get("role")
        if role != "assistant" and "content" not in msg:
            raise invalid("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in msg and "tool_calls" not in msg:
            raise invalid("Assistant message must contain either 'content' or 'tool_calls'!")


def _render(state: ServerState, req: ChatRequest, body: dict, with_generation_prompt: bool = False) -> RenderedChat:
    """Render a chat request. As upstream: a final assistant message is continued rather than
    closed (assistant prefill), unless the request sets ``continue_final_message`` itself;
    continuing and ``add_generation_prompt: true`` together are refused, and so are two assistant
    messages at the end. Tools reach the template as ``tools`` (with ``tool_choice`` and
    ``parallel_tool_calls``); history tool calls as the template takes them. With
    ``with_generation_prompt`` the template is rendered once more without the generation prompt,
    to tell what the generation prompt adds."""
    if "messages" not in body:
        raise invalid("'messages' is required")
    if isinstance(req.messages, list):
        _check_messages([m for m in req.messages if isinstance(m, dict)])
    vision = state.loaded.vision
    media = MediaCollector(vision, state.config.media_path) if vision is not None else None
    messages = normalize_messages(req.messages, media=media)
    messages = history_messages(messages, state.template_info.object_arguments)
    kwargs = {**state.template_kwargs, **(req.chat_template_kwargs or {})}
    if not state.jinja and req.tools:
        raise invalid("tools param requires --jinja flag")
    if not state.jinja and isinstance(req.tool_choice, str) and req.tool_choice != "auto":
        raise invalid("tool_choice param requires --jinja flag")
    tools, tool_choice = check_tools(req.tools, req.tool_choice)
    if tools:
        kwargs["tools"] = tools  # rendered by the model's own template
        if tool_choice not in ("auto", "none"):  # what upstream never renders: only a template that reads it sees it
            kwargs["tool_choice"] = tool_choice if isinstance(tool_choice, str) else \
                {"type": "function", "function": tool_choice}
    if isinstance(kwargs.get("enable_thinking"), str):
        raise invalid('invalid type for "enable_thinking" (expected boolean, got string)')
    if req.reasoning_effort == "none":  # as upstream: "none" turns thinking off
        kwargs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    elif req.reasoning_effort:
        kwargs["reasoning_effort"] = req.reasoning_effort  # as upstream: the template reads it
    add_gen = True if req.add_generation_prompt is None else req.add_generation_prompt
    cont = req.continue_final_message
    continuing = cont is True or cont in ("content", "reasoning_content")
    if "continue_final_message" not in body and messages[-1]["role"] == "assistant":
        if len(messages) >= 2 and messages[-2]["role"] == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.")
        continuing, add_gen = True, False
    if continuing and add_gen:
        raise invalid("Cannot set both add_generation_prompt and continue_final_message to true.")
    if continuing and messages[-1]["role"] != "assistant":
        continuing = False  # nothing to continue: the template renders as it is asked to
    if continuing and messages[-1].get("tool_calls"):
        raise invalid("Cannot continue an assistant message that contains tool calls.")

    def render(msgs: list[dict], gen: bool, continuation: str | None = None) -> str:
        return apply_template(state.loaded.tokenizer, state.template, msgs, gen, dict(kwargs),
                              continuation=continuation, jinja=state.jinja, legacy_format=state.legacy_format)

    if not continuing:
        prompt = render(messages, add_gen)
        tail_text, base = "", messages
    else:
        # as upstream: the final message's text parts are joined with a blank line, and go after the
        # generation prompt of the messages before it, untouched
        tail_text = normalize_messages(req.messages[-1:], join="\n\n",
                                       media=MarkersOnly() if media is not None else None)[0]["content"]
        base = messages[:-1]
        prompt = render(base, True, continuation=tail_text)
    gen_prompt = ""
    if with_generation_prompt and state.jinja:
        with_gen = prompt[:len(prompt) - len(tail_text)] if continuing else prompt
        if continuing or add_gen:
            without = render(base, False) if base else ""
            gen_prompt = reasoning.generation_prompt(with_gen, without) + tail_text
    return RenderedChat(prompt, gen_prompt, tools, tool_choice, media.images if media is not None else [])


def _chat_parsing(state: ServerState, req: ChatRequest, rendered: RenderedChat, fmt: str) -> ChatParsing:
    markers = state.think if fmt != "none" else None
    calls = state.call_syntax if rendered.tools and rendered.tool_choice != "none" else None
    open_thinking = markers is not None and reasoning.opens_thinking(rendered.generation_prompt, markers)
    parallel = req.parallel_tool_calls
    if parallel is None:  # as upstream: the template's own capability
        parallel = state.template_info.caps.get("supports_parallel_tool_calls", False)
    return ChatParsing(think=markers, open_thinking=open_thinking, calls=calls, tools=rendered.tools,
                       parallel=bool(parallel))


def _force_tool_calls(state: ServerState, rendered: RenderedChat, chat: ChatParsing, opts: GenerationOptions) -> None:
    """``tool_choice: "required"`` or a named function: the output must be tool calls (that one), in
    the template's own call layout, through a grammar (``tool_calls.call_grammar``); with
    ``parallel_tool_calls`` one or more of them. A template whose call layout cannot be written as
    a grammar (its arguments are not JSON, or no probe call rendered) is only asked, through the
    template, and its output parsed as under ``auto``."""
    if not rendered.tools or rendered.tool_choice in ("auto", "none") or chat.calls is None:
        return
    text = call_grammar(state.template_info.call_layout, rendered.tools, rendered.tool_choice, parallel=chat.parallel,
                        special_ids=state.special_tokens)
    if text is not None:
        constrain(opts, LARK, text)


def check_sampling_fields(req: SamplingFields, n_predict: int | None, n_probs: int) -> None:
    """What a request asks of the sampler, checked as upstream checks it: refusals of what mlxcel
    does not implement first, then every range."""
    check_unsupported(req)
    check_range("n_predict", n_predict, -1, INT_MAX)
    check_range("n_probs", n_probs, 0, 1024)
    check_range("n_keep", req.n_keep, -1, INT_MAX)
    check_range("n_discard", req.n_discard, 0, INT_MAX)
    check_range("repeat_last_n", req.repeat_last_n, -1, INT_MAX)
    check_range("dry_allowed_length", req.dry_allowed_length, 0, INT_MAX)
    check_range("dry_penalty_last_n", req.dry_penalty_last_n, 0, INT_MAX)
    check_range("top_k", req.top_k, -INT_MAX, INT_MAX)
    check_range("speculative.n_max", req.speculative_n_max, 0, INT_MAX)
    check_range("speculative.n_min", req.speculative_n_min, 0, INT_MAX)
    check_range("speculative.ngram_size_n", req.speculative_ngram_size_n, 1, INT_MAX)
    check_range("speculative.ngram_size_m", req.speculative_ngram_size_m, 0, INT_MAX)
    check_range("speculative.p_min", req.speculative_p_min, 0.0, 1.0)
    check_range("n_indent", req.n_indent, 0, INT_MAX)
    check_range("n_cache_reuse", req.n_cache_reuse, 0, INT_MAX)
    check_range("t_max_predict_ms", req.t_max_predict_ms, -1, 2**63 - 1)
    check_range("sse_ping_interval", req.sse_ping_interval, -1, INT_MAX)
    if req.dry_sequence_breakers is not None and not req.dry_sequence_breakers:
        raise invalid("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings")
    check_number_fields(req)  # every other number field: within the C type upstream reads it into


def _check_speculative_type(state: ServerState, req: SamplingFields) -> None:
    """``speculative.type``: ``none`` decodes the request plainly; any other type must be the one this
    server drafts with (one drafter per server, loaded at startup)."""
    wanted = req.speculative_type
    if wanted is None or wanted == "none":
        return
    speculation = state.scheduler.speculation
    served = speculation.kind.spec_types if speculation is not None else ()
    if wanted not in served:
        have = f"'{served[0]}'" if served else "no drafter"
        raise invalid(f"Field 'speculative.type': this server drafts with {have} (one drafter per server, chosen at "
                      f"startup); a request may ask for that or 'none', not {wanted!r}")


def _options(state: ServerState, req: SamplingFields, n_predict: int | None, n_probs: int, *,
             chat: bool = False) -> GenerationOptions:
    check_sampling_fields(req, n_predict, n_probs)
    _check_speculative_type(state, req)
    opts = generation_options(req, state.defaults, state.loaded, n_predict=n_predict, n_probs=n_probs)
    opts.prediction = prediction_tokens(req.prediction, state.loaded.tokenizer, state.scheduler.n_ctx,
                                        state.piece_chars)
    tools_called = chat and bool(getattr(req, "tools", None)) and getattr(req, "tool_choice", None) != "none"
    opts.grammar = request_grammar(req, chat=chat, jinja=state.jinja, tools_called=tools_called,
                                   default=state.defaults.grammar)
    return opts


def _first(*values):
    """The first of ``values`` that is set (a field before its aliases)."""
    return next((v for v in values if v is not None), None)


def _choices(state: ServerState, value: int | None, field_name: str) -> int:
    n = 1 if value is None else value
    check_range(field_name, n, 1, len(state.scheduler.slots))
    return n


def _check_total(state: ServerState, n_prompts: int, n: int) -> None:
    most = most_at_once(state)
    if n_prompts * n > most:
        raise invalid(f"the request asks for {n_prompts * n} completions; this server runs at most {most} "
                      "at once (slots plus --max-queue)")


def _completion_prompts(state: ServerState, body: dict) -> tuple[CompletionRequest, list[tuple[list[int], Any]]]:
    """A ``/completion``-style body and its prompt(s) as token lists, each with its images."""
    req = validate(CompletionRequest, body)
    if "prompt" not in body:
        raise invalid("key 'prompt' not found")
    parts = split_prompts(req.prompt)
    most = most_at_once(state)
    if len(parts) > most:
        raise invalid(f"the request has {len(parts)} prompts; this server runs at most {most} at once "
                      "(slots plus --max-queue)")
    return req, [prompt_input(state, p) for p in parts]


def native_plan(state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
    """``POST /completion`` (and ``/completions``)."""
    req, inputs = _completion_prompts(state, body)
    prompts, media = [tokens for tokens, _ in inputs], [m for _, m in inputs]
    n = _choices(state, req.n_cmpl, "n_cmpl")
    n_predict = _first(req.n_predict, req.max_completion_tokens, req.max_tokens)
    n_probs = _first(req.n_probs, None if isinstance(req.logprobs, bool) else req.logprobs) or 0
    opts = _options(state, req, n_predict, n_probs)
    opts.reasoning_format = reasoning.check_format(req.reasoning_format, "none")
    opts.reasoning_budget = reasoning.budget_spec(
        req, state.loaded.tokenizer, budget=reasoning.budget_tokens(req, state.config.reasoning_budget), markers=None,
        message=state.config.reasoning_budget_message)
    _check_total(state, len(prompts), n)
    return CompletionPlan(prompts, opts, n, t_arrival, response_fields=req.response_fields, media=media)


def oai_completion_plan(state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
    """``POST /v1/completions``."""
    req, inputs = _completion_prompts(state, body)
    prompts, media = [tokens for tokens, _ in inputs], [m for _, m in inputs]
    n = _choices(state, req.n, "n")
    n_predict = _first(req.max_tokens, req.max_completion_tokens, req.n_predict)
    logprobs = req.logprobs
    n_probs = 0 if logprobs in (None, False) else (1 if logprobs is True else int(logprobs))
    check_range("logprobs", n_probs, 0, 1024)
    opts = _options(state, req, n_predict, n_probs)
    _check_total(state, len(prompts), n)
    return CompletionPlan(prompts, opts, n, t_arrival, logprobs=bool(n_probs), echo=bool(req.echo), media=media)


def chat_plan(state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
    """``POST /v1/chat/completions`` (and ``/chat/completions``)."""
    req = validate(ChatRequest, body)
    fmt = reasoning.check_format(req.reasoning_format, state.config.reasoning_format)
    rendered = _render(state, req, body, with_generation_prompt=state.think is not None)
    prompt = rendered.prompt
    tokens, media = prompt_input(state, prompt, rendered.images)
    n = _choices(state, req.n, "n")
    n_predict = next((v for v in (req.max_completion_tokens, req.max_tokens, req.n_predict) if v is not None), None)
    check_range("max_tokens", n_predict, -1, INT_MAX)
    top_n = req.top_logprobs if req.logprobs else None
    if top_n is not None:
        check_range("top_logprobs", top_n, 0, 20)
    chat = _chat_parsing(state, req, rendered, fmt)
    if req.logprobs and req.stream and chat.calls is not None:
        raise invalid("logprobs is not supported with tools + stream")
    n_probs = max(top_n or 0, 1) if req.logprobs else 0
    opts = _options(state, req, n_predict, n_probs, chat=True)
    _force_tool_calls(state, rendered, chat, opts)
    if opts.grammar is not None and chat.think is not None:
        opts.grammar = after_reasoning(opts.grammar, chat.think.start, chat.think.end, opened=chat.open_thinking,
                                       special_ids=state.special_tokens)
    opts.reasoning_format = fmt
    opts.reasoning_budget = reasoning.budget_spec(
        req, state.loaded.tokenizer, budget=reasoning.budget_tokens(req, state.config.reasoning_budget),
        markers=state.think, prefill=rendered.generation_prompt, message=state.config.reasoning_budget_message)
    _check_total(state, 1, n)
    return CompletionPlan([tokens], opts, n, t_arrival, rendered=prompt, logprobs=bool(req.logprobs), top_n=top_n,
                          include_usage=bool((req.stream_options or {}).get("include_usage")),
                          verbose=bool(req.verbose) or state.config.verbose, chat=chat, media=[media])
