"""faithproxy behind LiteLLM's proxy, configured as a team would put a model behind it: `openai/<model>`
with `api_base` = faithproxy, client headers forwarded (`forward_client_headers_to_llm_api: true`),
and faithproxy's report endpoint reachable through the gateway as a pass-through route.

LiteLLM comes from PyPI, in its own venv (scripts/install_litellm.sh, the version pinned there). What
the tests establish about it, for docs/operations.md: X-Faithproxy-* request headers arrive; the
`faithfulness` member survives a non-streamed response and is dropped from every stream chunk; the
proxy's request id comes back as `llm_provider-x-faithproxy-request-id`, and with it the report; in
a non-streamed reply a `<think>` block is moved from `content` into `reasoning_content` (a stream
keeps it in `content`).

Everything runs as separate processes, started and stopped by tinyvlm.processes: a stand-in vLLM that
always answers the same reasoning chain, the local judge (an oracle that calls one sentence
unfaithful), `faithproxy serve` with an API key, and one LiteLLM for the whole module.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.tinyvlm import processes
from faithproxy.benchmarks.tinyvlm.processes import free_port
from faithproxy.testing import as_annotated

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
LITELLM = ROOT / ".venv-litellm" / "bin" / "litellm"
GATEWAY_KEY = "sk-gateway-master-key"
PROXY_KEY = "fp-proxy-key-behind-the-gateway"
THINK = "The image shows a red circle. It is on a white background."
ANSWER = "The answer is red."
UNFAITHFUL = "It is on a white background."

# A stand-in vLLM: every chat completion is THINK in a think block, then ANSWER, streamed word by word.
UPSTREAM = r"""
import json, sys
import uvicorn

TEXT = "<think>" + sys.argv[2] + "</think>" + sys.argv[3]
PIECES = [w + " " for w in TEXT.split(" ")[:-1]] + [TEXT.split(" ")[-1]]

def chunk(delta, finish=None):
    body = {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"

async def app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/v1/chat/completions":
        request = json.loads(body)
        if request.get("stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            frames = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": p}) for p in PIECES]
            frames += [chunk({}, "stop"), b"data: [DONE]\n\n"]
            for frame in frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        reply = {"id": "up", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 10, "completion_tokens": len(PIECES), "total_tokens": 10 + len(PIECES)}}
        payload = json.dumps(reply).encode()
    elif scope["path"] == "/v1/models":
        payload = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
    else:
        payload = b"{}"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off")
"""


@dataclass
class Gateway:
    url: str  # LiteLLM
    proxy_url: str  # faithproxy, for what the gateway does not show

    def chat(self, headers: dict[str, str], **extra: Any) -> httpx.Response:
        body = {"model": "vlm", "messages": [{"role": "user", "content": "What colour is the circle?"}], **extra}
        auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=auth | headers, timeout=60)

    def report(self, request_id: str, key: str | None = GATEWAY_KEY) -> httpx.Response:
        """The report through the gateway's pass-through route, as a client behind it asks for it."""
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.get(f"{self.url}/faithproxy/v1/faithfulness/{request_id}", headers=headers, timeout=30)


def _litellm_config(proxy_url: str) -> str:
    return f"""
model_list:
  - model_name: vlm
    litellm_params:
      model: openai/m
      api_base: {proxy_url}/v1
      api_key: {PROXY_KEY}
litellm_settings:
  callbacks: []
  success_callback: []
  failure_callback: []
  telemetry: false
general_settings:
  master_key: {GATEWAY_KEY}
  forward_client_headers_to_llm_api: true
  disable_spend_logs: true
  disable_error_logs: true
  pass_through_endpoints:
    - path: /faithproxy
      target: {proxy_url}
      include_subpath: true
      auth: true
      headers:
        Authorization: "Bearer {PROXY_KEY}"
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if not LITELLM.exists():
        message = f"LiteLLM is not installed at {LITELLM} (bash scripts/install_litellm.sh)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must install it rather than skip the gateway tests")
        pytest.skip(message)
    work = tmp_path_factory.mktemp("gateway")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith(("FAITHPROXY_", "LITELLM_", "OPENAI_"))}
    clean |= {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    ports = {name: free_port() for name in ("upstream", "judge", "proxy", "litellm")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    (work / "oracle.json").write_text(json.dumps({"unfaithful": [UNFAITHFUL]}))
    judges = [{"name": "local", "backend": "anthropic", "model": "judge", "base_url": urls["judge"], "api_key": "j"}]
    (work / "litellm.yaml").write_text(_litellm_config(urls["proxy"]))
    proxy_env = clean | {"FAITHPROXY_JUDGES": json.dumps(judges), "FAITHPROXY_API_KEYS": PROXY_KEY}
    litellm_env = clean | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "DISABLE_ADMIN_UI": "True", "LITELLM_LOG": "ERROR"}
    py = sys.executable
    with processes.supervised():  # whatever happens here, nothing is left running
        # All four start side by side; LiteLLM is by far the slowest.
        children = [
            processes.spawn([str(LITELLM), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                             "--port", str(ports["litellm"]), "--num_workers", "1"],
                            work / "litellm.log", name="LiteLLM", env=litellm_env, cwd=work),
            processes.spawn([py, "-c", UPSTREAM, str(ports["upstream"]), THINK, ANSWER], work / "upstream.log",
                            name="upstream", env=clean),
            processes.spawn([py, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(ports["judge"]),
                             "--oracle", str(work / "oracle.json")], work / "judge.log", name="judge", env=clean),
            processes.spawn([py, "-m", "faithproxy.cli", "serve", "--upstream", urls["upstream"], "--port",
                             str(ports["proxy"]), "--log-level", "warning"], work / "proxy.log", name="faithproxy",
                            env=proxy_env, cwd=ROOT),
        ]  # fmt: skip
        litellm, upstream, judge, proxy = children
        upstream.wait_healthy(f"{urls['upstream']}/v1/models", 60)
        judge.wait_healthy(f"{urls['judge']}/_stats", 60)
        proxy.wait_healthy(f"{urls['proxy']}/readyz", 60)
        litellm.wait_healthy(f"{urls['litellm']}/health/liveliness", 240)
        yield Gateway(urls["litellm"], urls["proxy"])


def _request_id(response: httpx.Response) -> str:
    request_id = response.headers.get("llm_provider-x-faithproxy-request-id")
    assert request_id, f"the gateway did not pass the request id on: {dict(response.headers)}"
    return request_id


def _assert_detected(report: dict[str, Any]) -> None:
    faithfulness = report["faithfulness"]
    assert faithfulness["mode"] == "detect"  # the X-Faithproxy-Mode header crossed the gateway
    flagged = [s["text"] for s in faithfulness["steps"] if s["detected"] == "unfaithful"]
    assert flagged == [UNFAITHFUL] and faithfulness["unfaithful_detected"] == 1


def test_non_streamed_keeps_faithfulness_and_the_report_matches_it(gateway: Gateway) -> None:
    response = gateway.chat({"X-Faithproxy-Mode": "detect"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers["llm_provider-x-faithproxy-mode"] == "detect"
    message = body["choices"][0]["message"]
    # LiteLLM moves the think block out of `content`: the reasoning arrives as reasoning_content.
    assert "<think>" not in message["content"] and message["content"].strip() == ANSWER
    assert THINK in message["reasoning_content"]
    found = gateway.report(_request_id(response))
    assert found.status_code == 200, found.text
    report = found.json()
    assert report["stream"] is False and report["outcome"] == "completed"
    _assert_detected(report)
    assert as_annotated(report["faithfulness"]) == body["faithfulness"]  # the same verdicts, step by step


def test_streamed_loses_faithfulness_in_the_gateway_and_the_report_has_it(gateway: Gateway) -> None:
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        json={"model": "vlm", "stream": True, "messages": [{"role": "user", "content": "What colour is it?"}]},
        headers={"authorization": f"Bearer {GATEWAY_KEY}", "X-Faithproxy-Mode": "detect"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        request_id = _request_id(response)
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    # What makes the lookup necessary: no chunk the client gets carries the proxy's verdicts.
    assert not any("faithfulness" in c for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    # Unlike a non-streamed reply, a stream keeps the think block in `content`, as the model wrote it.
    assert "".join(d.get("content") or "" for d in deltas) == f"<think>{THINK}</think>{ANSWER}"
    assert not any(d.get("reasoning_content") for d in deltas)
    found = gateway.report(request_id)
    assert found.status_code == 200, found.text
    report = found.json()
    assert report["stream"] is True and report["outcome"] == "completed" and report["id"] == request_id
    _assert_detected(report)


def test_off_mode_through_the_gateway_has_no_report(gateway: Gateway) -> None:
    response = gateway.chat({"X-Faithproxy-Mode": "off"})
    assert response.status_code == 200, response.text
    assert response.headers["llm_provider-x-faithproxy-mode"] == "off"
    assert "faithfulness" not in response.json()
    missing = gateway.report(_request_id(response))
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "report_not_found"


def test_the_report_route_through_the_gateway_needs_a_gateway_key(gateway: Gateway) -> None:
    response = gateway.chat({"X-Faithproxy-Mode": "detect"})
    request_id = _request_id(response)
    for refused in (gateway.report(request_id, key=None), gateway.report(request_id, key="sk-wrong")):
        # LiteLLM's own refusal; without a database 1.108.7 does not answer it with a 401 (a missing key
        # is a 500, a key it does not know a 400 "No connected db."), but the report stays behind it.
        assert refused.status_code >= 400, (refused.status_code, refused.text)
        assert "faithfulness" not in refused.text and request_id not in refused.text
    # and faithproxy itself answers only with its own key, which the gateway holds, not the client
    assert httpx.get(f"{gateway.proxy_url}/v1/faithfulness/{request_id}").status_code == 401
    direct = httpx.get(
        f"{gateway.proxy_url}/v1/faithfulness/{request_id}", headers={"authorization": f"Bearer {PROXY_KEY}"}
    )
    assert direct.status_code == 200 and direct.json()["id"] == request_id
