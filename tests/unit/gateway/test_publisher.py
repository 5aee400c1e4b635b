"""The publisher never blocks a request, bounds what it holds, and drains in order."""

from typing import Any

from tailguard.schemas.columnar import is_columnar, rows_of

from tailguard.gateway.publisher import EventPublisher


def _event(i: int, model: str = "m", gaps: int = 0) -> dict[str, Any]:
    return {"event_id": f"e{i}", "service": "s", "model": model, "itl_ms": [1.5] * gaps}


def _values(producer: Any) -> list[dict[str, Any]]:
    return [e for r in producer.sent for e in rows_of(r["value"])]


def test_inference_events_go_out_as_columns_keyed_by_their_series(producer: Any) -> None:
    pub = EventPublisher(
        "unused:9092", "t.inference", batch_events=10, producer=producer, columns=True
    )
    for i in range(6):
        pub.submit(_event(i, model="a" if i % 2 else "b"))
    assert pub.drain() == 6
    producer.poll()
    assert {r["key"] for r in producer.sent} == {b"s|a|default|default", b"s|b|default|default"}
    assert all(is_columnar(r["value"]) for r in producer.sent)
    assert [e["event_id"] for e in _values(producer)] == ["e0", "e2", "e4", "e1", "e3", "e5"]
    assert pub.stats.published == 6 and pub.buffered == 0


def test_a_full_buffer_drops_the_oldest_and_counts_it(producer: Any) -> None:
    pub = EventPublisher("unused:9092", "t", buffer_events=3, producer=producer)
    for i in range(5):
        pub.submit(_event(i))
    assert pub.stats.dropped == 2 and pub.queued == 3
    pub.drain()
    producer.poll()
    assert [e["event_id"] for e in _values(producer)] == ["e2", "e3", "e4"]


def test_in_flight_is_bounded_while_the_broker_is_away(producer: Any) -> None:
    producer.down = True
    pub = EventPublisher(
        "unused:9092", "t", batch_events=10, max_in_flight=20, buffer_events=100, producer=producer
    )
    for i in range(50):
        pub.submit(_event(i))
    while pub.drain():
        pass
    assert pub.in_flight == 20 and pub.queued == 30 and pub.buffered == 50
    producer.down = False
    producer.poll()
    while pub.drain():
        producer.poll()
    assert pub.stats.published == 50 and pub.buffered == 0
    assert [e["event_id"] for e in _values(producer)] == [f"e{i}" for i in range(50)]


def test_a_batch_that_times_out_is_requeued_in_front(producer: Any) -> None:
    pub = EventPublisher("unused:9092", "t", batch_events=5, producer=producer)
    for i in range(8):
        pub.submit(_event(i))
    pub.drain()  # e0..e4 handed to the producer
    producer.fail_pending()
    assert pub.stats.requeued == 5 and pub.queued == 8 and pub.in_flight == 0
    while pub.drain():
        producer.poll()
    assert [e["event_id"] for e in _values(producer)] == [f"e{i}" for i in range(8)]


def test_messages_stay_under_the_size_a_worker_accepts(producer: Any) -> None:
    pub = EventPublisher(
        "unused:9092", "t", batch_events=100, max_message_bytes=20_000, producer=producer
    )
    for i in range(100):
        pub.submit(_event(i, gaps=400))  # ~1.7 kB each: 11 a message
    pub.submit(_event(999, gaps=10_000))  # larger than a message: never sent, counted
    while pub.drain():
        producer.poll()
    assert all(len(r["value"]) <= 20_000 for r in producer.sent)
    assert len(producer.sent) >= 9 and len(_values(producer)) == 100
    assert pub.stats.oversize == 1


def test_one_bound_covers_the_deque_and_librdkafka(producer: Any) -> None:
    producer.down = True
    pub = EventPublisher("unused:9092", "t", batch_events=4, buffer_events=10, producer=producer)
    for i in range(8):
        pub.submit(_event(i))
    while pub.drain():
        pass
    for i in range(8, 15):
        pub.submit(_event(i))
    assert pub.buffered == 10 and pub.stats.dropped == 5
    producer.down = False
    producer.poll()
    while pub.drain():
        producer.poll()
    kept = [e["event_id"] for e in _values(producer)]
    assert len(kept) == 10 and kept[:8] == [f"e{i}" for i in range(8)]
