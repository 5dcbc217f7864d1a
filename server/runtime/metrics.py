"""Server counters and their Prometheus text (``GET /metrics``, behind ``--metrics``), with
llama-server's metric names so existing dashboards keep working."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Metrics:
    t_start: int = field(default_factory=lambda: int(time.time()))  # unix time the server started
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    drafts_total: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # accepted drafts per block position
    per_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [rounds, drafted, accepted]
    declined: dict[str, int] = field(default_factory=dict)
    # a speculative server's shared ragged forwards (scheduler._ragged_step): iterations, rows, tokens, accepted
    verify_steps_total: int = 0
    verify_rows_total: int = 0
    verify_tokens_total: int = 0
    verify_accepted_total: int = 0
    last_step: tuple[int, int, int] = (0, 0, 0)  # the last one's rows, tokens in the forward, drafts accepted  # reason -> requests the server did not speculate
    # the throughput gauges' window, as upstream's buckets: [steps, seconds] since the last scrape
    # (each GET /metrics resets them); generation steps leave out each request's first token
    prompt_bucket: list[float] = field(default_factory=lambda: [0, 0.0])
    predict_bucket: list[float] = field(default_factory=lambda: [0, 0.0])

    def record_declined(self, reason: str) -> None:
        """A request asked to speculate and the server decoded it plainly (``speculation.DECLINED_*``)."""
        self.declined[reason] = self.declined.get(reason, 0) + 1

    def record_round(self, kind: str, proposed: int, accepted: int) -> None:
        """One speculative verify round (nothing when no draft was verified)."""
        if proposed <= 0:
            return
        self.draft_tokens_total += proposed
        self.draft_accepted_total += accepted
        self.drafts_total += 1
        if len(self.accepted_per_position) < accepted:
            self.accepted_per_position.extend([0] * (accepted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1
        totals = self.per_kind.setdefault(kind, [0, 0, 0])
        totals[0] += 1
        totals[1] += proposed
        totals[2] += accepted

    def record_request(self, prompt_n: int, cache_n: int, prompt_ms: float, predicted_n: int,
                       predicted_ms: float, n_tokens: int) -> None:
        self.prompt_tokens_total += prompt_n
        self.prompt_tokens_cached_total += cache_n
        self.prompt_seconds_total += prompt_ms / 1e3
        self.tokens_predicted_total += predicted_n
        self.tokens_predicted_seconds_total += predicted_ms / 1e3
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
        self.prompt_bucket[0] += prompt_n
        self.prompt_bucket[1] += prompt_ms / 1e3
        self.predict_bucket[0] += max(predicted_n - 1, 0)
        self.predict_bucket[1] += predicted_ms / 1e3

    def reset_buckets(self) -> None:
        """Start a new window for the throughput gauges (upstream does it on every scrape)."""
        self.prompt_bucket = [0, 0.0]
        self.predict_bucket = [0, 0.0]

    def record_step(self, rows: int, tokens: int, accepted: int) -> None:
        """One iteration's shared verify forward: its rows, the tokens it carried, the drafts accepted."""
        self.verify_steps_total += 1
        self.verify_rows_total += rows
        self.verify_tokens_total += tokens
        self.verify_accepted_total += accepted
        self.last_step = (rows, tokens, accepted)

    def record_decode(self, rows: int) -> None:
        self.n_decode_total += 1
        self.n_busy_slots_total += rows

    def render(self, processing: int, deferred: int) -> str:
        def rate(n, s):
            return n / s if s > 0 else 0.0

        rows = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens",
             self.prompt_tokens_total),
            ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache",
             self.prompt_tokens_cached_total),
            ("prompt_seconds_total", "counter", "Total time spent processing prompts", self.prompt_seconds_total),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed",
             self.tokens_predicted_total),
            ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens",
             self.tokens_predicted_seconds_total),
            ("n_decode_total", "counter",
             "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
             self.n_decode_total),
            ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated",
             self.draft_tokens_total),
            ("spec_decode_num_accepted_tokens_total", "counter",
             "Speculative: Total draft tokens accepted by the target model", self.draft_accepted_total),
            ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps",
             self.drafts_total),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", rate(*self.prompt_bucket)),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s",
             rate(*self.predict_bucket)),
            ("requests_processing", "gauge", "Number of requests processing", processing),
            ("requests_deferred", "gauge", "Number of requests deferred", deferred),
            ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
             rate(self.n_busy_slots_total, self.n_decode_total)),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out.append(f"# HELP llamacpp:{name} {help_text}")
            out.append(f"# TYPE llamacpp:{name} {kind}")
            out.append(f"llamacpp:{name} {value:g}" if isinstance(value, float) else f"llamacpp:{name} {value}")
        if self.accepted_per_position:
            name = "spec_decode_num_accepted_tokens_per_pos_total"
            out.append(f"# HELP llamacpp:{name} Accepted tokens per draft position")
            out.append(f"# TYPE llamacpp:{name} counter")
            for i, n in enumerate(self.accepted_per_position):
                out.append(f'llamacpp:{name}{{position="{i}"}} {n}')
        # mlxcel's own: rounds (and the two token counts) per drafter kind
        for name, help_text, col in (
                ("spec_decode_rounds_total", "Speculative: verify rounds (one target forward each), per drafter kind", 0),
                ("spec_decode_draft_tokens_total", "Speculative: drafted tokens verified, per drafter kind", 1),
                ("spec_decode_accepted_tokens_total", "Speculative: drafted tokens accepted, per drafter kind", 2)):
            if not self.per_kind:
                break
            out.append(f"# HELP mlxcel:{name} {help_text}")
            out.append(f"# TYPE mlxcel:{name} counter")
            for kind, totals in sorted(self.per_kind.items()):
                out.append(f'mlxcel:{name}{{draft_kind="{kind}"}} {totals[col]}')
        # the shared verify forward's figures, once one has run (a server that never speculates shows
        # upstream's names only, as the per-kind rows above)
        if self.verify_steps_total:
            for name, help_text, value in (
                    ("verify_steps_total", "Speculative: iterations of the shared ragged forward (verifying, plain and prefilling rows)",
                     self.verify_steps_total),
                    ("verify_rows_total", "Speculative: rows in those forwards, summed", self.verify_rows_total),
                    ("verify_tokens_total", "Speculative: tokens those forwards carried (pending + drafts, prompt chunks), summed",
                     self.verify_tokens_total),
                    ("verify_accepted_total", "Speculative: drafts accepted in those forwards", self.verify_accepted_total)):
                out.append(f"# HELP mlxcel:{name} {help_text}")
                out.append(f"# TYPE mlxcel:{name} counter")
                out.append(f"mlxcel:{name} {value}")
            rows_, tokens_, accepted_ = self.last_step
            for name, help_text, value in (
                    ("verify_step_rows", "Speculative: rows in the last shared forward", rows_),
                    ("verify_step_tokens", "Speculative: tokens in the last shared forward", tokens_),
                    ("verify_step_accepted", "Speculative: drafts accepted in the last shared forward", accepted_)):
                out.append(f"# HELP mlxcel:{name} {help_text}")
                out.append(f"# TYPE mlxcel:{name} gauge")
                out.append(f"mlxcel:{name} {value}")
        if self.declined:
            name = "spec_decode_declined_total"
            out.append(f"# HELP mlxcel:{name} Speculative: requests decoded plainly although a drafter is loaded, "
                       "per reason")
            out.append(f"# TYPE mlxcel:{name} counter")
            for reason, n in sorted(self.declined.items()):
                out.append(f'mlxcel:{name}{{reason="{reason}"}} {n}')
        return "\n".join(out) + "\n"
