"""The proxy's own chunks: OpenAI chunk shape, role on the first delta only, SSE framing."""

import json

from faithproxy.clients.sse import SSEDecoder
from faithproxy.faithcore.errors import DetectorError
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.sse import DONE, ChunkFactory, frame


def test_chunks_share_id_and_carry_role_once() -> None:
    factory = ChunkFactory("chatcmpl-1", "m")
    first = factory.chunk({"content": "A."}, extra={"faithfulness": {"step": {"index": 0}}})
    second = factory.chunk({"content": " B."}, finish_reason="stop")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "A."}
    assert second["choices"][0]["delta"] == {"content": " B."}
    assert first["id"] == second["id"] == "chatcmpl-1" and first["object"] == "chat.completion.chunk"
    assert first["faithfulness"] == {"step": {"index": 0}}
    assert second["choices"][0]["finish_reason"] == "stop"
    assert factory.usage_chunk({"total_tokens": 3})["choices"] == []


def test_frames_decode_back() -> None:
    factory = ChunkFactory("c", "m")
    chunk = factory.chunk({"content": "line one\n\ndata: not a frame"})
    wire = frame(chunk) + error_frame(DetectorError("judge down", code="timeout")) + DONE
    events = SSEDecoder().feed(wire.decode())
    assert json.loads(events[0]) == chunk
    assert json.loads(events[1])["error"] == {
        "message": "judge down",
        "type": "detector_error",
        "param": None,
        "code": "timeout",
    }
    assert events[2] == "[DONE]"


def test_a_text_frame_is_the_bytes_of_the_chunk_it_stands_for() -> None:
    fast, slow = ChunkFactory("chatcmpl-1", 'm "quoted" \u00e9'), ChunkFactory("chatcmpl-1", 'm "quoted" \u00e9')
    slow.created = fast.created  # fast built its prefix with its own
    for field, text in [("content", "A."), ("reasoning", ' "q" caf\u00e9\n\ndata: x'), ("content", "")]:
        assert fast.text_frame(field, text) == frame(slow.chunk({field: text}))
