"""A Qwen-style chat template with tool calls (``<tool_call>`` JSON, ``<tool_response>``, ``<think>``),
for tests that run tool calling and reasoning on tiny checkpoints through the real template path."""

from __future__ import annotations

_HINT = """Answer with <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call>"""


def qwen_tool_template(answer_hint: bool = True) -> str:
    """The template; ``answer_hint`` adds the line that tells the model the call format (as Qwen's
    own templates do), which changes only the rendered system prompt."""
    return """{%- if tools %}<|im_start|>system
You can call these functions:
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}""" + (_HINT if answer_hint else "") + """<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>

{% endif %}{{ message.content }}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if not loop.first or message.content %}
{% endif %}<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
