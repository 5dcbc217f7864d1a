"""A chat completion's generated text split into reasoning, content and tool calls, as it streams.

The text arrives in pieces (already past the stop strings); :class:`ChatOutput` turns each piece
into deltas of ``reasoning_content`` and ``content`` and, at the end, the tool calls, holding
back text that may still turn out to be a marker: the end-of-thinking tag while reasoning, the
start of a tool call while in content, a call until it is complete (as ``runtime.stop_strings`` holds back a stop string). The
non-streamed body runs the same object over the whole text, so a stream's deltas always
reassemble to the final message.

The layout it reads: optional reasoning (``start``...``end`` tags; already open when the
generation prompt opened it), then content, then tool calls (everything from the first call's
start; each call goes out once it is complete; text that does not parse as calls stays content). Reasoning is trimmed of the whitespace
inside its tags, and content of the whitespace right after the end tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcel.server.http.chat.template_caps import ThinkMarkers
from mlxcel.server.http.chat.tool_calls import CallSyntax, ToolCall
from mlxcel.server.runtime.stop_strings import partial_stop_length

START, REASONING, AFTER_REASONING, CONTENT, CALLS = "start", "reasoning", "after", "content", "calls"


@dataclass
class ChatParsing:
    """What to read out of one chat request's output."""

    think: ThinkMarkers | None = None  # None: no reasoning split (reasoning_format none, or no markers)
    open_thinking: bool = False  # the generation prompt already opened the reasoning block
    calls: CallSyntax | None = None  # None: no tool calls read (no tools, tool_choice none, or no parser)
    tools: list | None = None
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only

    @property
    def active(self) -> bool:
        return self.think is not None or self.calls is not None


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChatOutput:
    def __init__(self, parsing: ChatParsing):
        self.p = parsing
        self.mode = CONTENT
        if parsing.think is not None:
            self.mode = REASONING if parsing.open_thinking else START
        self.buf = ""
        self.reasoning = ""
        self.content = ""
        self.tool_calls: list[ToolCall] = []
        self.reasoning_started = False
        self.calls_sent = 0
        self.reader = parsing.calls  # what reads the calls: the syntax, or its bare fallback

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, text: str) -> Delta:
        """The deltas ``text`` settles."""
        if not self.p.active:
            self.content += text
            return Delta(content=text)
        self.buf += text
        return self._advance(final=False)

    def finish(self) -> Delta:
        """Everything still held back, and the tool calls."""
        if not self.p.active:
            return Delta()
        return self._advance(final=True)

    def _advance(self, final: bool) -> Delta:
        out = Delta()
        while True:
            before = (self.mode, len(self.buf))
            getattr(self, "_" + self.mode)(out, final)
            if (self.mode, len(self.buf)) == before:
                break
        self.reasoning += out.reasoning
        self.content += out.content
        self.tool_calls += out.tool_calls
        return out

    # -- one step per mode (each consumes what it can from buf) --------------------------------

    def _start(self, out: Delta, final: bool) -> None:
        start = self.p.think.start
        stripped = self.buf.lstrip()
        if stripped.startswith(start):
            self.buf = stripped[len(start):]
            self.mode = REASONING
        elif final or not start.startswith(stripped):
            self.mode = CONTENT  # no reasoning block: the held text is content
        # else: the text so far may still be the start tag: hold it

    def _reasoning(self, out: Delta, final: bool) -> None:
        end = self.p.think.end
        if not self.reasoning_started:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return
            self.reasoning_started = True
        at = self.buf.find(end)
        if at >= 0:
            out.reasoning += self.buf[:at].rstrip()
            self.buf = self.buf[at + len(end):]
            self.mode = AFTER_REASONING
            return
        if final:
            out.reasoning += self.buf.rstrip()
            self.buf = ""
            return
        keep = partial_stop_length(self.buf, [end])
        body = self.buf[:len(self.buf) - keep]
        settled = body.rstrip()  # trailing whitespace may be the last before the end tag
        out.reasoning += settled
        self.buf = self.buf[len(settled):]

    def _after(self, out: Delta, final: bool) -> None:
        stripped = self.buf.lstrip()
        if stripped or final:
            self.buf = stripped
            self.mode = CONTENT

    def _content(self, out: Delta, final: bool) -> None:
        calls = self.p.calls
        if calls is None:
            out.content += self.buf
            self.buf = ""
            return
        bare = calls.bare_fallback
        if bare is not None and not (self.content or out.content) and self.reader is calls:
            opening = self.buf.lstrip()
            if not opening and not final:
                return  # the output may still open with a bare call object
            if opening.startswith("{"):
                self.reader = bare
                self.mode = CALLS
                return
        at = calls.find(self.buf) if not (self.content or out.content) or calls.triggers != ("{",) else -1
        if at >= 0:
            out.content += self.buf[:at]
            self.buf = self.buf[at:]
            self.mode = CALLS
            return
        if final:
            out.content += self.buf
            self.buf = ""
            return
        if calls.triggers == ("{",) and not (self.content or out.content) and not self.buf.strip():
            return  # a bare JSON call can only open the output: hold leading whitespace
        keep = partial_stop_length(self.buf, list(calls.triggers))
        out.content += self.buf[:len(self.buf) - keep]
        self.buf = self.buf[len(self.buf) - keep:]

    def _calls(self, out: Delta, final: bool) -> None:
        """Each call goes out once it is complete; at the end, text that is not calls stays content."""
        calls, used = self.reader.parse(self.buf, self.p.tools, final)
        if not self.p.parallel:
            calls = calls[:1]
        out.tool_calls += calls[self.calls_sent:]
        self.calls_sent = len(calls)
        if not final:
            return
        rest = self.buf[used:] if calls else self.buf
        out.content += rest if not calls else rest.strip() and rest
        self.buf = ""
        self.mode = CONTENT
        self.p = ChatParsing()  # nothing left to read
