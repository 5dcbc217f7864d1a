"""Chat: what every chat-shaped API shares between its request and its output. The template
(``template``, with upstream's built-in ``legacy_templates`` for ``--no-jinja``) and what it can do
(``template_caps``, probed at startup), tool calls (``tool_calls``: parsed back, forced by a
grammar), reasoning (``reasoning``: ``reasoning_format``, the think tags, the budget), and the
output split into reasoning, content and tool calls as it streams (``output``)."""
