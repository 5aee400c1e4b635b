"""``tailguard.release.v1``: a gray-release / A/B decision, as a msgspec Struct.

Produced by :mod:`tailguard.agents.experiments`; a subscriber (a traffic router,
the gateway) can decode a record with
``msgspec.json.decode(value, type=ReleaseDecision)``. ``evidence`` is kept as a
plain object: per guardrail (``evidence.metrics["ttft_p95.max_ratio"]``) both
arms' ``value`` / ``interval`` / ``n``, the ``difference``, the effect's
``estimate`` and ``interval`` (ratio, difference or level), the anytime-valid
``p_value`` of "the guardrail holds" (compare with ``alpha``), a fixed-horizon
``p_value_fixed_horizon`` of "no difference" for reference, and ``status``;
plus ``srm``, ``pollution``, ``misaligned`` and per-arm ``arms`` summaries.
Intervals hold ``null`` for an unbounded side.

Prompt evidence: ``bad_requests`` (``rule``, ``ttft_ms_limit``, ``counts`` per
arm: a request is bad when it failed — error, timeout, rejected — or was ok
with a TTFT over the experiment's absolute TTFT guardrail, else over 800 ms);
``prompts`` and ``prompt_groups``, per arm, the prompt versions / groups
holding most of that arm's bad requests, worst first, each with ``requests``,
``bad``, ``bad_share``, ``bad_rate``, ``lift`` and ``exemplars`` (trace ids of
its slowest bad requests); and, when a ``hallucination_rate`` guardrail is
breached, ``hallucinations``: per arm the rating strata with hallucination
counts.
"""

from typing import Any, Literal

import msgspec

__all__ = ["RELEASE_DECISIONS", "ReleaseDecision"]

RELEASE_DECISIONS = ("rollback", "promote", "hold", "continue")


class ReleaseDecision(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One decision about one experiment; key: the experiment id."""

    schema: Literal["tailguard.release.v1"] = "tailguard.release.v1"
    event_id: str
    ts_ms: int
    experiment: str
    generation: int
    seq: int
    decision: Literal["rollback", "promote", "hold", "continue"]
    arm: str | None
    control: str
    reasons: list[str]
    reason_codes: list[str]
    evidence: dict[str, Any]
    weights: dict[str, float]
    planned_weights: dict[str, float]
    actor: str
    decided_at_ms: int
    method: str = ""
