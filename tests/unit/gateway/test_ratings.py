"""Blind rating hand-off: what the gateway forwards for human rating carries no arm."""

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tailguard.gateway.config import GatewayConfig, Routing
from tailguard.gateway.publisher import EventPublisher
from tailguard.gateway.ratings import (
    ARM_REVEALING,
    rating_payload,
    response_text,
    sampled,
    user_messages,
)
from tailguard.gateway.routing import PRIMARY, ArmRoute, ExperimentRoute, Layer, Router
from tailguard.gateway.server import Gateway
from tailguard.gateway.upstream import SimUpstream, UpstreamProfile

from .conftest import FakeProducer

SYSTEM = "You are prompt v2: answer in haiku."


def routing() -> Routing:
    prompt = ExperimentRoute(
        "prompt-exp",
        (
            ArmRoute("control", 0.5, prompt_version="prompt-v1"),
            ArmRoute("treatment", 0.5, prompt_version="prompt-v2"),
        ),
        "control",
    )
    canary = ExperimentRoute(
        "canary-exp",
        (ArmRoute("control", 0.5, PRIMARY), ArmRoute("canary", 0.5, "canary")),
        "control",
    )
    return Routing(Router((Layer("prompt", (prompt,)), Layer("release", (canary,)))))


def test_the_rating_record_carries_no_arm_and_joins_back_by_request_event_id(
    tmp_path: Path,
) -> None:
    events_out, ratings_out = FakeProducer(), FakeProducer()

    async def main() -> Gateway:
        primary = TestServer(SimUpstream(UpstreamProfile("primary", 5, (2,), 3)).app)
        canary = TestServer(SimUpstream(UpstreamProfile("canary", 5, (2,), 3)).app)
        await primary.start_server()
        await canary.start_server()
        config = GatewayConfig(
            upstreams={"primary": str(primary.make_url("/")), "canary": str(canary.make_url("/"))},
            routing=routing(),
            state_file=tmp_path / "state.json",
            follow_releases=False,
            service="chat",
            rating_rate=1.0,
        )
        gw = Gateway(
            config,
            publisher=EventPublisher("unused:9092", "t.inference", producer=events_out),
            ratings=EventPublisher(
                "unused:9092",
                "t.ratings",
                producer=ratings_out,
                key=lambda e: str(e["request_event_id"]),
            ),
        )
        server = TestServer(gw.app)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                for i, stream in enumerate((True, False) * 6):
                    body = {
                        "model": "m",
                        "stream": stream,
                        "messages": [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"question {i}"},
                        ],
                    }
                    hdr = {"x-tailguard-unit": f"user-{i}", "x-sim-tokens": "3"}
                    async with http.post(
                        f"{server.make_url('')}/v1/chat/completions", json=body, headers=hdr
                    ) as r:
                        assert r.status == 200
                        await r.read()
        finally:
            await server.close()
            await primary.close()
            await canary.close()
        return gw

    gw = asyncio.run(main())
    for pub, prod in ((gw.publisher, events_out), (gw.ratings, ratings_out)):
        assert pub is not None
        while pub.drain():
            pass
        prod.poll()
    events = {e["event_id"]: e for r in events_out.sent for e in json.loads(r["value"])}
    ratings = [(r, e) for r in ratings_out.sent for e in json.loads(r["value"])]
    assert len(events) == 12 and len(ratings) == 12
    arms_seen = set()
    for record, rating in ratings:
        request = events[rating["request_event_id"]]  # the join key
        assert len(request["experiments"]) == 2  # the request was in both layers' experiments
        assert record["headers"] is None  # no x-tailguard-* or any other header
        assert not ARM_REVEALING & rating.keys()
        text = json.dumps(rating)
        for tag in request["experiments"]:
            arms_seen.add(tag["variant"])
            for value in tag.values():
                assert value not in text, (value, rating)
        assert SYSTEM not in text and "prompt-v" not in text and "canary" not in text
        assert rating["messages"][0]["role"] == "user"
        assert rating["messages"][0]["content"].startswith("question ")
        assert rating["response"]  # the answer a rater judges
    assert arms_seen >= {"control", "treatment", "canary"}  # both arms were rated


def test_response_text_from_json_and_sse() -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}
    assert response_text(json.dumps(body).encode(), False) == "Paris."
    sse = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"Par"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"is."}}]}\n\ndata: [DONE]\n\n'
    )
    assert response_text(sse, True) == "Paris."
    assert response_text(b"not json", False) is None


def test_system_prompts_are_not_forwarded() -> None:
    body = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "developer", "content": "secret"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert user_messages(json.dumps(body).encode()) == [{"role": "user", "content": "hi"}]
    assert user_messages(b'{"prompt": "complete me"}') == [
        {"role": "user", "content": "complete me"}
    ]


def test_sampling_is_deterministic_and_near_its_rate() -> None:
    ids = [f"req-{i}" for i in range(20_000)]
    picked = [i for i in ids if sampled(i, 0.1)]
    assert picked == [i for i in ids if sampled(i, 0.1)]
    assert abs(len(picked) / len(ids) - 0.1) < 0.01
    assert not sampled("x", 0.0) and sampled("x", 1.0)


def test_the_payload_copies_only_safe_fields() -> None:
    event: dict[str, Any] = {
        "event_id": "e1", "ts_ms": 1, "service": "chat", "model": "m-canary",
        "experiment": "x", "variant": "treatment", "prompt_version": "v2", "unit_id": "u",
        "session_id": "s", "instance": "canary", "tenant": "acme",
    }  # fmt: skip
    out = rating_payload(event, messages=None, response="ok")
    assert out["request_event_id"] == "e1" and out["tenant"] == "acme"
    assert not ARM_REVEALING & out.keys() and "m-canary" not in json.dumps(out)
