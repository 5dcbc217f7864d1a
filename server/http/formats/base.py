"""The two small interfaces a response format implements for the completion pipeline."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from mlxcel.server.http.plan import CompletionPlan
from mlxcel.server.http.sse import event
from mlxcel.server.http.state import ServerState
from mlxcel.server.runtime.errors import ApiError
from mlxcel.server.runtime.task import Partial, Progress, Result


class CompletionStream(ABC):
    """One streamed response: turns the tasks' events into chunk bodies, in order. Each method
    returns the chunks to send (possibly none); ``done_marker`` ends the stream with
    ``data: [DONE]`` (the OpenAI routes). ``frame`` writes one chunk as SSE (``data:`` only, unless
    the API names its events), ``ping`` is what a silence of ``sse_ping_interval`` sends, and
    ``failed`` the chunks that end a stream whose request failed."""

    done_marker: bool = False
    ping: bytes = b": ping\n\n"  # an SSE comment: clients skip it, proxies see traffic

    def frame(self, chunk: dict) -> bytes:
        return event(chunk)

    def failed(self, error: ApiError) -> list[dict]:
        return [error.body()]

    def opening(self) -> list[dict]:
        """Chunks before any event."""
        return []

    def progress(self, index: int, progress: Progress) -> list[dict]:
        """Task ``index`` reports prompt progress (``return_progress``)."""
        return []

    @abstractmethod
    def partial(self, index: int, partial: Partial) -> list[dict]:
        """Task ``index`` produced text that can no longer become a stop string."""

    @abstractmethod
    def final(self, index: int, result: Result) -> list[dict]:
        """Task ``index`` finished."""


class ResponseFormat(ABC):
    """One API over the completion pipeline: its request becomes a :class:`CompletionPlan`, its
    results a body (``body``) or a stream of chunks (``stream``). ``indices`` are the tasks' indices,
    in the order of ``results``."""

    @abstractmethod
    def plan(self, state: ServerState, body: dict, t_arrival: float) -> CompletionPlan:
        """Validate ``body`` into a plan (every range check lives in ``plan``)."""

    @abstractmethod
    def body(self, state: ServerState, plan: CompletionPlan, results: list[Result], indices: list[int]) -> Any:
        """The whole response body once every task finished."""

    @abstractmethod
    def stream(self, state: ServerState, plan: CompletionPlan, indices: list[int]) -> CompletionStream:
        """A fresh stream writer for one response."""
