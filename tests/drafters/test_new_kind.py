"""A new drafter kind is one registry entry plus its own code: a toy kind declared in this module
(its class and its loader live here, nothing else of mlxcel names it) is registered through
``registry.register`` alone and then runs everywhere the built-in kinds run: the flags choose it,
``drafters.drafter_setup.set_up`` readies it, ``mlxcel generate`` (its real entry point, in process)
decodes with it, and the server's scheduler serves a request with it; greedy output equals plain
decoding's, and its proposals reach the verify rounds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import pytest

from mlxcel.drafters import registry
from mlxcel.drafters.drafter_setup import set_up
from mlxcel.drafters.registry import DrafterChoiceError, DrafterKind, choose
from mlxcel.drafters.source import DrafterSource, SourceRequest
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.drafter import Drafter
from mlxcel.engine.speculative.proposal import Proposal
from mlxcel.server.cli import generate
from mlxcel.server.runtime.config import ServerConfig
from mlxcel.server.runtime.scheduler import Scheduler
from mlxcel.server.runtime.speculation import Speculation
from mlxcel.server.runtime.speculation_settings import resolve
from mlxcel.server.runtime.task import Failed, Final, GenerationOptions, Task

PROMPT = "a b c a b c a b c a b"
N_PREDICT = 20


class RepeatDrafter(Drafter):
    """Drafts the pending token again, ``k`` times: deterministic, needs nothing, sometimes right."""

    kind = "repeat"
    deterministic = True

    def __init__(self):
        self.proposals = 0

    def start(self, sequence: Sequence[int], params: SamplerParams, seed: int) -> None:
        self.proposals = 0

    def propose(self, sequence: Sequence[int], k: int) -> Proposal:
        self.proposals += 1
        return Proposal([int(sequence[-1])] * k)

    def observe(self, sequence: Sequence[int], proposal: Proposal, accepted: int) -> None:
        pass


def load_repeat(request: SourceRequest) -> DrafterSource:
    """The toy kind's loader: nothing to read, a fresh drafter of the declared class per sequence."""
    cls = request.drafter
    return DrafterSource(lambda n_min, ngram_max: cls(), request.default_block, "repeat (the pending token again)")


REPEAT = DrafterKind("repeat", "repeat", (), "drafts the pending token again (a test kind)", "--draft-kind repeat",
                     "none", f"{__name__}:RepeatDrafter", f"{__name__}:load_repeat", default_block=4)


@pytest.fixture
def table():
    """The registry, put back as it was after the test."""
    saved = list(registry.KINDS), dict(registry.BY_NAME), dict(registry.BY_SPEC_TYPE), list(registry.SPEC_TYPES)
    yield registry
    registry.KINDS[:] = saved[0]
    registry.BY_NAME.clear()
    registry.BY_NAME.update(saved[1])
    registry.BY_SPEC_TYPE.clear()
    registry.BY_SPEC_TYPE.update(saved[2])
    registry.SPEC_TYPES[:] = saved[3]


@pytest.fixture
def repeat_kind(table):
    return table.register(REPEAT)


def test_a_registered_kind_is_chosen_checked_and_set_up(repeat_kind, tiny_llama):
    choice = choose(draft_kind="repeat")
    assert choice.kind is repeat_kind and "repeat" in registry.kind_names()
    with pytest.raises(DrafterChoiceError, match="repeat needs no draft model"):  # the default check
        choose(draft_kind="repeat", draft_model="x.gguf")
    setup = set_up(choice, tiny_llama)
    assert setup.declined is None and setup.probe_line is None and setup.capped_from is None
    assert setup.n_max == 4 and isinstance(setup.source.new(), RepeatDrafter)
    assert set_up(choice, tiny_llama, n_max=9).n_max == 9  # not model-based: the block asked for is kept


def generated(capsys, model_dir, *flags) -> tuple[str, str]:
    """``mlxcel generate`` in process: (the text, the full stdout)."""
    argv = ["-m", str(model_dir), "-p", PROMPT, "-n", str(N_PREDICT), "--no-chat-template", "--ignore-eos",
            "--temp", "0", *flags]
    assert generate.main(argv) == 0
    out = capsys.readouterr().out
    return out.split("[Performance]")[0], out


def test_mlxcel_generate_runs_a_registered_kind(repeat_kind, tiny_llama_dir, capsys):
    plain, _ = generated(capsys, tiny_llama_dir)
    text, out = generated(capsys, tiny_llama_dir, "--draft-kind", "repeat")
    assert text == plain
    m = re.search(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=(\d+) proposed=(\d+) ", out, re.M)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0


def served(lm, speculation) -> Final:
    events: list = []
    opts = GenerationOptions(sampler=SamplerParams(temperature=0.0), seed=7, n_predict=N_PREDICT, return_tokens=True,
                             cache_prompt=False)
    scheduler = Scheduler(lm, n_slots=1, n_ctx=256, speculation=speculation)
    scheduler.submit(Task(prompt_tokens=lm.tokenizer.encode(PROMPT), options=opts, sink=events.append))
    for _ in range(200):
        if events and isinstance(events[-1], Final | Failed):
            break
        scheduler._iteration()
    assert isinstance(events[-1], Final), events[-1]
    return events[-1]


def test_the_server_serves_a_registered_kind(repeat_kind, tiny_llama):
    settings = resolve(ServerConfig(draft_kind="repeat"))
    assert settings.spec_type == "repeat"  # what /props' speculative.types names: upstream has no name for it
    speculation = Speculation.load(settings, tiny_llama, measure_cost=False)
    assert speculation.kind is repeat_kind and speculation.settings.n_max == 4
    plain = served(tiny_llama, None).result
    drafted = served(tiny_llama, speculation).result
    assert drafted.tokens == plain.tokens
    assert drafted.timings.draft.kind == "repeat" and drafted.timings.draft.proposed > 0


def test_a_loader_that_contradicts_its_kinds_declaration_is_named(table, tiny_llama):
    """A kind declared model-based whose loader hands back a source (not a network to bind) fails at load
    with a message naming the kind and its loader, not somewhere inside a request."""
    table.register(replace(REPEAT, name="repeat-model", model_based=True))
    with pytest.raises(TypeError, match=r"repeat-model kind's loader \(.*:load_repeat\) returned a DrafterSource"):
        set_up(choose(draft_kind="repeat-model"), tiny_llama)


def test_the_table_is_as_declared_again_after_a_registration():
    assert not {"repeat", "repeat-model"} & set(registry.BY_NAME) and REPEAT not in registry.KINDS
    with pytest.raises(DrafterChoiceError, match="unknown kind"):
        choose(draft_kind="repeat")
