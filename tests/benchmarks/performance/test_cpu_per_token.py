"""The CPU-per-token benchmark's arithmetic (the run itself needs real vLLM: see docs/benchmarks.md)."""

from __future__ import annotations

from faithproxy.benchmarks.performance.cpu_per_token import CONFIGS, Config, Tally, render, report, request_body


def test_per_token_figures_judge_share_and_goals() -> None:
    tallies = {c.name: Tally(cpu_s=0.0, tokens=0, requests=0) for c in CONFIGS}
    tallies[Config("off", "none", True).name] = Tally(cpu_s=0.05, tokens=1000, requests=10)
    tallies[Config("correct", "none", True).name] = Tally(cpu_s=0.2, tokens=1000, requests=10)
    tallies[Config("correct", "judge", True).name] = Tally(cpu_s=0.5, tokens=2000, requests=10, judge_calls=40)
    figures = report({"faithproxy": tallies})["faithproxy"]
    assert figures["off/none stream"]["cpu_us_per_token"] == 50.0 and figures["off/none stream"]["goal_met"] is True
    assert figures["correct/none stream"]["cpu_us_per_token"] == 200.0
    assert figures["correct/none stream"]["goal_met"] is False  # the goal is 150 µs
    judge = figures["correct/judge stream"]
    assert judge["cpu_us_per_token"] == 250.0 and judge["judge_client_us_per_token"] == 50.0
    assert judge["judge_client_ms_per_call"] == 2.5  # 50 µs x 2,000 tokens / 40 calls
    assert figures["off/none non-stream"]["cpu_us_per_token"] is None  # no tokens: no figure
    assert "off/none stream" in render({"proxies": report({"faithproxy": tallies})})


def test_requests_carry_the_image_and_ask_for_usage_when_streamed() -> None:
    body = request_body("m", "How many circles?", "data:image/png;base64,AAAA", True, 64)
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 64
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png")
    assert "stream_options" not in request_body("m", "q", "data:,", False, 64)
