"""Speculative decoding in the server: what the command line asks for, the drafter loaded once at
startup, and one ``engine.speculative.session.SpeculativeSession`` per speculating request.

Which kind runs is ``drafters.registry.choose`` on the flags, exactly as ``mlxcel generate``
chooses it: ``--spec-type`` (upstream's names; every n-gram type is served by prompt lookup,
since every rule here is lossless and the proposer can only change speed), ``--draft-kind``
(mlxcel), ``-md`` alone (by the checkpoint's structure: a drafter-only checkpoint runs on its
round loop, an ordinary model drafts as a draft model; upstream would load it and never draft)
and ``--spec-default`` (prompt lookup). Blocks:

* prompt lookup: ``--spec-ngram-simple-size-m`` caps the block (default the kind's, 32, not
  upstream's 48: a 48-token verify forward is expensive where the forward is compute-bound);
  blocks start at 8 tokens and double after each fully accepted block; the longest n-gram matched
  is ``--spec-ngram-simple-size-n`` (default 3, shorter suffixes after it, down to 1), and the
  governor (``drafters.lookup.governor``) may pause low-yield rows unless ``--draft-adaptive off``;
* a draft model: ``--spec-draft-n-max`` tokens per round (default 3, as upstream);
* the model-based drafters: ``--spec-draft-n-max`` or, by default, what the drafter declares
  (DFlash/Muse ``block_size - 1``, DSpark ``block_size``; MTP 3). These read the prompt's hidden
  states before their first round: a speculating row computes them with one extra target pass
  over its prompt (the slot's own prefill does not keep them); it runs after the first token is
  sampled, so its time is in the request's predicted_ms.

``--spec-draft-n-min N``: a block shorter than N is not verified (the row decodes plainly).

Per request, ``speculative.n_max`` / ``speculative.n_min`` (upstream's fields) narrow the block;
``speculative.n_max: 0`` makes the request a plain one. Requests asking for token probabilities
(``n_probs`` / logprobs) decode plainly, since verify rounds do not produce per-token
alternatives, and so does a sampling request on a greedy-only drafter (DSpark), with one warning.
The rule is the session's, as on the CLI; ``speculative.stochastic_accept`` (mlxcel) overrides
``MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT`` for one request.
"""

from __future__ import annotations

import logging

from mlxcel.drafters.loading import DrafterSource, load
from mlxcel.drafters.registry import DrafterKind
from mlxcel.engine.model.loaded_model import LoadedModel
from mlxcel.engine.sampling.grammar_matcher import GrammarMatcher
from mlxcel.engine.speculative.session import SpeculativeSession, decline_reason
from mlxcel.server.runtime.speculation_settings import SpeculationSettings
from mlxcel.server.runtime.task import GenerationOptions

log = logging.getLogger(__name__)

class Speculation:
    """A server's drafter setup, loaded: one session per speculating request."""

    def __init__(self, settings: SpeculationSettings, source: DrafterSource, target: LoadedModel):
        self.settings = settings
        self.source = source
        self.target = target

    @classmethod
    def load(cls, settings: SpeculationSettings, target: LoadedModel, prefill_step: int = 512) -> Speculation:
        """Load what the drafter needs (at startup, so no request ever pays the disk load)."""
        for note in settings.choice.notes:
            log.warning("%s", note)
        source = load(settings.choice, target, lookup=settings.lookup, prefill_step=prefill_step)
        declared = source.declared_block
        n_max = declared if settings.n_max is None else settings.n_max
        if settings.kind.model_based and n_max > declared:
            log.warning("--spec-draft-n-max %d exceeds what the %s drafter proposes per block; using %d",
                        n_max, settings.kind.name, declared)
            n_max = declared
        settings = SpeculationSettings(settings.choice, n_max=n_max, n_min=min(settings.n_min, n_max),
                                       lookup=settings.lookup, synth_probs=settings.synth_probs)
        if settings.synth_probs:
            log.warning("synthetic speculative acceptance is on (--spec-synth-*), for benchmarking: drafts are "
                        "accepted at random whatever the target says, so the output is not the target's")
        log.warning("Drafter loaded: %s (block %d, %s); excluded from request timings", source.description, n_max,
                    _rule_note(settings.kind))
        return cls(settings, source, target)

    @property
    def kind(self) -> DrafterKind:
        return self.settings.kind

    @property
    def draft_kind(self) -> str:
        """What the timings report: the round loop (``dflash`` for the whole DFlash family)."""
        return self.settings.kind.loop

    def eligible(self, opts: GenerationOptions) -> bool:
        """Whether a request speculates: not when it asks for token probabilities, nor when its own
        ``speculative.n_max`` is 0, nor when the session would decline it (a sampling request on a
        greedy-only drafter: one warning, then the request joins the plain decode batch), nor when its
        ``speculative.type`` is ``none``."""
        if opts.n_probs > 0 or opts.spec_type == "none":
            return False
        if opts.spec_n_max is not None and opts.spec_n_max <= 0:
            return False
        reason = decline_reason(self.kind.drafter_class(), opts.sampler)
        if reason is not None:
            log.warning("%s", reason)
            return False
        return True

    def start(self, opts: GenerationOptions, sequence: list[int], seed: int, prefill_step: int,
              grammar: GrammarMatcher | None = None) -> SpeculativeSession:
        """A started session for a request whose prefill just picked the last token of ``sequence``
        (``grammar``: the request's matcher when it is constrained)."""
        s = self.settings
        assert s.n_max is not None  # resolved at load
        n_max = min(s.n_max, opts.spec_n_max) if opts.spec_n_max else s.n_max
        n_min = min(n_max, opts.spec_n_min if opts.spec_n_min is not None else s.n_min)
        session = SpeculativeSession(self.source.new(n_min, ngram_max=opts.spec_ngram_max), opts.sampler,
                                     n_max=n_max, n_min=n_min, synth_probs=s.synth_probs,
                                     stochastic=opts.spec_stochastic, kind=self.draft_kind, grammar=grammar)
        session.prime(self.target.model, sequence[:-1], self.target.make_cache, prefill_step)
        session.begin(sequence, seed)
        log.info("request speculates: %s drafter, rule=%s, block %d", session.drafter.kind, session.rule, n_max)
        return session


def _rule_note(kind: DrafterKind) -> str:
    if kind.greedy_only:
        return "greedy-argmax at temperature 0; sampling requests decoded plainly"
    if kind.model_based:
        return "greedy-argmax at temperature 0, argmax-against-argmax above it unless stochastic acceptance is on"
    return "greedy-argmax at temperature 0, sampler-match above it"
