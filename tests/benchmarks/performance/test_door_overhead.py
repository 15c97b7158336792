"""The door-overhead benchmark's requests and arithmetic (the run itself needs real vLLM: docs/doors.md)."""

from __future__ import annotations

import json

from faithproxy.benchmarks.performance.door_overhead import DOORS, Tally, render, report
from faithproxy.server.admission.media_parts import media_parts
from faithproxy.server.doors.chat import parse_chat_body
from faithproxy.server.doors.completions import parse_completions_body
from faithproxy.server.doors.messages import parse_messages_body
from faithproxy.server.doors.responses import parse_responses_body

PARSERS = {
    "/v1/chat/completions": parse_chat_body,
    "/v1/completions": parse_completions_body,
    "/v1/responses": parse_responses_body,
    "/v1/messages": parse_messages_body,
}
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def test_each_doors_request_is_one_the_door_admits_with_its_image() -> None:
    for door in DOORS:
        for stream in (True, False):
            body = PARSERS[door.path](json.dumps(door.body("m", "How many circles?", IMAGE, stream, 64)).encode())
            assert body["stream"] is stream
            images = list(media_parts(body))
            assert len(images) == (0 if door.path == "/v1/completions" else 1), door.path  # completions: no image
            assert all(image.size == 8 for image in images)  # the same bytes in every door's shape


def test_usage_is_read_from_each_apis_shape() -> None:
    by_path = {door.path: door for door in DOORS}
    assert by_path["/v1/chat/completions"].tokens({"usage": {"completion_tokens": 7}}) == 7
    assert (
        by_path["/v1/responses"].tokens({"type": "response.completed", "response": {"usage": {"output_tokens": 5}}})
        == 5
    )
    assert by_path["/v1/messages"].tokens({"type": "message_delta", "usage": {"output_tokens": 3}}) == 3
    assert by_path["/v1/messages"].tokens({"type": "content_block_delta"}) is None


def test_ratios_are_to_chat_of_the_same_stream_kind() -> None:
    tallies = {
        f"{d.path} {k}": Tally(cpu_s=0.1, tokens=1000, requests=10) for d in DOORS for k in ("stream", "non-stream")
    }
    tallies["/v1/messages stream"].cpu_s = 0.05
    rows = report(tallies)
    assert (
        rows["/v1/messages stream"]["cpu_us_per_token"] == 50.0 and rows["/v1/messages stream"]["ratio_to_chat"] == 0.5
    )
    assert rows["/v1/messages non-stream"]["ratio_to_chat"] == 1.0
    assert "/v1/responses stream" in render(rows)
