"""The gateway part of ``make demo``: the official openai client drives the gateway.

``python -m tailguard.gateway.demo --base-url http://127.0.0.1:8080/v1`` keeps
``--concurrency`` streamed chat completions going for random users (the unit of
the canary experiment), and every ``--every`` seconds prints the requests per
second, the share the canary upstream served (read from each chunk's
``system_fingerprint``) and the TTFT the client saw per upstream. It follows
``tailguard.releases`` at the same time and prints each decision as it arrives;
once a rollback has taken the canary's share to zero it keeps going for
``--after`` seconds to show it staying there, then stops (or at ``--duration``).
Needs the ``openai`` package (the dev extra, which ``make demo`` installs).
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import threading
import time
from collections import defaultdict
from typing import Any


def _follow_releases(
    broker: str, topic: str, out: list[dict[str, Any]], stop: threading.Event
) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": broker,
            "group.id": f"tailguard-gateway-demo-{os.getpid()}",
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "log_level": 2,
        }
    )
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.5)
            value = msg.value() if msg is not None and not msg.error() else None
            if value:
                out.append(json.loads(value))
    finally:
        consumer.close()


async def _drive(args: argparse.Namespace) -> int:
    import openai

    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="demo", max_retries=0)
    window: dict[str, list[float]] = defaultdict(list)
    errors = 0
    done = asyncio.Event()

    async def lane() -> None:
        nonlocal errors
        rng = random.Random()
        while not done.is_set():
            user = f"user-{rng.randrange(args.users)}"
            t0 = time.perf_counter()
            ttft, upstream = None, "?"
            try:
                stream = await client.chat.completions.create(
                    model=args.model,
                    messages=[{"role": "user", "content": "Explain tail latency briefly."}],
                    stream=True,
                    stream_options={"include_usage": True},
                    user=user,
                )
                async for chunk in stream:
                    if chunk.system_fingerprint:
                        upstream = chunk.system_fingerprint.removeprefix("tg-sim-")
                    if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                        ttft = (time.perf_counter() - t0) * 1000
            except openai.OpenAIError:
                errors += 1
                await asyncio.sleep(0.2)
                continue
            if ttft is not None:
                window[upstream].append(ttft)

    stop = threading.Event()
    decisions: list[dict[str, Any]] = []
    follower = threading.Thread(
        target=_follow_releases,
        args=(args.broker, args.releases_topic, decisions, stop),
        daemon=True,
    )
    follower.start()
    lanes = [asyncio.create_task(lane()) for _ in range(args.concurrency)]
    start = time.monotonic()
    shown = 0
    rolled_back_at: float | None = None
    status = 1
    try:
        while time.monotonic() - start < args.duration:
            await asyncio.sleep(args.every)
            now = time.monotonic() - start
            counts = {k: len(v) for k, v in window.items()}
            total = sum(counts.values())
            share = counts.get("canary", 0) / total if total else 0.0
            p50 = {k: statistics.median(v) for k, v in window.items() if v}
            ttfts = "  ".join(f"TTFT p50 {k} {v:5.0f} ms" for k, v in sorted(p50.items()))
            print(
                f"  t={now:5.1f}s  {total / args.every:5.1f} req/s  canary share "
                f"{share:6.1%}  {ttfts}  errors {errors}",
                flush=True,
            )
            window.clear()
            for d in decisions[shown:]:
                reasons = "; ".join(d.get("reasons", []))[:160]
                print(
                    f"  ▶ tailguard.releases: {d.get('decision')} {d.get('experiment')} "
                    f"arm={d.get('arm')} weights={d.get('weights')} — {reasons}",
                    flush=True,
                )
            shown = len(decisions)
            rolled = any(d.get("decision") == "rollback" for d in decisions)
            if rolled and rolled_back_at is None and total and share == 0.0:
                rolled_back_at = now
                print("  ✔ the gateway took the canary out of the traffic", flush=True)
            if rolled_back_at is not None and now - rolled_back_at >= args.after:
                status = 0
                break
        else:
            print(f"  no rollback seen within {args.duration:.0f}s", flush=True)
    finally:
        done.set()
        for t in lanes:
            t.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        stop.set()
        await client.close()
    return status


def main() -> None:
    from tailguard.catalogue import RELEASES, default_prefix

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--broker", default=os.environ.get("TAILGUARD_BROKER", "localhost:9092"))
    ap.add_argument("--releases-topic", default=default_prefix() + RELEASES)
    ap.add_argument("--model", default="llama-3.1-8b-instruct")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--users", type=int, default=500)
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--after", type=float, default=10.0)
    args = ap.parse_args()
    raise SystemExit(asyncio.run(_drive(args)))


if __name__ == "__main__":
    main()
