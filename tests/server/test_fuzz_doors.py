"""Fuzzing the doors beside chat: schemathesis against their OpenAPI schemas (/v1/completions,
/v1/responses, /v1/messages), on the in-process app and the flaky fake vLLM of tests/server/test_fuzz.py,
each generated case sent in the same twelve variants (three modes, annotated or not, streamed as
generated or not). Bounded: 12 positive and 6 negative cases per door (648 requests; the chat door's
run in test_fuzz.py is the long one). The property,
as for chat: no 5xx and no error frame except for the upstream failures injected into that request,
and every event stream ends with `data: [DONE]`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from schemathesis.generation import GenerationMode

from tests.server.test_fuzz import (  # noqa: F401 - app_in_process is a fixture
    INJECTED,
    SCHEMA,
    VARIANTS,
    InProcess,
    app_in_process,
    fuzz_cases,
    injected,
    variants,
)

CASES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 6}
DOORS = ["/v1/completions", "/v1/responses", "/v1/messages"]


def _injected_error(error: Any) -> bool:
    """An error the flaky upstream caused, in OpenAI's or Anthropic's shape."""
    if not isinstance(error, dict):
        return False
    return error.get("type") in ("upstream_error", "api_error") or INJECTED in str(error.get("message"))


# How each door's stream ends: completions with [DONE]; the other two on a terminal event of their own API
# (or an error event), with no [DONE].
LAST_EVENTS = {
    "/v1/responses": ("response.completed", "response.incomplete"),
    "/v1/messages": ("message_stop", "error"),
}


def check(answer: Any, failing: bool, seen: Counter[str], door: str) -> None:
    status = answer.status_code
    seen[f"{status // 100}xx"] += 1
    if status >= 500:
        body = answer.json()
        assert failing and _injected_error(body.get("error")), f"{status}: {answer.text[:500]}"
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        # Lines as an event stream ends them (CR, LF, CRLF): str.splitlines would also cut a JSON string at
        # U+2028 or U+0085, which the doors write unescaped (ensure_ascii=False) and SSE keeps in the line.
        lines = re.split(r"\r\n|\r|\n", answer.text)
        data = [line[6:] for line in lines if line.startswith("data: ")]  # named events too
        if door in LAST_EVENTS:
            last = json.loads(data[-1]) if data and data[-1] != "[DONE]" else {}
            # the Responses door's failure frame is OpenAI's error object, as on chat
            assert last.get("type") in LAST_EVENTS[door] or "error" in last, answer.text[-300:]
            data.append("[DONE]")  # the loop below reads every event
        assert data and data[-1] == "[DONE]", answer.text[-300:]
        for payload in data[:-1]:
            parsed = json.loads(payload)
            error = parsed.get("error") if parsed.get("type") in (None, "error") else None
            if error is not None:
                assert failing and _injected_error(error), payload
                seen["injected_error_frames"] += 1


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("mode", list(CASES), ids=lambda m: m.value)
def test_schemathesis_doors(door: str, mode: GenerationMode, app_in_process: InProcess) -> None:  # noqa: F811
    operation = SCHEMA[door]["POST"]

    def each(kwargs: dict[str, Any], seen: Counter[str]) -> None:
        for headers, content, body in variants(kwargs):
            check(app_in_process.call(kwargs["method"], kwargs["url"], headers, content), injected(body), seen, door)
            seen["requests"] += 1

    seen = fuzz_cases(operation, mode, CASES[mode], each)
    print(f"schemathesis {door} {mode.value}: {dict(seen)}")
    assert seen["requests"] == len(VARIANTS) * seen["cases"] >= len(VARIANTS) * CASES[mode] * 0.9
    if mode is GenerationMode.POSITIVE:
        assert seen["2xx"] > 0  # the grammar does reach the upstream
