"""Capacity scenarios: a load ramp across the knee, a failing MoE expert, a drifting index.

Deterministic (seeded) generators of ``tailguard.inference.v1`` events for the
capacity agent (:mod:`tailguard.agents.capacity`), one deployment each:

``load_ramp``       service/``ramp``: concurrency 1 → 13 → 2 in 10 s intervals
                    over a deployment whose latency is flat up to ``knee`` (8)
                    and rises steeply after — ``e2e = 1 s·(1 + 3·((c−k)/k)^1.5)``;
                    arrivals per interval follow Little's law ``λ = c / e2e``.
                    The instance starts with 5 warm-up requests (TTFT 1.2 s).
``expert_failure``  service/``moe``: 20 req/s over 8 experts (request j → expert
                    j mod 8); expert ``expert`` fails 40 % of its requests from
                    its 100th to its 250th, then recovers.
``index_drift``     service/``rag``: top-1 similarities of index ``kb`` drift from
                    Beta(18, 3) (first 300) to Beta(8, 5) (next 300).

Run them against a broker (the demo)::

    python -m tailguard.simulator.capacity --broker localhost:9092 [--prefix P]

It also writes one GPU sample (``h1:0``: 20 % utilisation, 50 % memory) so the
scale-down guard has its inputs. Event time starts 3 hours ago (hour-aligned).
"""

import argparse
import json
import time
from typing import Any

import numpy as np

__all__ = [
    "INTERVAL_MS",
    "KNEE",
    "capacity_scenarios",
    "expert_failure",
    "gpu_sample",
    "index_drift",
    "load_ramp",
    "ramp_schedule",
]

INTERVAL_MS = 10_000
KNEE = 8.0


def _event(service: str, model: str, ts: int, e2e: float, tag: str, **kw: Any) -> dict[str, Any]:
    ttft = kw.pop("ttft", 0.2 * e2e)
    return {
        "event_id": f"{service}-{model}-{tag}",
        "ts_ms": int(ts),
        "service": service,
        "model": model,
        "status": kw.pop("status", "ok"),
        "e2e_ms": round(e2e, 3),
        "ttft_ms": round(ttft, 3),
        "output_tokens": 50,
        "instance": f"{model}-0",
        "host": "h1",
        "gpu_ids": [0],
        **kw,
    }


def ramp_latency(c: float, knee: float = KNEE) -> float:
    """The ramp deployment's latency at concurrency ``c``: flat to the knee, steep after."""
    return 1000.0 if c <= knee else 1000.0 * (1 + 3 * ((c - knee) / knee) ** 1.5)


def ramp_schedule() -> list[float]:
    """Concurrency per interval: up 1 → 13 (30), hold (4), down to 2 (10), low (16)."""
    up = [1 + 12 * i / 29 for i in range(30)]
    down = [13 - 11 * i / 9 for i in range(10)]
    return up + [13.0] * 4 + down + [2.0] * 16


def load_ramp(start_ms: int, seed: int = 3, service: str = "chat") -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = [
        _event(
            service, "ramp", start_ms - 5_000 + w * 100, 1500.0, f"w{w}", ttft=1200.0, warmup=True
        )
        for w in range(5)
    ]
    for i, c in enumerate(ramp_schedule()):
        e2e = ramp_latency(c)
        n = max(1, round(c * INTERVAL_MS / e2e))
        for j in range(n):
            ts = start_ms + i * INTERVAL_MS + j * INTERVAL_MS // n
            lat = e2e * float(1 + 0.03 * rng.standard_normal())
            out.append(_event(service, "ramp", ts, lat, f"{i}-{j}"))
    # One late-arriving request to close the last low intervals.
    out.append(_event(service, "ramp", start_ms + 70 * INTERVAL_MS, 1000.0, "tail"))
    return out


def expert_failure(
    start_ms: int, expert: int = 5, n: int = 3200, service: str = "chat"
) -> list[dict[str, Any]]:
    out = []
    for j in range(n):
        e = j % 8
        nth = j // 8  # this expert's request number
        failing = e == expert and 100 <= nth < 250 and nth % 5 < 2
        out.append(
            _event(
                service,
                "moe",
                start_ms + j * 50,
                400.0,
                str(j),
                status="error" if failing else "ok",
                expert_ids=[e],
            )
        )
    return out


def index_drift(start_ms: int, seed: int = 3, service: str = "chat") -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed + 1)
    sims = np.concatenate([rng.beta(18, 3, 300), rng.beta(8, 5, 300)])
    return [
        _event(
            service,
            "rag",
            start_ms + j * 500,
            400.0,
            str(j),
            rag_top1_similarity=round(float(s), 6),
            rag_index="kb",
        )
        for j, s in enumerate(sims)
    ]


def gpu_sample(now_ms: int) -> dict[str, Any]:
    return {
        "ts_ms": now_ms,
        "host": "h1",
        "gpu": 0,
        "util_gpu_pct": 20.0,
        "mem_used_mib": 40_000,
        "mem_total_mib": 80_000,
    }


def capacity_scenarios(start_ms: int, seed: int = 3) -> dict[str, list[dict[str, Any]]]:
    """The three scenarios by deployment model name (one Kafka key each keeps order)."""
    return {
        "ramp": load_ramp(start_ms, seed),
        "moe": expert_failure(start_ms),
        "rag": index_drift(start_ms, seed),
    }


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - the demo's entry point
    from confluent_kafka import Producer

    from tailguard import catalogue as cat

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default="localhost:9092")
    p.add_argument("--prefix", default="")
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args(argv)
    producer = Producer({"bootstrap.servers": args.broker, "linger.ms": 10})
    now = int(time.time() * 1000)
    producer.produce(args.prefix + cat.GPU, key=b"h1:0", value=json.dumps(gpu_sample(now)))
    start = (now // 3_600_000 - 3) * 3_600_000
    total = 0
    for model, events in capacity_scenarios(start, args.seed).items():
        for i in range(0, len(events), 200):
            producer.produce(
                args.prefix + cat.INFERENCE,
                key=model.encode(),
                value=json.dumps(events[i : i + 200]),
            )
            producer.poll(0)
        total += len(events)
    left = producer.flush(60)
    print(f"capacity scenarios: {total} events produced, {left} undelivered")
    return 1 if left else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
