"""Where a worker's time per event goes, from a py-spy profile of its steady state.

    py-spy record -p <worker pid> -d 30 -r 50 -f raw -o steady.txt
    python -m bench.breakdown steady.txt --events-per-s 8300

Every sample of the worker's main thread (the event loop: every agent, timer and
aiokafka coroutine runs there) is put in the first category whose frame appears
in its stack; a category's share of those samples, times the wall time per event
at the given rate, is its cost in µs an event. Samples of other threads
(aiokafka's consumer thread, librdkafka callers, followers) are listed apart:
they compete for the GIL and the CPU but are not on the event loop.

Pass the rate the worker folded events at while the profile ran (its log's
``applied=`` counter, or the benchmark's ``applied_per_s``).
"""

import argparse
from collections import Counter
from pathlib import Path

#: (category, function whose frame must be in the stack (a prefix of its name), function
#: that must be called under it or None).
_INGEST = "register_ingest.<locals>.process"
_DISPATCH = "register_ingest.<locals>.dispatch"
_FOLD = "SeriesFolder.fold"
CATEGORIES: list[tuple[str, str, str | None]] = [
    ("ingest: decode + validate", _INGEST, "decode_columns"),
    ("ingest: decode + validate", _INGEST, "decode"),
    ("ingest: forward (columns, group, pack)", _DISPATCH, "route_columns"),
    ("ingest: capacity/A-B/prompt fan-out", _DISPATCH, "build.<locals>.forward"),
    ("ingest: columns, group in place", _DISPATCH, "columns_by_partition"),
    ("ingest: other (series, placement)", _DISPATCH, None),
    ("fold: checkpoints", "SeriesFolder.checkpoint", None),
    ("fold: fold + minute closes", _FOLD, "fold_many"),
    ("fold: other (series lookup, SLO resolution)", _FOLD, None),
    ("ingest: other (faust stream, sends)", _INGEST, None),
    ("SLI agent: decode forwarded", "register_sli.<locals>.sli", "decode_groups"),
    ("SLI: provisional snapshots", "register_sli.<locals>.provisional", None),
    ("capacity agent", "register_capacity.<locals>.capacity", None),
    ("interference agents", "register_interference.<locals>", None),
    ("faust producer buffer", "ProducerBuffer._handle_pending", None),
    ("aiokafka sender", "Sender._", None),
    ("faust conductor (message dispatch)", "Conductor._compile_message_handler", None),
    ("aiokafka connection reads", "AIOKafkaConnection._read", None),
    ("event loop idle (select)", "EpollSelector.select", None),
]


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def classify(stack: str) -> str:
    frames = _frames(stack)
    for name, root, sub in CATEGORIES:
        at = next((i for i, f in enumerate(frames) if f.startswith(root)), None)
        if at is None:
            continue
        if sub is None or any(f.split(" (")[0] == sub for f in frames[at + 1 :]):
            return name
    return "other"


def breakdown(path: Path) -> tuple[Counter[str], Counter[str]]:
    """Samples per category on the main thread, and per thread root elsewhere."""
    main: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        if "Thread._bootstrap" in stack:
            frames = _frames(stack)
            run = next((f for f in frames if f.startswith(("Thread.run", "WorkerThread.run"))), "")
            after = frames[frames.index(run) + 1] if run and run in frames[:-1] else run
            threads[after.split(" (")[0] or "thread"] += n
        else:
            main[classify(stack)] += n
    return main, threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", type=Path, help="py-spy raw output (-f raw)")
    ap.add_argument("--events-per-s", type=float, required=True)
    args = ap.parse_args()
    main_samples, threads = breakdown(args.profile)
    total = sum(main_samples.values())
    if not total:
        raise SystemExit(f"{args.profile}: no samples of the main thread")
    per_event_us = 1e6 / args.events_per_s
    print(f"{'main thread (event loop)':40s} {'share':>7s} {'µs/event':>9s}")
    order = [c[0] for c in CATEGORIES if c[0] in main_samples] + ["other"]
    for name in dict.fromkeys(order):
        share = main_samples[name] / total
        print(f"{name:40s} {share:7.1%} {share * per_event_us:9.1f}")
    print(f"{'total':40s} {1:7.1%} {per_event_us:9.1f}")
    if threads:
        print("\nother threads (samples relative to the main thread's)")
        for name, n in threads.most_common(8):
            print(f"  {name:38s} {n / total:7.1%}")


if __name__ == "__main__":
    main()
