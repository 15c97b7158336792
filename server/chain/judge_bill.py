"""The judge's bill as the client sees it: beside the generator's `usage`, in a namespaced field.

`usage` is the generator's (vLLM's) tokens, as OpenAI clients read it. What faithproxy adds, the judge's
calls and tokens, goes in `faithproxy_judge_usage` beside it: in a non-streamed response's body, and in a
stream's last chunk (the one with the finish reason and the `faithfulness` summary) and its usage chunk
(when `stream_options.include_usage`). A non-streamed response also carries it in the header
`X-Faithproxy-Judge-Usage` (`calls=1, input_tokens=812, ...`); a stream's headers are sent before any
judge call, and HTTP trailers are not something OpenAI clients read, so a stream has the chunk only.

    "faithproxy_judge_usage": {"calls": 3, "input_tokens": 812, "cached_input_tokens": 2400,
                               "cache_creation_tokens": 0, "output_tokens": 27}

The other doors carry the same field: beside `usage` in a completions body and its finish chunk, on the
Responses object (non-streamed, and the `response` of `response.completed`), on an Anthropic message and
its stream's `message_delta` event; the header on every door's non-streamed response.

The same bill, with the count of image descriptions and of steps the budget left unchecked, is the
`judge` block of the `faithfulness` summary (server/observe/summary.py).
"""

from __future__ import annotations

from faithproxy.faithcore.context import JudgeState

FIELD = "faithproxy_judge_usage"
HEADER = "x-faithproxy-judge-usage"


def judge_bill(judge_state: JudgeState) -> dict[str, int]:
    """calls, input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens of the request."""
    return judge_state.usage.as_dict()


def bill_header(bill: dict[str, int]) -> dict[str, str]:
    return {HEADER: ", ".join(f"{name}={value}" for name, value in bill.items())}
