"""Which tokens llama.cpp treats as control, user-defined and end-of-generation tokens.

The file's ``token_type`` is only the start: llama.cpp also decides by the token's text
(llama-vocab.cpp), so a file converted with a plain ``</s>`` or ``<|fim_prefix|>`` behaves as if
those were control tokens. What it does, restated:

- the end-of-turn token (``eot``), the end-of-message token and the fill-in-the-middle tokens are
  the metadata's, else the first token whose text is one of the known spellings; each becomes a
  control token;
- every token with one of the end-of-generation spellings ends generation and becomes a control
  token, as do the ``eos`` / ``eot`` / ``eom`` tokens and the FIM pad, repo and separator tokens;
- GPT-OSS's ``<|channel|>``, ``<|message|>``, ``<|start|>``, ``<|constrain|>`` are user-defined
  (matched whole, and printed);
- with ``<|return|>`` and ``<|call|>`` (GPT-OSS) or ``<|calls|>`` and ``<|flush|>`` (Solar Open)
  present, ``<|end|>`` ends nothing and is user-defined; with ``<|tool_response>`` or
  ``<|plamo:eos|>`` present, ``</s>`` is an ordinary token.

Control and user-defined tokens are matched whole in the text before it is split (control ones
only when special tokens are parsed, as with ``/tokenize``'s default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
             "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_FIM = ("fim_pad", "fim_rep", "fim_sep")
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
             "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
             "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>",
             "[e~[")
RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # GPT-OSS: user-defined


@dataclass
class TokenRoles:
    control: set[int] = field(default_factory=set)  # matched whole, not printed
    user_defined: set[int] = field(default_factory=set)  # matched whole, printed
    eog: set[int] = field(default_factory=set)  # end generation


def token_roles(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> TokenRoles:
    n = len(tokens)

    def tid(name: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        return int(value) if value is not None and 0 <= int(value) < n else None

    by_text: dict[str, int] = {}
    for i, text in enumerate(tokens):
        by_text.setdefault(text, i)

    def first(texts) -> int | None:
        return next((by_text[t] for t in texts if t in by_text), None)

    roles = TokenRoles(control={i for i, t in enumerate(types) if t == CONTROL},
                       user_defined={i for i, t in enumerate(types) if t == USER_DEFINED})
    found = {"eot": tid("eot"), "eom": tid("eom")}
    if found["eot"] is None and (i := first(EOT_TEXTS)) is not None:
        found["eot"] = i
        roles.control.add(i)
    if found["eom"] is None and (i := first(EOM_TEXTS)) is not None:
        found["eom"] = i
        roles.control.add(i)
    for kind, texts in FIM_TEXTS.items():
        i = tid(kind)
        if i is None and (i := first(texts)) is not None:
            roles.control.add(i)
        if i is not None and kind in EOG_FIM:
            roles.eog.add(i)
    for text in EOG_TEXTS:
        if text in by_text:
            roles.eog.add(by_text[text])
            roles.control.add(by_text[text])
    for text in RENDERED:
        if text in by_text:
            roles.control.discard(by_text[text])
            roles.user_defined.add(by_text[text])
    roles.eog.update(i for i in (tid("eos"), found["eot"], found["eom"]) if i is not None)

    texts = {tokens[i] for i in roles.eog}
    if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts or {"<|calls|>", "<|flush|>"} <= texts):
        end = by_text["<|end|>"]
        roles.eog.discard(end)
        roles.control.discard(end)
        roles.user_defined.add(end)
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        s = by_text["</s>"]
        roles.eog.discard(s)
        roles.control.discard(s)
        roles.user_defined.discard(s)
    return roles
