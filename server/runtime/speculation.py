"""Speculative decoding in the server: what the command line asks for, the drafter loaded once at
startup, and one ``engine.speculative.session.SpeculativeSession`` per speculating request.

Which kind runs is ``drafters.registry.choose`` on the flags, exactly as ``mlxcel generate``
chooses it: ``--spec-type`` (upstream's names; each n-gram type has its own drafter under
``drafters.lookup``, and several n-gram types combine as upstream combines them: each round asks
them in upstream's order and the first that drafts serves it), ``--draft-kind`` (mlxcel), ``-md``
alone (by the checkpoint's structure: a drafter-only checkpoint runs on its round loop, an ordinary
model drafts as a draft model; upstream would load it and never draft) and ``--spec-default``
(prompt lookup). Blocks:

* prompt lookup (ngram-simple): ``--spec-ngram-simple-size-m`` caps the block (default the kind's,
  32, not upstream's 48: a 48-token verify forward is expensive where the forward is compute-bound);
  blocks start at 8 tokens and double after each fully accepted block; the longest n-gram matched
  is ``--spec-ngram-simple-size-n`` (default 3, shorter suffixes after it, down to 1), and the
  governor (``drafters.lookup.governor``) may pause low-yield rows unless ``--draft-adaptive off``;
* the other n-gram types: their own ``--spec-ngram-*`` sizes, upstream's defaults
  (``speculation_settings``). Their drafters learn from a slot's earlier requests: the server hands
  :meth:`Speculation.start` the slot a request runs in, and the source hands the drafter that slot's
  state (the n-gram cache's counts, the map drafters' per-key memory), as upstream keeps them per
  sequence id;
* a draft model: ``--spec-draft-n-max`` tokens per round (default 3, as upstream);
* the model-based drafters: ``--spec-draft-n-max`` or, by default, what the drafter declares
  (DFlash/Muse ``block_size - 1``, DSpark ``block_size``; MTP 3). These read the prompt's hidden
  states before their first round: the slot's own prefill keeps them (``feature_layers``; a slot
  keeps the features of what its cache holds, for the next request's prefix), so no request runs
  a second pass over its prompt. The exactness probe runs at load (``drafters.drafter_setup``, as
  on the CLI), for every verify width the drafter can use, so no request pays for it either.

A target whose recurrent state a verify round cannot restore (``cache.recurrent.unsupported_reason``)
declines speculation: one warning at startup, and every request it declines is counted
(``mlxcel:spec_decode_declined_total{reason="target-state"}``), as are sampling requests a
greedy-only drafter declines (``reason="greedy-only"``).

``--spec-draft-n-min N``: a block shorter than N is not verified (the row decodes plainly).

Rows that share the verify forward (prompt lookup, a draft model) draft fewer tokens as the batch
widens, by the forward's cost model measured at load (``engine.speculative.verify_cost``; with
``MLXCEL_VERIFY_COST=learn`` then learned from the steps the server runs; one row keeps its whole
block, and the cap never goes below ``n_min``).

Per request, ``speculative.n_max`` / ``speculative.n_min`` (upstream's fields) narrow the block;
``speculative.n_max: 0`` makes the request a plain one. Requests asking for token probabilities
(``n_probs`` / logprobs) decode plainly, since verify rounds do not produce per-token
alternatives, and so does a sampling request on a greedy-only drafter (DSpark), with one warning.
The rule is the session's, as on the CLI; ``speculative.stochastic_accept`` (mlxcel) overrides
``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT`` for one request.

A request's predicted output (OpenAI's ``prediction``, ``GenerationOptions.prediction``) is a draft
source of its own (``drafters.prediction``): on a server without a drafter :class:`PredictionSessions`
opens a session for such a request alone; on a server with a token-only drafter the prediction is
asked first each round and the server's drafter serves the rounds it has nothing for
(``draft_kind`` ``prediction+<the server's>``); a model-based drafter's rows read the target's hidden
states every round, so there the prediction drafts alone. Its block is ``prediction.BLOCK`` (a
request's ``speculative.n_max`` narrows it), the server's drafter keeping its own.
"""

from __future__ import annotations

import logging

from mlxcel.drafters import prediction
from mlxcel.drafters.drafter_setup import set_up
from mlxcel.drafters.registry import DrafterKind
from mlxcel.drafters.source import DrafterSource
from mlxcel.engine.cache.recurrent import unsupported_reason
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.speculative import verify_cost
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.session import SpeculativeSession, decline_reason
from mlxcel.engine.speculative.target_features import TargetFeatures
from mlxcel.engine.speculative.verify_cost import LearnedCost, VerifyCost
from mlxcel.server.runtime.speculation_settings import SpeculationSettings
from mlxcel.server.runtime.task import GenerationOptions

log = logging.getLogger(__name__)

DECLINED_TARGET = "target-state"  # the target's recurrent state cannot be restored after a verify round
DECLINED_GREEDY_ONLY = "greedy-only"  # a sampling request on a greedy-only drafter
DECLINED_CACHE = "cache-window"  # the row's cache cannot drop a draft now (a wrapped window, a chunk boundary)
DECLINED_IMAGES = "images"  # a prompt with images: its prefill keeps no features for a drafter that reads them


class Speculation:
    """A server's drafter setup, loaded: one session per speculating request."""

    def __init__(self, settings: SpeculationSettings, source: DrafterSource | None, target: LoadedModel,
                 declined: str | None = None, verify_cost: VerifyCost | LearnedCost | None = None):
        self.settings = settings
        self.source = source
        self.target = target
        self.declined = declined  # why this target never speculates (None: it does)
        self.verify_cost = verify_cost  # caps each row's drafts in a shared verify forward (None: no cap)

    @classmethod
    def load(cls, settings: SpeculationSettings, target: LoadedModel, prefill_step: int = 512, *,
             measure_cost: bool = True) -> Speculation:
        """Load what the drafter needs and probe the verify widths it can use (``drafters.drafter_setup``,
        as ``mlxcel generate`` does; at startup, so no request ever pays the disk load or the probe),
        then settle this server's own part: the per-request settings, and, for a drafter whose rows
        share a verify forward, that forward's cost model (``engine.speculative.verify_cost``:
        measured here, and learned while serving with ``=learn``, unless ``MLXCEL_VERIFY_COST`` gives
        it; never measured when ``measure_cost`` is False, as for ranks serving in lockstep, which
        must all derive the same draft caps)."""
        for note in settings.choice.notes:
            log.warning("%s", note)
        setup = set_up(settings.choice, target, n_max=settings.n_max, lookup=settings.lookup,
                       prefill_step=prefill_step)
        if setup.declined is not None:
            log.warning("Speculation declined for this target: %s. Every request is decoded plainly (counted in "
                        "mlxcel:spec_decode_declined_total).", setup.declined)
            return cls(settings, None, target, declined=setup.declined)
        n_max = setup.n_max
        if setup.capped_from is not None:
            log.warning("--spec-draft-n-max %d exceeds what the %s drafter proposes per block; using %d",
                        setup.capped_from, settings.kind.name, n_max)
        settings = SpeculationSettings(settings.choice, n_max=n_max, n_min=min(settings.n_min, n_max),
                                       lookup=settings.lookup, synth_probs=settings.synth_probs)
        if settings.synth_probs:
            log.warning("synthetic speculative acceptance is on (--spec-synth-*), for benchmarking: drafts are "
                        "accepted at random whatever the target says, so the output is not the target's")
        log.warning("Drafter loaded: %s (block %d, %s); excluded from request timings", setup.source.description,
                    n_max, _rule_note(settings.kind))
        if setup.probe_line is not None:
            log.warning("%s", setup.probe_line)
        cost = None
        if not settings.kind.model_based:
            cost = verify_cost.load(target.model, target.make_cache, target.vocab_size, may_measure=measure_cost)
            if cost is not None:
                log.warning("Shared verify forward: %s; each row's drafts shrink as the batch widens", cost.describe())
        return cls(settings, setup.source, target, verify_cost=cost)

    @property
    def kind(self) -> DrafterKind:
        return self.settings.kind

    @property
    def draft_kind(self) -> str:
        """What the timings report: the round loop (``dflash`` for the whole DFlash family; the members'
        joined by ``+`` for combined n-gram types, ``prompt-lookup+ngram-cache``: upstream's timings
        name no drafter, and its draft counts sum over every implementation, as these do)."""
        return self.settings.kind.loop

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """The target layers a model-based drafter reads (a prefill keeps their outputs), else None."""
        drafter = self.source.model_drafter if self.source is not None else None
        return tuple(drafter.feature_layers) if drafter is not None else None

    def declines(self, opts: GenerationOptions) -> str | None:
        """Why the server declines to speculate a request that asked for it (a ``DECLINED_*`` reason,
        logged): the target's state cannot be restored, or a greedy-only drafter got a sampling
        request. None when it speculates, or when the request itself opted out."""
        if not self.asks(opts):
            return None
        if self.declined is not None:
            return DECLINED_TARGET
        if opts.prediction and self.kind.model_based:
            return None  # the prediction drafts alone (module docstring), whatever the sampler
        reason = decline_reason(self.kind.drafter_class(), opts.sampler)
        if reason is not None:
            log.warning("%s", reason)
            return DECLINED_GREEDY_ONLY
        return None

    def asks(self, opts: GenerationOptions) -> bool:
        """Whether a request wants speculation: not when it asks for token probabilities, nor when its own
        ``speculative.n_max`` is 0, nor when its ``speculative.type`` is ``none``."""
        return asks(opts)

    def eligible(self, opts: GenerationOptions) -> bool:
        """Whether a request speculates (see :meth:`declines`; a declined one joins the plain decode batch)."""
        return self.asks(opts) and self.declines(opts) is None

    def start(self, opts: GenerationOptions, sequence: list[int], seed: int,
              features: TargetFeatures | None = None, grammar: GrammarMatcher | None = None,
              slot: int | None = None) -> SpeculativeSession:
        """A started session for a request whose prefill just picked the last token of ``sequence``;
        ``features``: what that prefill kept for a model-based drafter (every token but the last);
        ``grammar``: the request's matcher when it is constrained; ``slot``: the slot the request runs in,
        whose state a drafter that learns across a slot's requests continues (None: a fresh one)."""
        s = self.settings
        assert s.n_max is not None and self.source is not None  # resolved at load
        if opts.prediction and self.kind.model_based:
            return prediction_session(self.target, opts, sequence, seed, grammar, n_min=s.n_min)
        block = max(s.n_max, prediction.BLOCK) if opts.prediction else s.n_max
        n_max = min(block, opts.spec_n_max) if opts.spec_n_max else block
        n_min = min(n_max, opts.spec_n_min if opts.spec_n_min is not None else s.n_min)
        drafter: Drafter = self.source.new(n_min, ngram_max=opts.spec_ngram_max, slot=slot)
        kind = self.draft_kind
        if opts.prediction:
            drafter = prediction.PredictionFirst(prediction.PredictionDrafter(opts.prediction, n_min=n_min), drafter,
                                                 s.n_max, self.target.vocab_size)
            kind = f"{prediction.KIND}+{kind}"
        session = SpeculativeSession(drafter, opts.sampler, n_max=n_max, n_min=n_min, synth_probs=s.synth_probs,
                                     stochastic=opts.spec_stochastic, kind=kind, grammar=grammar,
                                     eos_ids=self.target.eos_token_ids)
        if session.model_drafter is not None:
            if features is None or features.length != len(sequence) - 1:
                raise RuntimeError("a model-based drafter needs the prefill's features of every cached token")
            session.adopt(self.target.model, features)
        session.begin(sequence, seed)
        log.info("request speculates: %s drafter, rule=%s, block %d", session.drafter.kind, session.rule, n_max)
        return session


def asks(opts: GenerationOptions) -> bool:
    """Whether a request wants speculation: not when it asks for token probabilities, nor when its own
    ``speculative.n_max`` is 0, nor when its ``speculative.type`` is ``none``."""
    if opts.n_probs > 0 or opts.spec_type == "none":
        return False
    return opts.spec_n_max is None or opts.spec_n_max > 0


def prediction_session(target: LoadedModel, opts: GenerationOptions, sequence: list[int], seed: int,
                       grammar: GrammarMatcher | None, n_min: int = 0) -> SpeculativeSession:
    """A started session drafting from the request's prediction alone (``prediction.BLOCK`` tokens a
    round at most, or the request's ``speculative.n_max``)."""
    n_max = min(prediction.BLOCK, opts.spec_n_max) if opts.spec_n_max else prediction.BLOCK
    n_min = min(n_max, opts.spec_n_min if opts.spec_n_min is not None else n_min)
    session = SpeculativeSession(prediction.PredictionDrafter(opts.prediction or [], n_min=n_min), opts.sampler,
                                 n_max=n_max, n_min=n_min, stochastic=opts.spec_stochastic, kind=prediction.KIND,
                                 grammar=grammar, eos_ids=target.eos_token_ids)
    session.begin(sequence, seed)
    log.info("request speculates on its prediction (%d tokens), rule=%s, block %d", len(opts.prediction or []),
             session.rule, n_max)
    return session


class PredictionSessions:
    """What a server without a drafter speculates with: a session for each request that brings a
    prediction, drafting from it alone. The scheduler asks it what it would ask a :class:`Speculation`."""

    verify_cost = None  # no cost model: a row drafts its whole block
    feature_layers = None

    def __init__(self, target: LoadedModel):
        self.target = target
        self._declined: str | None | bool = False  # False: not probed yet (the first prediction probes)

    def asks(self, opts: GenerationOptions) -> bool:
        return bool(opts.prediction) and asks(opts)

    def declines(self, opts: GenerationOptions) -> str | None:
        """``DECLINED_TARGET`` for a prediction on a target whose recurrent state a verify round cannot
        restore (probed once, on the engine thread, when the first prediction arrives), else None."""
        if not self.asks(opts):
            return None
        if self._declined is False:
            self._declined = unsupported_reason(self.target.model, self.target.make_cache)
            if self._declined is not None:
                log.warning("Predicted outputs declined for this target: %s. Such requests are decoded plainly.",
                            self._declined)
        return DECLINED_TARGET if self._declined else None

    def start(self, opts: GenerationOptions, sequence: list[int], seed: int,
              features: TargetFeatures | None = None, grammar: GrammarMatcher | None = None,
              slot: int | None = None) -> SpeculativeSession:
        return prediction_session(self.target, opts, sequence, seed, grammar)


def prediction_counts(opts: GenerationOptions, completion: list[int]) -> prediction.PredictionCounts | None:
    """A request's ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` (None without a
    prediction), from its completion's tokens (``prediction.prediction_counts``)."""
    if opts.prediction is None:
        return None
    return prediction.prediction_counts(opts.prediction, completion)


def _rule_note(kind: DrafterKind) -> str:
    if kind.greedy_only:
        return "greedy-argmax at temperature 0; sampling requests decoded plainly"
    if kind.model_based:
        return "greedy-argmax at temperature 0, argmax-against-argmax above it unless stochastic acceptance is on"
    return "greedy-argmax at temperature 0, sampler-match above it"
