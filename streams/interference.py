"""Tenant interference: one tenant's P99 jitter explained by another's load and KV fragmentation.

The detector lives in four modules: the policy, state and transitions
(:mod:`~tailguard.streams.interference_model`), what it reads
(:mod:`~tailguard.streams.interference_inputs`), how a minute is judged
(:mod:`~tailguard.streams.interference_judge`), and here, how a point is
offered and a transition explained.

Tenants of one deployment (service, model) share its serving
instances; when one tenant's load grows, the others can queue longer and
stream slower, and the KV cache they share fragments (the article: 1 tenant
→ fragmentation 0.08, P99 142 ms; 4 tenants → 0.37, 289 ms). This detector
names the *victim*, the *noisy neighbour(s)* and the evidence.

Inputs, per deployment, in event time:

- the closed 1-minute point of every series (the figures of its final
  1-minute snapshot), folded per tenant across variants (:class:`TenantMinute`:
  counts add up; a P99 is the count-weighted mean of the variants' P99s,
  exact when the tenant has one variant);
- the KV minutes of the instances (:class:`~tailguard.streams.kv.KvMinute`,
  through a :class:`KvView`), which say which tenants share an instance and
  how fragmented it is.

Every closed minute ``E`` (see *Readiness*), for each tenant ``v`` with at
least ``min_requests`` requests in ``E``::

    baseline   B = [anchor − baseline_minutes, anchor)      anchor = E, or the first minute
                                                            of v's current episode (frozen)
    jitter     J = max over trigger metrics of  P99_v(E) / median_B P99_v
    own load   L = rate_v(E) / median_B rate_v              rate = requests / 60 s; a minute
                                                            without points counts as 0
    neighbour  n ≠ v with ≥ min_requests in E and rate_n(E) / median_B rate_n ≥ neighbour_load_min
               sharing ≥ 1 *affected* instance with v: an instance whose KV minutes in
               (E − kv_minutes, E] hold sequences of both, and whose token-weighted
               fragmentation there exceeds its own over B by ≥ frag_rise_min

    v is a candidate at E  ⇔  J ≥ jitter_ratio  ∧  L ≤ own_load_max  ∧  ≥ 1 neighbour

A victim must not have brought the load itself (``L``), and the neighbour's
load and the instances' fragmentation must both have risen: a fleet-wide
surge (everyone's load up) or a slow model (no neighbour) is not interference.

Lifecycle per (deployment, victim), like the burn-rate breaches::

    minute       · · C C C C C C · C C · · · · · ·
    streak         1 2 3                                    C candidate, · not
    transitions        ▲ opened          ▲ resolved         (persist_minutes = 3,
                       anchor frozen at  quiet for            resolve_minutes = 3)
                       the streak's start resolve_minutes

- **opened** after ``persist_minutes`` consecutive candidate minutes. The
  baselines (victim P99s, every tenant's rate, each shared instance's
  fragmentation) are frozen at the streak's first minute, so a long incident
  never becomes its own baseline.
- **updated** when the set of neighbours changes, the severity rises, or the
  jitter moved by ``material_change`` at least ``update_interval_minutes``
  after the last transition.
- **resolved** after ``resolve_minutes`` consecutive minutes that are not
  candidates.

Severity: ``page`` when the victim's SLO compliance in a candidate minute falls
below ``page_below_compliance``, else ``ticket`` (the jitter itself need not
break an SLO to be worth a ticket).

Attribution ranks the neighbours by their share of the excess load,
``(rate_n(E) − base_n) / Σ (rate_k(E) − base_k)``. Evidence (the breach's
``sli``) holds the victim's P99s now and at baseline, its own load, the
affected instances with their fragmentation now and at baseline (each, and
token-weighted over all of them) and the neighbour's share of their KV
tokens, and the Pearson correlation between the victim's P99 and each
neighbour's rate over the last ``correlation_minutes``.

*Readiness*: series of a deployment report their minutes independently (each
when its own watermark passes). Minute ``E`` is evaluated once every series
has reported ``E`` or later (a series with no request in ``E`` reports a
later minute). A series more than ``stall_minutes`` of event time behind the
others has either stopped or lags (in a compressed replay one partition can
run many minutes ahead of another): the caller says when to stop waiting for
it (:func:`stalled`, ``force``; the agent waits a few seconds of wall-clock
time). A point for an evaluated minute is kept (later baselines use it) and
counted as late.

Everything is a function of the points and KV minutes in their arrival order;
``breach_id`` is derived from the deployment, the victim and the opening
minute, and each transition's ``event_id`` is ``breach_id:seq``, so a replay
yields the same breaches.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tailguard.streams.interference_inputs import (
    KvBook,
    KvView,
    SeriesHistory,
    SliPoint,
    TenantMinute,
    tenant_minutes,
)
from tailguard.streams.interference_judge import evaluate, ready_minutes, stalled
from tailguard.streams.interference_model import (
    KIND,
    METRICS,
    DeploymentState,
    Gate,
    InterferencePolicy,
    InterferenceTransition,
    interference_breach_id,
)
from tailguard.streams.kv import MINUTE_MS, KvMinute

__all__ = [
    "KIND",
    "METRICS",
    "DeploymentState",
    "Detector",
    "Gate",
    "InterferencePolicy",
    "InterferenceTransition",
    "KvBook",
    "KvView",
    "Offered",
    "SeriesHistory",
    "SliPoint",
    "TenantMinute",
    "evaluate",
    "explain",
    "interference_breach_id",
    "judge_ready",
    "offer",
    "ready_minutes",
    "stalled",
    "tenant_minutes",
]

# ------------------------------------------------------------------- offer


@dataclass(slots=True)
class Offered:
    """What :func:`offer` did with one point."""

    #: False for a point of a minute the series already reported (a replay).
    accepted: bool
    #: True for a point of a minute that was already evaluated (kept for baselines).
    late: bool
    transitions: list[InterferenceTransition] = field(default_factory=list)
    #: Minutes evaluated.
    evaluated: list[int] = field(default_factory=list)


def offer(
    state: DeploymentState,
    history: SeriesHistory,
    point: SliPoint,
    exemplars: Sequence[str],
    histories: Callable[[], Iterable[SeriesHistory]],
    kv: KvView,
    policy: InterferencePolicy,
    gate: Callable[[DeploymentState], Gate] | None = None,
) -> Offered:
    """Fold one series' point in (``history``: that series' history, updated in place)
    and evaluate every minute that became ready.

    ``histories()`` returns all the deployment's series histories (``history``
    included, as updated); it is called only when a minute is evaluated, so a
    store can load them lazily. ``gate(state)`` says how to evaluate: ``"hold"``
    nothing yet, ``"wait"`` only minutes every series reported, ``"force"``
    without series that stalled (:func:`stalled`; the default).
    """
    if not history.add(point, exemplars, policy.history_minutes):
        return Offered(accepted=False, late=False)
    if not state.note(history.variant, history.tenant, point.end_ms):
        return Offered(accepted=True, late=True)
    return judge_ready(state, histories, kv, policy, gate)


def judge_ready(
    state: DeploymentState,
    histories: Callable[[], Iterable[SeriesHistory]],
    kv: KvView,
    policy: InterferencePolicy,
    gate: Callable[[DeploymentState], Gate] | None = None,
) -> Offered:
    """Evaluate every minute of the deployment that is ready (see :func:`offer`)."""
    out = Offered(accepted=True, late=False)
    mode = "force" if gate is None else gate(state)
    if mode == "hold":
        return out
    ready = ready_minutes(state, policy, force=mode == "force")
    if ready:
        every = list(histories())
        for end in ready:
            out.transitions.extend(evaluate(state, end, every, kv, policy))
            out.evaluated.append(end)
    return out


def _hhmm(ms: int) -> str:
    minutes = ms // MINUTE_MS
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}Z"


def explain(t: InterferenceTransition) -> str:
    """One line for people: who suffers, from whom, and the evidence."""
    ev = t.evidence
    who = f"{t.service}/{t.model} tenant {t.victim}"
    if t.state == "resolved":
        minutes = (t.at_ms - t.opened_ms) // MINUTE_MS
        return (
            f"{who}: interference resolved, {minutes} min after it opened at {_hhmm(t.opened_ms)}"
        )
    metric = ev.get("metric") or "latency"
    now = ev.get("victim_p99_ms", {}).get(metric)
    base = ev.get("victim_p99_baseline_ms", {}).get(metric)
    ratio = ev.get("victim_p99_ratio", {}).get(metric)
    parts = [f"{who}: {metric.removesuffix('_ms').upper()} P99"]
    if now is not None and base is not None and ratio is not None:
        parts.append(f"{now:.0f} ms = {ratio:.1f}x its baseline {base:.0f} ms")
    load = ev.get("victim_load_ratio")
    parts.append(f"(own load {load:.2f}x)" if load is not None else "")
    blame = []
    for a in t.attribution:
        ratio_n = a.get("load_ratio")
        corr = a.get("correlation")
        bit = f"{a['tenant']} ({a.get('share', 0):.0%} of the excess load"
        bit += f", load {ratio_n:.1f}x" if ratio_n is not None else ", new load"
        bit += f", correlation {corr:.2f}" if corr is not None else ""
        blame.append(bit + ")")
    parts.append("because of " + ", ".join(blame) if blame else "")
    shared = ev.get("shared_instances") or []
    if shared:
        f_now = ev.get("fragmentation")
        f_base = ev.get("fragmentation_baseline")
        parts.append(
            f"on {len(shared)} shared instance(s), KV fragmentation {f_base:.2f} -> {f_now:.2f}"
        )
    return " ".join(p for p in parts if p)


# ------------------------------------------------------------- convenience


class Detector:
    """The detector with its state in memory (tests, notebooks; the agent keeps it in tables).

    ``offer_point`` folds a series' 1-minute point in and evaluates every
    minute that became ready; ``offer_kv`` adds an instance's KV minute.
    """

    def __init__(self, policy: InterferencePolicy | None = None) -> None:
        self.policy = policy or InterferencePolicy()
        self.kv = KvBook()
        self.states: dict[str, DeploymentState] = {}
        self.histories: dict[str, dict[str, SeriesHistory]] = {}
        self.late = 0

    def offer_kv(self, instance: str, minute: KvMinute) -> bool:
        return self.kv.add(instance, minute)

    def offer_point(
        self,
        series: tuple[str, str, str, str],
        point: SliPoint,
        exemplars: Sequence[str] = (),
    ) -> list[InterferenceTransition]:
        service, model, variant, tenant = series
        dkey = f"{service}|{model}"
        state = self.states.setdefault(dkey, DeploymentState(service=service, model=model))
        per = self.histories.setdefault(dkey, {})
        history = per.setdefault(f"{variant}|{tenant}", SeriesHistory(variant, tenant))
        done = offer(state, history, point, exemplars, per.values, self.kv, self.policy)
        self.late += done.late
        return done.transitions
