"""A prompt experiment with blind human feedback: requests, then ratings of them.

Deterministic (seeded) generators for the hallucination guardrail
(``hallucination_rate: {max_diff: d}``, :mod:`tailguard.streams.experiment`):

``requests``        ``tailguard.inference.v1`` events of one experiment, arms
                    50/50 at random, each served with its arm's prompt version,
                    with a trace id (derived from the event id) and, when
                    ``slow_share`` > 0, that share of requests with a TTFT over
                    the 800 ms SLO (the bad requests the prompt evidence lists,
                    with exemplar traces).
``blind_feedback``  one ``kind: feedback`` interaction per request, labelled
                    ``hallucination`` with its arm's rate, ``partial`` 5 %, else
                    ``correct``, by one of ``raters`` raters. Blind, as the
                    gateway's rating hand-off makes it: the record names the
                    request (``request_event_id``) only — no experiment, no
                    variant, no prompt version; the guard joins it to the arm.

Run against a broker (the demo)::

    python -m tailguard.simulator.feedback --broker localhost:9092 [--prefix P] \\
        [--experiment support-prompt-v3] [--control-rate 0.03] [--treatment-rate 0.08]

Timeline (event time; ``start`` = 30 min ago, minute-aligned)::

    start ──── requests (10 min) ────┤ +1 min ── tail (10 min) ──┤
               ▲ sent first; once the worker closed their minutes (tailguard.sli),
               the feedback (event time: request + 1 min) follows, then the tail,
               whose later event time lets the guard close the buckets the
               feedback joined and judge them.

3 % → 8 % over 3,000 requests (≈1,500 rated per arm) is rolled back within a
minute of the feedback (``tests/integration/test_hallucination.py``).
"""

import argparse
import hashlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MIN_MS",
    "SPAN_MS",
    "batches",
    "blind_feedback",
    "requests",
    "trace_id",
]

MIN_MS = 60_000
#: Event-time span of one batch of requests.
SPAN_MS = 10 * MIN_MS
#: Share of ratings labelled ``partial`` (not a hallucination).
PARTIAL_RATE = 0.05


def trace_id(event_id: str) -> str:
    """A W3C-shaped trace id (32 hex digits) derived from the event id (no randomness)."""
    return hashlib.sha256(event_id.encode()).hexdigest()[:32]


def requests(
    experiment: str,
    start: int,
    n: int,
    rng: random.Random,
    *,
    versions: Mapping[str, str] | None = None,
    service: str = "chat",
    model: str = "llama-8b",
    span_ms: int = SPAN_MS,
    slow_share: float = 0.0,
) -> list[dict[str, Any]]:
    """``n`` requests of ``experiment`` spread over ``span_ms`` from ``start``.

    ``versions``: arm → prompt version (default control ``prompt-v1``, treatment
    ``prompt-v2``). With ``slow_share`` 0 the draws from ``rng`` are two per request
    (arm, TTFT), so a seed gives the same requests as before the option existed.
    """
    served = dict(versions or {"control": "prompt-v1", "treatment": "prompt-v2"})
    if set(served) != {"control", "treatment"}:
        msg = f"versions must name the arms control and treatment, got {sorted(served)}"
        raise ValueError(msg)
    if not 0.0 <= slow_share < 1.0:
        msg = f"slow_share must be in [0, 1), got {slow_share!r}"
        raise ValueError(msg)
    out = []
    for i in range(n):
        arm = "treatment" if rng.random() < 0.5 else "control"
        ttft = rng.lognormvariate(5.0, 0.3)
        if slow_share and rng.random() < slow_share:
            ttft += 1_000.0  # over the 800 ms TTFT SLO: a bad request
        event_id = f"{experiment}-{start}-{i}"
        out.append(
            {
                "event_id": event_id,
                "ts_ms": start + i * span_ms // n,
                "service": service,
                "model": model,
                "status": "ok",
                "ttft_ms": round(ttft, 3),
                "e2e_ms": round(ttft + 400.0, 3),
                "output_tokens": 20,
                "experiment": experiment,
                "variant": arm,
                "prompt_version": served[arm],
                "unit_id": f"{experiment}-u{i}",
                "trace_id": trace_id(event_id),
            }
        )
    return out


def blind_feedback(
    reqs: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float],
    rng: random.Random,
    *,
    raters: int = 6,
    delay_ms: int = MIN_MS,
) -> list[dict[str, Any]]:
    """One rating per request; the record names the request only (no arm).

    ``rates``: arm → share of its requests labelled ``hallucination``.
    """
    out = []
    for r in reqs:
        u = rng.random()
        rate = rates[r["variant"]]
        label = "hallucination" if u < rate else "partial" if u < rate + PARTIAL_RATE else "correct"
        out.append(
            {
                "event_id": f"fb-{r['event_id']}",
                "ts_ms": r["ts_ms"] + delay_ms,
                "service": r["service"],
                "kind": "feedback",
                "label": label,
                "rater": f"rater-{rng.randrange(raters)}",
                "request_event_id": r["event_id"],
            }
        )
    return out


def batches(
    events: Sequence[Mapping[str, Any]], key: bytes, size: int = 200
) -> list[tuple[bytes, bytes]]:
    """``(key, JSON array of at most size events)`` messages."""
    return [
        (key, json.dumps(list(events[i : i + size])).encode()) for i in range(0, len(events), size)
    ]


def _wait_for_minutes(
    broker: str, topic: str, service: str, until_ms: int, timeout_s: float
) -> bool:
    """True once the SLI agent published a final window of ``service`` ending at or
    after ``until_ms`` (the worker has taken the requests up to there)."""
    from tailguard.console import follow

    for _key, value, _headers in follow(broker, topic, from_beginning=True, timeout_s=timeout_s):
        rec = json.loads(value or b"{}")
        if (
            rec.get("final")
            and (rec.get("series") or {}).get("service") == service
            and rec.get("window_end_ms", 0) >= until_ms
        ):
            return True
    return False


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - the demo's entry point
    from confluent_kafka import Producer

    from tailguard import catalogue as cat

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default="localhost:9092")
    p.add_argument("--prefix", default="")
    p.add_argument("--experiment", default="support-prompt-v3")
    p.add_argument("--service", default="support")
    p.add_argument("--model", default="llama-8b")
    p.add_argument("--control-version", default="support-v1")
    p.add_argument("--treatment-version", default="support-v3")
    p.add_argument("--control-rate", type=float, default=0.03)
    p.add_argument("--treatment-rate", type=float, default=0.08)
    p.add_argument("--requests", type=int, default=3_000)
    p.add_argument("--slow-share", type=float, default=0.005)
    p.add_argument("--raters", type=int, default=6)
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the worker")
    args = p.parse_args(argv)

    producer = Producer({"bootstrap.servers": args.broker, "linger.ms": 10})

    def send(topic: str, messages: list[tuple[bytes, bytes]]) -> None:
        for key, value in messages:
            producer.produce(args.prefix + topic, key=key, value=value)
            producer.poll(0)
        left = producer.flush(60)
        if left:
            msg = f"{left} messages to {args.prefix + topic} not delivered"
            raise SystemExit(msg)

    rng = random.Random(args.seed)
    versions = {"control": args.control_version, "treatment": args.treatment_version}
    start = int(time.time() * 1000) - 30 * MIN_MS
    start -= start % MIN_MS
    key = args.experiment.encode()

    def batch(at: int, n: int) -> list[dict[str, Any]]:
        return requests(
            args.experiment, at, n, rng, versions=versions, service=args.service,
            model=args.model, slow_share=args.slow_share,
        )  # fmt: skip

    reqs = batch(start, args.requests)
    send(cat.INFERENCE, batches(reqs, key))
    print(f"{len(reqs)} requests of {args.experiment} sent ({versions})", flush=True)
    if not _wait_for_minutes(
        args.broker, args.prefix + cat.SLI, args.service, start + SPAN_MS - MIN_MS, args.timeout
    ):
        print(f"the worker did not take the requests within {args.timeout:.0f}s", flush=True)
        return 1
    time.sleep(2.0)
    rates = {"control": args.control_rate, "treatment": args.treatment_rate}
    feedback = blind_feedback(reqs, rates, rng, raters=args.raters)
    rng.shuffle(feedback)
    send(cat.INTERACTIONS, batches(feedback, b"feedback"))
    labels = {k: sum(f["label"] == k for f in feedback) for k in ("hallucination", "partial")}
    print(f"{len(feedback)} blind ratings sent ({labels}; rates {rates})", flush=True)
    time.sleep(2.0)
    tail = batch(start + SPAN_MS + MIN_MS, args.requests // 10)
    send(cat.INFERENCE, batches(tail, key))
    print(f"{len(tail)} later requests sent (event time moves on)", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
