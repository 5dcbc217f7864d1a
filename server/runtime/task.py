"""One generation request as the engine thread sees it, and the events it sends back.

The HTTP side builds a :class:`Task` (tokens already checked against the context), hands it to the
scheduler, and reads :class:`Progress` / :class:`Partial` / :class:`Final` / :class:`Failed`
events from the task's sink, which the engine thread calls thread-safely.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlxcel.engine.sampling.grammar import Grammar
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.runtime.reasoning_budget import BudgetSpec
from mlxcel.server.runtime.timings import Timings

if TYPE_CHECKING:
    from mlxcel.drafters.prediction import PredictionCounts

_task_ids = itertools.count()


@dataclass
class GenerationOptions:
    """Everything about a request that is not its prompt."""

    sampler: SamplerParams
    seed: int = -1  # as requested (-1: a fresh random seed)
    n_predict: int = -1  # -1: until EOS or the context is full
    stop: list[str] = field(default_factory=list)
    n_probs: int = 0
    post_sampling_probs: bool = False
    cache_prompt: bool = True
    id_slot: int = -1
    return_tokens: bool = False
    return_progress: bool = False
    timings_per_token: bool = False
    stream: bool = False
    samplers: list[str] = field(default_factory=list)
    n_keep: int = 0  # context shift: prompt tokens kept at the start (-1: the whole prompt)
    n_discard: int = 0  # context shift: tokens dropped after them (0: half of the rest)
    n_indent: int = 0  # every line after the first indented by at least this much, or the generation ends
    t_max_predict_ms: int = -1  # past this much generation time the next newline ends it
    sse_ping_interval: int = -1  # seconds of silence after which a stream gets an SSE comment ping
    spec_type: str | None = None  # speculative.type: "none" decodes plainly; any other must be the server's
    spec_ngram_max: int | None = None  # speculative.ngram_size_n: prompt lookup's longest n-gram
    spec_n_max: int | None = None  # speculative.n_max (0: this request does not speculate)
    spec_n_min: int | None = None  # speculative.n_min
    spec_stochastic: bool | None = None  # speculative.stochastic_accept (mlxcel): overrides the environment switch
    draft_flags: bool = False  # mlxcel_draft_flags (mlxcel): stream chunks say which tokens were accepted drafts
    speculative_types: str = "none"  # echoed as generation_settings["speculative.types"]
    grammar: Grammar | None = None  # the output's constraint (grammar / json_schema / response_format / -j)
    reasoning_budget: BudgetSpec | None = None  # thinking tokens before the end tag is forced
    reasoning_format: str = "none"  # echoed in generation_settings
    lora: dict[int, float] | None = None  # the request's LoRA scales by adapter id (None: the server's global ones)
    prediction: list[int] | None = None  # the predicted output's tokens (OpenAI's prediction): a draft source
    # echoed in generation_settings, not otherwise used
    echo: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenProb:
    """One emitted token and the top alternatives at its position."""

    id: int
    value: float  # log-probability, or probability when post-sampling
    top: list[tuple[int, float]]


@dataclass
class Progress:
    total: int
    cache: int
    processed: int
    time_ms: int
    timings: Timings | None = None  # with timings_per_token: the prompt figures so far


@dataclass
class Partial:
    text: str
    tokens: list[int]
    probs: list[TokenProb]
    n_predicted: int
    timings: Timings | None = None
    drafted: list[bool] = field(default_factory=list)  # per token: an accepted draft (mlxcel_draft_flags)


@dataclass
class Result:
    content: str
    tokens: list[int]
    stop_type: str  # "eos" | "limit" | "word" | "none"
    stopping_word: str
    n_prompt: int
    n_predicted: int
    tokens_cached: int
    id_slot: int
    has_new_line: bool
    timings: Timings
    truncated: bool
    probs: list[TokenProb]
    prediction: PredictionCounts | None = None  # with a prediction: its accepted / rejected token counts


@dataclass
class Final:
    result: Result


@dataclass
class Failed:
    error: Exception


class Deferred(Exception):
    """Raised by a :class:`Job` that cannot run yet (its slot is busy): it is tried again after the
    next engine step."""


@dataclass
class Job:
    """Work that must run on the engine thread between steps (slot files, embeddings): ``run()``'s
    value or exception is handed to ``done(value, error)``."""

    run: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]


@dataclass
class Task:
    prompt_tokens: list[int]
    options: GenerationOptions
    sink: Callable[[Any], None]
    index: int = 0
    id: int = field(default_factory=lambda: next(_task_ids))
    t_arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # perf_counter time past which the engine ends the task (--timeout)
    media: Any = None  # the prompt's images (engine.vision.prompt.PromptMedia), None for a text prompt

    def cancel(self) -> None:
        self.cancelled.set()
