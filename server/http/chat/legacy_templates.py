"""llama.cpp's built-in (non-Jinja) chat formats, as llama-server applies them under ``--no-jinja``.

Upstream keeps a fixed list of named prompt formats (``chatml``, ``llama3``, ``gemma``, ...) in
``src/llama-chat.cpp``. Without Jinja, the ``--chat-template`` string (or the model's template) is
either one of those names or Jinja source that a chain of substring tests maps to one of them; the
chosen format is then rendered by plain string concatenation, not by evaluating the Jinja. This
module reproduces both halves byte for byte: :func:`detect` (name lookup, then the same substring
tests in the same order) and :func:`render` (the per-format concatenation, with upstream's
whitespace, trimming, system-message handling and literal BOS/EOS strings).

It is written by hand because nothing else provides it: these formats exist only as C++ inside
llama.cpp, and no maintained Python package exposes them. The behaviour is checked against the real
llama-server (``scripts/record_legacy_templates.py`` records, ``tests/server/http/
test_legacy_templates.py`` compares).

Conventions shared by all formats: ``messages`` are ``{"role", "content"}`` dicts whose content is
already a string (upstream joins text parts with ``"\\n"`` first); roles a format does not know are
skipped unless noted; "trimmed" means leading and trailing C ``isspace`` bytes removed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

# every built-in name, in the order of upstream's table
NAMES: tuple[str, ...] = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch",
    "gemma", "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr",
    "command-r", "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe",
    "rwkv-world", "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing",
    "bailing-think", "bailing2", "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl",
    "kimi-k2", "seed_oss", "grok-2", "pangu-embedded", "solar-open",
)

# a format upstream can detect from Jinja source but offers no name for
DOTS1 = "dots1"

_UNSUPPORTED = "this custom template is not supported, try using --jinja"

# C isspace() in the "C" locale; UTF-8 continuation bytes are never among these
_SPACE = " \t\n\v\f\r"
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")

# literal special-token strings several formats share
_DS_EOS = "<｜end▁of▁sentence｜>"
_HY_PLACEHOLDER_3 = "<｜hy_place▁holder▁no▁3｜>"


def _trim(text: str) -> str:
    return text.strip(_SPACE)


def _upper(text: str) -> str:
    """ASCII-only upper case (C ``toupper``), leaving other characters alone."""
    return text.translate(_ASCII_UPPER)


# ---------------------------------------------------------------------------------------------
# detection


def _detect_mistral_family(has: Callable[[str], bool]) -> str:
    if has("[SYSTEM_PROMPT]"):
        return "mistral-v7"
    # Mistral's official v1 / v3 / v3-tekken templates
    if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
        if has(" [INST]"):
            return "mistral-v1"
        if has('"[INST]"'):
            return "mistral-v3-tekken"
        return "mistral-v3"
    # Llama 2 and the variants told apart by how the template treats system text, BOS and spaces
    if has("content.strip()"):
        return "llama2-sys-strip"
    if has("bos_token + '[INST]"):
        return "llama2-sys-bos"
    if has("<<SYS>>"):
        return "llama2-sys"
    return "llama2"


# (markers that must all occur, format), tried in order after the special cases in detect()
_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|assistant|>", "<|end|>"), "phi3"),
    (("[gMASK]<sop>",), "chatglm4"),
    (("<|assistant|>", "<|user|>", "<|tool_declare|>"), "exaone-moe"),
    (("<|assistant|>", "<|user|>", "</s>"), "falcon3"),
    (("<|assistant|>", "<|user|>"), "glmedge"),
    (("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (("<|user|>", "<|endoftext|>"), "zephyr"),
    (("bos_token + message['role']",), "monarch"),
    (("<start_of_turn>",), "gemma"),
    (("'\\n\\nAssistant: ' + eos_token",), "orion"),
    (("GPT4 Correct ",), "openchat"),
    (("USER: ", "ASSISTANT: ", "SYSTEM: "), "vicuna-orca"),
    (("USER: ", "ASSISTANT: "), "vicuna"),
    (("### Instruction:", "<|EOT|>"), "deepseek"),
    (("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (("[gMASK]sop",), "chatglm3"),
    (("<用户>",), "minicpm"),
    (("'Assistant: ' + message['content'] + eos_token",), "deepseek2"),
    (("<｜Assistant｜>", "<｜User｜>", _DS_EOS), "deepseek3"),
    (("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"), "exaone4"),
    (("[|system|]", "[|assistant|]", "[|endofturn|]"), "exaone3"),
    (("rwkv-world",), "rwkv-world"),
    (("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",), "rwkv-world"),
    (("<|start_of_role|>", "<tool_call>", "g4_default_system_message"), "granite-4.0"),
    (("<|start_of_role|>", "<tools>", "g4_default_system_message"), "granite-4.0"),
    (("<|start_of_role|>", "<tool_call>"), "granite-4.1"),
    (("<|start_of_role|>", "<tools>"), "granite-4.1"),
    (("<|start_of_role|>",), "granite"),
    (("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",),
     "gigachat"),
    (("<|role_start|>",), "megrez"),
    ((" Ассистент:",), "yandex"),
    (("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (("<|header_start|>", "<|header_end|>"), "llama4"),
    (("<|endofuserprompt|>",), DOTS1),
    (("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (("<|start|>", "<|channel|>"), "gpt-oss"),
    (("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (("<｜hy_Assistant｜>", _HY_PLACEHOLDER_3), "hunyuan-dense"),
    (("<|im_assistant|>assistant<|im_middle|>",), "kimi-k2"),
    (("<seed:bos>",), "seed_oss"),
    (("'Assistant: '  + message['content'] + '<|separator|>",), "grok-2"),
    (("[unused9]系统：[unused10]",), "pangu-embedded"),
    (("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
)


def detect(template: str) -> str | None:
    """The built-in format upstream picks for a template string: a name in NAMES returns itself;
    otherwise upstream's substring heuristics over Jinja source; None when nothing matches."""
    if template in NAMES:
        return template

    def has(marker: str) -> bool:
        return marker in template

    if has("<|im_start|>"):
        if has("<|im_sep|>"):
            return "phi4"
        # SmolVLM opens with <|im_start|> as its BOS but is otherwise not ChatML
        return "smolvlm" if has("<end_of_utterance>") else "chatml"
    if template.startswith("mistral") or has("[INST]"):
        return _detect_mistral_family(has)
    for markers, name in _MARKERS:
        if all(m in template for m in markers):
            return name
    return None


# ---------------------------------------------------------------------------------------------
# table-driven formats: one string per message, picked by role


@dataclass(frozen=True)
class _Turns:
    """A format where each message becomes ``turns[role]`` (``"*"`` for any other role; a role
    with neither is dropped), with ``{role}``, ``{Role}`` (first letter upper), ``{ROLE}`` (upper)
    and ``{content}`` filled in; ``trim`` is True, False, or the roles whose content is trimmed.
    ``opening`` precedes everything; ``generation`` follows when a generation prompt is asked for."""

    turns: dict[str, str]
    generation: str = ""
    trim: bool | Collection[str] = False
    opening: str = ""
    role_names: dict[str, str] = field(default_factory=dict)  # role spelled differently in {ROLE}

    def __call__(self, messages: list[dict], add_generation_prompt: bool) -> str:
        parts = [self.opening]
        for message in messages:
            role, content = message["role"], message["content"]
            turn = self.turns.get(role, self.turns.get("*"))
            if turn is None:
                continue
            if self.trim is True or (self.trim is not False and role in self.trim):
                content = _trim(content)
            parts.append(turn.format(
                role=role, content=content, Role=_upper(role[:1]) + role[1:],
                ROLE=self.role_names.get(role) or _upper(role),
            ))
        if add_generation_prompt:
            parts.append(self.generation)
        return "".join(parts)


def _any_role(turn: str, generation: str = "", **kw) -> _Turns:
    return _Turns({"*": turn}, generation, **kw)


def _mistral_v7(space: str) -> _Turns:
    return _Turns({
        "system": "[SYSTEM_PROMPT]" + space + "{content}[/SYSTEM_PROMPT]",
        "user": "[INST]" + space + "{content}[/INST]",
        "*": space + "{content}</s>",
    })


def _vicuna(system: str) -> _Turns:
    return _Turns({
        "system": system,
        "user": "USER: {content}\n",
        "assistant": "ASSISTANT: {content}</s>\n",
    }, "ASSISTANT:")


def _exaone(with_tool: bool) -> _Turns:
    turns = {
        "system": "[|system|]{content}[|endofturn|]\n",
        "user": "[|user|]{content}\n",
        "assistant": "[|assistant|]{content}[|endofturn|]\n",
    }
    if with_tool:
        turns["tool"] = "[|tool|]{content}[|endofturn|]\n"
    return _Turns(turns, "[|assistant|]", trim=True)


def _granite(tool_call_role: str) -> _Turns:
    return _Turns({
        "assistant_tool_call": "<|start_of_role|>" + tool_call_role + "<|end_of_role|><|tool_call|>{content}"
                               "<|end_of_text|>\n",
        "*": "<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n",
    }, "<|start_of_role|>assistant<|end_of_role|>")


def _bailing(generation: str) -> _Turns:
    return _any_role("<role>{ROLE}</role>{content}", generation, role_names={"user": "HUMAN"})


_KIMI_HEADS = {
    "system": "<|im_system|>system<|im_middle|>",
    "user": "<|im_user|>user<|im_middle|>",
    "assistant": "<|im_assistant|>assistant<|im_middle|>",
    "tool": "<|im_system|>tool<|im_middle|>",
}

_TABLE: dict[str, _Turns] = {
    "chatml": _any_role("<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n"),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _any_role("<|{role}|>\n{content}<|end|>\n", "<|assistant|>\n"),
    "phi4": _any_role("<|im_start|>{role}<|im_sep|>{content}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _any_role("<|{role}|>\n{content}\n", "<|assistant|>\n"),
    "zephyr": _any_role("<|{role}|>\n{content}<|endoftext|>\n", "<|assistant|>\n"),
    "openchat": _Turns({"system": "{content}<|end_of_turn|>", "*": "GPT4 Correct {Role}: {content}<|end_of_turn|>"},
                       "GPT4 Correct Assistant:"),
    "vicuna": _vicuna("{content}\n\n"),
    "vicuna-orca": _vicuna("SYSTEM: {content}\n"),
    "deepseek": _Turns({
        "system": "{content}",
        "user": "### Instruction:\n{content}\n",
        "assistant": "### Response:\n{content}\n<|EOT|>\n",
    }, "### Response:\n"),
    "deepseek2": _Turns({
        "system": "{content}\n\n",
        "user": "User: {content}\n\n",
        "assistant": "Assistant: {content}" + _DS_EOS,
    }, "Assistant:"),
    "deepseek3": _Turns({
        "system": "{content}\n\n",
        "user": "<｜User｜>{content}",
        "assistant": "<｜Assistant｜>{content}" + _DS_EOS,
    }, "<｜Assistant｜>"),
    "deepseek-ocr": _any_role("{content}"),  # no markup at all, and no generation prompt
    "command-r": _Turns({
        "system": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{content}<|END_OF_TURN_TOKEN|>",
        "user": "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{content}<|END_OF_TURN_TOKEN|>",
        "assistant": "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{content}<|END_OF_TURN_TOKEN|>",
    }, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=True),
    "llama3": _any_role("<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                        "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True),
    "chatglm3": _any_role("<|{role}|>\n {content}", "<|assistant|>", opening="[gMASK]sop"),
    "chatglm4": _any_role("<|{role}|>\n{content}", "<|assistant|>\n", opening="[gMASK]<sop>"),
    "glmedge": _any_role("<|{role}|>\n{content}", "<|assistant|>"),
    "minicpm": _Turns({"user": "<用户>{content}<AI>", "*": "{content}"}, trim=True),
    "exaone3": _exaone(with_tool=False),
    "exaone4": _exaone(with_tool=True),
    "exaone-moe": _Turns(dict.fromkeys(("system", "user", "assistant", "tool"), "<|{role}|>\n{content}<|endofturn|>\n"),
                         "<|assistant|>\n", trim=True),
    "granite": _granite("assistant_tool_call"),
    "granite-4.0": _granite("assistant"),
    "granite-4.1": _granite("assistant"),
    "megrez": _any_role("<|role_start|>{role}<|role_end|>{content}<|turn_end|>", "<|role_start|>assistant<|role_end|>"),
    "yandex": _Turns({"user": " Пользователь: {content}\n\n", "assistant": " Ассистент: {content}\n\n"},
                     " Ассистент:[SEP]"),
    "bailing": _bailing("<role>ASSISTANT</role>"),
    "bailing-think": _bailing("<role>ASSISTANT</role><think>"),
    "llama4": _any_role("<|header_start|>{role}<|header_end|>\n\n{content}<|eot|>",
                        "<|header_start|>assistant<|header_end|>\n\n", trim=True),
    "smolvlm": _Turns({
        "system": "{content}\n\n",
        "user": "User: {content}<end_of_utterance>\n",
        "*": "Assistant: {content}<end_of_utterance>\n",
    }, "Assistant:", opening="<|im_start|>"),  # <|im_start|> is SmolVLM's BOS; the rest is not ChatML
    DOTS1: _Turns({
        "system": "<|system|>{content}<|endofsystem|>",
        "user": "<|userprompt|>{content}<|endofuserprompt|>",
        "*": "<|response|>{content}<|endofresponse|>",
    }, "<|response|>"),
    "hunyuan-moe": _Turns({
        "system": "<|startoftext|>{content}<|extra_4|>",
        "assistant": "{content}<|eos|>",
        "*": "<|startoftext|>{content}<|extra_0|>",
    }),
    "gpt-oss": _Turns({"assistant": "<|start|>assistant<|message|>{content}<|return|>",
                       "*": "<|start|>{role}<|message|>{content}<|end|>"}, "<|start|>assistant"),
    # an unknown role still gets its content and <|im_end|>, just no header
    "kimi-k2": _Turns({**{r: h + "{content}<|im_end|>" for r, h in _KIMI_HEADS.items()}, "*": "{content}<|im_end|>"},
                      _KIMI_HEADS["assistant"]),
    "seed_oss": _any_role("<seed:bos>{role}\n{content}<seed:eos>", "<seed:bos>assistant\n", trim={"assistant"}),
    "grok-2": _Turns({
        "system": "System: {content}<|separator|>\n\n",
        "user": "Human: {content}<|separator|>\n\n",
        "assistant": "Assistant: {content}<|separator|>\n\n",
    }, "Assistant:", trim={"system", "user"}),
    "solar-open": _any_role("<|begin|>{role}<|content|>{content}<|end|>", "<|begin|>assistant"),
}


# ---------------------------------------------------------------------------------------------
# formats with state across messages


def _mistral_v1_v3(name: str) -> Callable[[list[dict], bool], str]:
    """[INST] opens a turn lazily and an assistant reply closes it; system text sits inside the
    turn. v1 puts a space before [INST] and [/INST]; tekken drops the space after them; v3 trims
    assistant replies. There is never a generation prompt."""
    lead = " " if name == "mistral-v1" else ""
    gap = "" if name == "mistral-v3-tekken" else " "
    trim_reply = name == "mistral-v3"

    def render_mistral(messages: list[dict], add_generation_prompt: bool) -> str:
        out: list[str] = []
        open_turn = False
        for message in messages:
            role, content = message["role"], message["content"]
            if not open_turn:
                out.append(lead + "[INST]" + gap)
                open_turn = True
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(content + lead + "[/INST]")
            else:
                out.append(gap + (_trim(content) if trim_reply else content) + "</s>")
                open_turn = False
        return "".join(out)

    return render_mistral


def _llama2(name: str) -> Callable[[list[dict], bool], str]:
    """The prompt starts inside a turn (no BOS); each assistant reply closes one and the next
    message reopens it. Variants: <<SYS>> blocks (else system text is a bare line), a literal <s>
    before reopened turns, trimmed contents. There is never a generation prompt."""
    system_block = name != "llama2"
    reopen = "<s>[INST] " if name == "llama2-sys-bos" else "[INST] "
    strip = name == "llama2-sys-strip"

    def render_llama2(messages: list[dict], add_generation_prompt: bool) -> str:
        out = ["[INST] "]
        open_turn = True
        for message in messages:
            role = message["role"]
            content = _trim(message["content"]) if strip else message["content"]
            if not open_turn:
                out.append(reopen)
                open_turn = True
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system_block else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                open_turn = False
        return "".join(out)

    return render_llama2


def _monarch(messages: list[dict], add_generation_prompt: bool) -> str:
    # a literal <s> opens every message but the first
    out = [("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(messages)]
    if add_generation_prompt:
        out.append("<s>assistant\n")
    return "".join(out)


def _gemma(messages: list[dict], add_generation_prompt: bool) -> str:
    """No system role: trimmed system texts are concatenated and put at the head of the next
    non-model turn; "assistant" is spelled "model"; contents are trimmed."""
    out: list[str] = []
    pending_system = ""
    for message in messages:
        role = message["role"]
        if role == "system":
            pending_system += _trim(message["content"])
            continue
        if role == "assistant":
            role = "model"
        out.append(f"<start_of_turn>{role}\n")
        if pending_system and role != "model":
            out.append(pending_system + "\n\n")
            pending_system = ""
        out.append(_trim(message["content"]) + "<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


def _orion(messages: list[dict], add_generation_prompt: bool) -> str:
    """No system role: system texts are concatenated (untrimmed) and put at the head of the next
    user turn. Each user turn already ends with the assistant cue, so there is no generation prompt."""
    out: list[str] = []
    pending_system = ""
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            pending_system += content
        elif role == "user":
            out.append("Human: ")
            if pending_system:
                out.append(pending_system + "\n\n")
                pending_system = ""
            out.append(content + "\n\nAssistant: </s>")
        else:
            out.append(content + "</s>")
    return "".join(out)


def _rwkv_world(messages: list[dict], add_generation_prompt: bool) -> str:
    """Trimmed "Role: text" paragraphs; the assistant cue follows a user message only when it is
    the last one, whatever ``add_generation_prompt`` says."""
    out: list[str] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        role, content = message["role"], _trim(message["content"])
        if role == "system":
            out.append(f"System: {content}\n\n")
        elif role == "user":
            out.append(f"User: {content}\n\n")
            if i == last:
                out.append("Assistant:")
        elif role == "assistant":
            out.append(f"Assistant: {content}\n\n")
    return "".join(out)


def _gigachat(messages: list[dict], add_generation_prompt: bool) -> str:
    """A leading system message shares the opening <s>; later system messages are dropped; each
    user turn is followed by an empty function list."""
    has_system = bool(messages) and messages[0]["role"] == "system"
    out = ["<s>" + (messages[0]["content"] + "<|message_sep|>" if has_system else "")]
    for message in messages[1 if has_system else 0:]:
        role, content = message["role"], message["content"]
        if role == "user":
            out.append(f"user<|role_sep|>{content}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>")
        elif role == "assistant":
            out.append(f"assistant<|role_sep|>{content}<|message_sep|>")
    if add_generation_prompt:
        out.append("assistant<|role_sep|>")
    return "".join(out)


_BAILING2_TURNS = _any_role("<role>{ROLE}</role>{content}<|role_end|>", "<role>ASSISTANT</role>",
                            role_names={"user": "HUMAN"})


def _bailing2(messages: list[dict], add_generation_prompt: bool) -> str:
    # without a leading system message, a default one switching thinking off comes first
    has_system = bool(messages) and messages[0]["role"] == "system"
    opening = "" if has_system else "<role>SYSTEM</role>detailed thinking off<|role_end|>"
    return opening + _BAILING2_TURNS(messages, add_generation_prompt)


def _hunyuan_dense(messages: list[dict], add_generation_prompt: bool) -> str:
    """Only a leading system message is kept; each user turn ends with the assistant cue, so there
    is no separate generation prompt."""
    out: list[str] = []
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if i == 0 and role == "system":
            out.append(content + _HY_PLACEHOLDER_3)
        if role == "assistant":
            out.append(f"<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>")
        elif role == "user":
            out.append(f"<｜hy_User｜>{content}<｜hy_Assistant｜>")
    return "".join(out)


def _hunyuan_vl(messages: list[dict], add_generation_prompt: bool) -> str:
    """Role markers follow the content; only a leading system message is kept; no generation prompt."""
    out = ["<｜hy_begin▁of▁sentence｜>"]
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if i == 0 and role == "system":
            out.append(content + _HY_PLACEHOLDER_3)
        elif role == "user":
            out.append(content + "<｜hy_User｜>")
        elif role == "assistant":
            out.append(content + "<｜hy_Assistant｜>")
    return "".join(out)


_PANGU_ROLES = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}


def _pangu_embedded(messages: list[dict], add_generation_prompt: bool) -> str:
    # an empty system block comes first when the conversation does not open with one
    out: list[str] = []
    if messages and messages[0]["role"] != "system":
        out.append("[unused9]系统：[unused10]")
    for message in messages:
        label = _PANGU_ROLES.get(message["role"])
        if label is not None:
            out.append(f"[unused9]{label}：{message['content']}[unused10]")
    if add_generation_prompt:
        out.append("[unused9]助手：")
    return "".join(out)


_RENDERERS: dict[str, Callable[[list[dict], bool], str]] = {
    **_TABLE,
    **{name: _mistral_v1_v3(name) for name in ("mistral-v1", "mistral-v3", "mistral-v3-tekken")},
    **{name: _llama2(name) for name in ("llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip")},
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "rwkv-world": _rwkv_world,
    "gigachat": _gigachat,
    "bailing2": _bailing2,
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-vl": _hunyuan_vl,
    "pangu-embedded": _pangu_embedded,
}


def render(name: str, messages: list[dict], add_generation_prompt: bool) -> str:
    """messages: [{"role": str, "content": str}, ...] (content already a string). Returns the
    prompt text exactly as upstream's renderer would. Raises ValueError(message) where upstream's
    renderer returns an error (unsupported format / role)."""
    renderer = _RENDERERS.get(name)
    if renderer is None:
        raise ValueError(_UNSUPPORTED)
    return renderer(messages, add_generation_prompt)
