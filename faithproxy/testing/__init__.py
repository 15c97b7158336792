"""faithproxy.testing: a fake vLLM upstream for tests and benchmarks, public like httpx's MockTransport.

    from faithproxy.testing import FakeUpstream, Sentences

    upstream = FakeUpstream(Sentences(["The image shows a red circle. ", "So the answer is red."]))
    app = create_app(settings, upstream_transport=upstream.transport())   # in process
    async with running_app(upstream) as url: ...                          # or on 127.0.0.1
    upstream.fault = "die_mid_stream"                                      # faults.py lists them

It speaks vLLM's OpenAI chat-completions wire (wire.py): SSE chunks with `content` or `reasoning`
deltas, a usage chunk and `[DONE]`, or one JSON body. A script (scripts.py, chains.py) says what to
answer; a fault (faults.py) breaks it; the FakeUpstream (upstream.py) plays the result through either
entry. `python -m faithproxy.testing --port 8100` serves one from the command line.

It imports the product's lower layers at most, never the benchmarks, ShapesWorld or tinyvlm.
"""

from faithproxy.testing.answer import Answer, At, Hold, Pause, Reset, Stall, Stream
from faithproxy.testing.chains import Chain, ChainSpec, chain_sentences, corrected_sentence, planted_sentence
from faithproxy.testing.faults import FAULTS, Fault
from faithproxy.testing.metrics import metric
from faithproxy.testing.reports import as_annotated
from faithproxy.testing.scripts import SENTENCES, Counted, Script, Sentences, expected_text
from faithproxy.testing.serving import running_app, threaded_app
from faithproxy.testing.upstream import FakeUpstream
from faithproxy.testing.wire import completion, delta, error_body, event, frames, sse, usage_chunk

__all__ = [
    "as_annotated",
    "FAULTS",
    "SENTENCES",
    "Answer",
    "At",
    "Chain",
    "ChainSpec",
    "Counted",
    "FakeUpstream",
    "Fault",
    "Hold",
    "Pause",
    "Reset",
    "Script",
    "Sentences",
    "Stall",
    "Stream",
    "chain_sentences",
    "completion",
    "corrected_sentence",
    "delta",
    "error_body",
    "event",
    "expected_text",
    "frames",
    "metric",
    "planted_sentence",
    "running_app",
    "sse",
    "threaded_app",
    "usage_chunk",
]
