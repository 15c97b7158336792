"""The proxy's own chunks: OpenAI chunk shape, role on the first delta only, SSE framing."""

import json

from faithproxy.clients.sse import SSEDecoder
from faithproxy.faithcore.errors import DetectorError
from faithproxy.server.doors.chat import ChatChunks, ChatCompletionChunk
from faithproxy.server.protocol.errors import error_frame
from faithproxy.server.protocol.sse import DONE, data_frame


def test_chunks_share_id_and_carry_role_once() -> None:
    factory = ChatChunks("chatcmpl-1", "m")
    first = factory.chunk({"content": "A."}, faithfulness={"step": {"index": 0}}).model_dump(mode="json")
    second = json.loads(data_frame(factory.chunk({"content": " B."}, finish_reason="stop"))[6:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "A."}
    assert second["choices"][0]["delta"] == {"content": " B."}
    assert first["id"] == second["id"] == "chatcmpl-1" and first["object"] == "chat.completion.chunk"
    assert first["faithfulness"] == {"step": {"index": 0}} and "faithfulness" not in second
    assert second["choices"][0]["finish_reason"] == "stop" and second["choices"][0]["logprobs"] is None
    assert "usage" not in second
    assert factory.usage_chunk({"total_tokens": 3}).model_dump()["choices"] == []


def test_frames_decode_back() -> None:
    factory = ChatChunks("c", "m")
    chunk = factory.chunk({"content": "line one\n\ndata: not a frame"})
    wire = data_frame(chunk) + error_frame(DetectorError("judge down", code="timeout")) + DONE
    events = SSEDecoder().feed(wire.decode())
    assert ChatCompletionChunk.model_validate_json(events[0]) == chunk
    assert json.loads(events[1])["error"] == {
        "message": "judge down",
        "type": "detector_error",
        "param": None,
        "code": "timeout",
    }
    assert events[2] == "[DONE]"


def test_a_text_frame_is_the_bytes_of_the_chunk_it_stands_for() -> None:
    fast, slow = (
        ChatChunks("chatcmpl-1", 'm "quoted" \u00e9\ufdd0'),
        ChatChunks("chatcmpl-1", 'm "quoted" \u00e9\ufdd0'),
    )
    slow.created = fast.created  # fast built its prefix with its own
    for field, text in [
        ("content", "A."),
        ("reasoning", ' "q" caf\u00e9\n\ndata: x\x01\u2028'),
        ("content", ""),
        ("reasoning_content", "\ufdd0"),
    ]:
        assert fast.text_frame(field, text) == data_frame(slow.chunk({field: text}))
