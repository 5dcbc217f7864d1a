"""The report lines: exact formats and the arithmetic behind each field."""

from __future__ import annotations

import re

from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.engine.speculative.block import RoundResult
from mlxcel.engine.speculative.report import acceptance_line, diagnostic_line, report_lines
from mlxcel.engine.speculative.session import SpeculativeCounters
from mlxcel.engine.speculative.switches import diagnostics_enabled

LINE = re.compile(
    r"^\[Speculative acceptance\] rule=(?P<rule>[a-z-]+) rounds=(?P<rounds>\d+) proposed=(?P<proposed>\d+) "
    r"positions_tested=(?P<tested>\d+) accepted=(?P<accepted>\d+) per_position_acceptance=(?P<ppa>\d\.\d{4}) "
    r"acceptance_rate=(?P<ar>\d\.\d{4}) mean_accepted_len=(?P<mal>\d+\.\d{4}) \((?P<desc>.+)\)$"
)
DIAG = re.compile(
    r"^\[Speculative acceptance diagnostic\] closed_form_sum_min=(\d\.\d{4}) closed_form_sum_prod=(\d\.\d{4}) \(.+\)$"
)


def counters_of(rounds: list[tuple[int, int, int]], rule="stochastic") -> SpeculativeCounters:
    c = SpeculativeCounters(rule)
    for proposed, accepted, tested in rounds:
        c.add(RoundResult([0] * (accepted + 1), proposed, accepted, tested, sum_min=0.75 * tested,
                          sum_prod=0.5 * tested, diagnosed=tested))
    return c


def test_acceptance_line_fields_and_definitions():
    # 3 rounds of 4: all-accept, reject at 2, reject at 0; plus a plain step that is not a round.
    c = counters_of([(4, 4, 4), (4, 1, 2), (4, 0, 1), (0, 0, 0)])
    m = LINE.match(acceptance_line(c))
    assert m, acceptance_line(c)
    assert m["rule"] == "stochastic" and m["desc"].startswith("stochastic (modified rejection sampling")
    assert (int(m["rounds"]), int(m["proposed"]), int(m["tested"]), int(m["accepted"])) == (3, 12, 7, 5)
    assert m["ppa"] == f"{5 / 7:.4f}"  # accepted / positions_tested
    assert m["ar"] == f"{5 / 12:.4f}"  # accepted / proposed
    assert m["mal"] == f"{5 / 3:.4f}"  # accepted / rounds
    assert c.plain_steps == 1


def test_the_example_line_from_the_spec_reproduces():
    c = SpeculativeCounters("stochastic", rounds=153, proposed=612, positions_tested=195, accepted=46)
    assert acceptance_line(c).startswith(
        "[Speculative acceptance] rule=stochastic rounds=153 proposed=612 positions_tested=195 accepted=46 "
        "per_position_acceptance=0.2359 acceptance_rate=0.0752 mean_accepted_len=0.3007 (stochastic"
    )


def test_empty_run_prints_zeros_not_a_division_error():
    m = LINE.match(acceptance_line(SpeculativeCounters("sampler-match")))
    assert m and m["ppa"] == m["ar"] == "0.0000" and m["mal"] == "0.0000"


def test_diagnostic_line_averages_over_tested_positions():
    c = counters_of([(4, 4, 4), (4, 1, 2)], rule="sampler-match")
    m = DIAG.match(diagnostic_line(c))
    assert m and m.group(1) == "0.7500" and m.group(2) == "0.5000"


def test_diagnostic_without_q_says_unknown():
    c = SpeculativeCounters("sampler-match", rounds=1, proposed=4, positions_tested=2, accepted=1)
    assert "closed_form_sum_min=n/a closed_form_sum_prod=n/a" in diagnostic_line(c)


def test_report_lines_order_and_switch():
    c = counters_of([(4, 2, 3)], rule="sampler-match")
    pl = PromptLookupDrafter()
    lines = report_lines(c, diagnostics=True, drafter=pl)
    assert [line.split("]")[0] + "]" for line in lines] == [
        "[Speculative acceptance]", "[Speculative acceptance diagnostic]", "[Prompt lookup]"]
    assert len(report_lines(c, diagnostics=False)) == 1


def test_diag_env_switch():
    assert diagnostics_enabled({"MLXCEL_SPECULATIVE_ACCEPT_DIAG": "1"}) is True
    assert diagnostics_enabled({"MLXCEL_SPECULATIVE_ACCEPT_DIAG": "off"}) is False
    assert diagnostics_enabled({}) is False
