"""Offline replay with the real judge detector against the local judge server (both wire protocols)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest

from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep, read_chains, write_chains
from faithproxy.benchmarks.evaluation.metrics import step_f1
from faithproxy.benchmarks.evaluation.replay import ImageResolver, ReplayError, make_detector, replay
from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server
from faithproxy.clients.judges import JudgeConfig, build_judges
from faithproxy.clients.vllm import VLLMClient
from faithproxy.detectors.base import Detector
from faithproxy.faithcore.context import CheckResult, RequestView
from faithproxy.faithcore.types import Faithfulness, Step, Verdict

ORACLE = {"unfaithful": ["The car is blue.", "The sky is green.", "The sun is red."]}


def _chain(chain_id: str, steps: list[tuple[str, str, bool | None]], image: str | None = None) -> LabelledChain:
    return LabelledChain(chain_id, "What is shown?", [LabelledStep(t, k, f) for t, k, f in steps], image=image)


# Gold labels disagree with the oracle judge twice: c2's second step (judge misses it) and c3's first
# (judge flags a step gold calls faithful).
GOLD = [
    _chain("c1", [("The image shows a car.", "perception", True), ("The car is blue.", "perception", False),
                  ("The road is wet.", "perception", True), ("So the answer is B.", "reasoning", None)]),
    _chain("c2", [("A dog sits on grass.", "perception", True), ("The dog is brown.", "perception", False),
                  ("So the answer is A.", "reasoning", None)]),
    _chain("c3", [("The sky is green.", "perception", True), ("The sun is red.", "perception", False)]),
]  # fmt: skip


@pytest.fixture
async def judge() -> AsyncIterator[tuple[str, Any]]:
    app = create_app(ORACLE)
    async with running_judge_server(app) as url:
        yield url, app.state.judge


def _judges(url: str) -> dict[str, Any]:
    return build_judges(
        [
            JudgeConfig(name="claude", backend="anthropic", model="j", base_url=url, api_key="k", max_retries=0),
            JudgeConfig(name="qwen", backend="openai", model="j", base_url=f"{url}/v1", api_key="k", max_retries=0),
        ]
    )


@pytest.mark.parametrize("judge_name", ["claude", "qwen"])
async def test_judge_replay_scores_against_gold(judge: tuple[str, Any], judge_name: str, tmp_path: Path) -> None:
    url, state = judge
    detector = make_detector("judge", judges=_judges(url), default_judge="claude")
    try:
        predictions, report = await replay(GOLD, detector, judge=judge_name, progress=False, concurrency=2)
    finally:
        await detector.aclose()
    assert [c.id for c in predictions] == ["c1", "c2", "c3"]
    assert [s.faithful for s in predictions[0].steps] == [True, False, True, None]
    assert [s.kind for s in predictions[0].steps] == ["perception", "perception", "perception", "reasoning"]
    assert [s.faithful for s in predictions[1].steps] == [True, True, None]
    assert [s.faithful for s in predictions[2].steps] == [False, False]
    assert predictions[0].steps[1].extra["reason"] == f"judge:{judge_name}"
    # c1 and c3 need a second call for the steps after the flagged one; c2 needs one
    assert report.detector_calls == 5 and report.judge_calls == 5 and state.requests == 5
    assert state.by_protocol["anthropic" if judge_name == "claude" else "openai"] == 5
    assert report.judge_input_tokens > 0 and report.judge_output_tokens > 0
    assert report.errors == 0 and report.chains == 3 and report.steps == 9
    assert report.latency_p50_s is not None and report.latency_p95_s >= report.latency_p50_s
    assert report.detector_s_per_step == pytest.approx(report.latency_mean_s * 5 / 9)  # 5 calls over 9 steps
    # TP c1/1, c3/1; FP c3/0; FN c2/1; TN c1/0, c1/2, c2/0
    f1 = report.f1
    assert f1["unfaithful"]["tp"] == 2 and f1["unfaithful"]["fp"] == 1 and f1["unfaithful"]["fn"] == 1
    assert f1["precision"] == pytest.approx(2 / 3) and f1["f1"] == pytest.approx(2 / 3)
    assert f1["faithful"]["f1"] == pytest.approx(3 / 4) and f1["steps"] == 7
    assert report.f1_by_position["i<=2"]["f1"] == pytest.approx(2 / 3)  # all but c1's third step
    assert report.f1_by_position["i>2"]["steps"] == 1 and report.f1_by_position["i>2"]["f1"] is None
    assert report.upr_gold == pytest.approx(3 / 7) and report.upr_predicted == pytest.approx(3 / 7)
    # the predictions file is the labelled format and scores the same
    out = tmp_path / "pred.jsonl"
    write_chains(out, predictions)
    assert step_f1(GOLD, read_chains(out)).to_dict() == f1


async def test_batch_of_one_step_calls_per_step(judge: tuple[str, Any]) -> None:
    url, _ = judge
    detector = make_detector("judge", judges=_judges(url), default_judge="claude")
    try:
        predictions, report = await replay(GOLD, detector, batch=1, progress=False)
    finally:
        await detector.aclose()
    assert report.detector_calls == 9
    assert [s.faithful for c in predictions for s in c.steps] == [True, False, True, None, True, True, None, False,
                                                                  False]  # fmt: skip


async def test_judge_failures_leave_steps_unlabelled(judge: tuple[str, Any]) -> None:
    url, state = judge
    state.mode = "500"
    detector = make_detector("judge", judges=_judges(url), default_judge="claude")
    try:
        predictions, report = await replay(GOLD[:2], detector, progress=False, kinds="gold")
    finally:
        await detector.aclose()
    assert report.errors == 2 and report.detector_calls == 2
    assert all(s.faithful is None and "status_5xx" in s.extra["error"] for c in predictions for s in c.steps)
    assert report.f1["abstained"] == 5 and report.f1["recall"] == 0.0


async def test_images_are_found_by_path_or_hash(judge: tuple[str, Any], tmp_path: Path) -> None:
    url, state = judge
    png = b"\x89PNG\r\n\x1a\nfake"
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "scene.png").write_bytes(png)
    sha = hashlib.sha256(png).hexdigest()
    resolver = ImageResolver(tmp_path / "img")
    assert resolver.resolve("scene.png").sha256 == sha
    assert resolver.resolve(sha).media_type == "image/png"
    assert resolver.resolve("0" * 64) is None and resolver.resolve(None) is None
    chains = [_chain("h", [("The car is blue.", "perception", False)], image=sha),
              _chain("m", [("The car is blue.", "perception", False)], image="f" * 64)]  # fmt: skip
    detector = make_detector("judge", judges=_judges(url), default_judge="claude")
    try:
        _, report = await replay(chains, detector, image_dir=tmp_path / "img", progress=False, concurrency=1)
    finally:
        await detector.aclose()
    assert report.images_missing == 1
    assert state.last_request["images"] == []  # the last chain had no image to send
    assert state.requests == 2


class Slow(Detector):
    """Counts how many chains are checked at the same time."""

    name: ClassVar[str] = "slow"

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0

    async def check(self, view: RequestView, new_steps: list[Step]) -> CheckResult:
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(0.02)
        self.active -= 1
        return CheckResult(tuple(Verdict(Faithfulness.FAITHFUL, self.name) for _ in new_steps))


async def test_concurrency_is_bounded() -> None:
    chains = [_chain(f"c{i}", [("The car is red.", "perception", True)]) for i in range(8)]
    detector = Slow()
    _, report = await replay(chains, detector, concurrency=3, progress=False)
    assert detector.peak == 3 and report.detector_calls == 8
    assert report.judge_calls is None and report.f1["faithful"]["f1"] == 1.0


async def test_prompt_detector_asks_the_generator() -> None:
    asked: list[str] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        text = body["messages"][0]["content"][-1]["text"]
        asked.append(text)
        verdict = "UNFAITHFUL" if "blue" in text else "FAITHFUL"  # only the second step's prompt mentions it
        message = {"role": "assistant", "content": verdict}
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message}], "usage": usage})

    generator = VLLMClient("http://vllm.test", transport=httpx.MockTransport(vllm))
    detector = make_detector("prompt", generator=generator)  # the generator is injected when it is built
    chains = [_chain("p", [("The car is red.", "perception", True), ("So it is red.", "reasoning", None),
                           ("The car is blue.", "perception", False)])]  # fmt: skip
    try:
        predictions, report = await replay(chains, detector, model="m", progress=False)
    finally:
        await generator.aclose()
    assert len(asked) == 2  # one self-check per perception step, none for the reasoning step
    assert [s.faithful for s in predictions[0].steps] == [True, None, False]
    assert report.generator_tokens == 22 and report.judge_calls is None and report.f1["f1"] == 1.0


def test_unknown_and_unbuildable_detectors_are_refused() -> None:
    with pytest.raises(ReplayError, match="did you mean 'judge'"):
        make_detector("jduge")
    with pytest.raises(ReplayError, match=r"'judge' needs a judge \(--judges"):
        make_detector("judge")
    with pytest.raises(ReplayError, match="'probe' needs a probe file and a hidden-states client"):
        make_detector("probe")
    assert make_detector("none").name == "none"


async def test_judge_replay_with_the_shapesworld_pixel_judge(tmp_path: Path) -> None:
    """Images travel from the labelled file to a judge that reads nothing but the pixels."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.export import write_chains_jsonl
    from faithproxy.benchmarks.shapesworld.pixel_judge import PixelJudge

    items = list(generate_items(999, 6, hallucination_rate=0.5, start=3000))
    path = tmp_path / "sw.jsonl"
    write_chains_jsonl(path, ((i.id, i.scene, i.question, i.chain) for i in items), tmp_path / "img")
    gold = read_chains(path)
    app = create_app(PixelJudge())
    async with running_judge_server(app) as url:
        detector = make_detector("judge", judges=_judges(url), default_judge="claude")
        try:
            _, report = await replay(gold, detector, progress=False)
        finally:
            await detector.aclose()
        last = app.state.judge.last_request
    assert report.errors == 0 and report.images_missing == 0 and last["images"]
    assert report.f1["unfaithful"]["support"] == sum(c.unfaithful_steps for c in gold) > 0
    # the pixel judge reads these scenes exactly (on 40 held-out chains too: docs/offline-evaluation.md)
    assert report.f1["f1"] == 1.0 and report.f1["faithful"]["f1"] == 1.0


# ---- the probe and the cascade over recorded features ------------------------------------------

H = 4


def _probe(model: str = "tiny-vlm", layers: tuple[int, ...] = (1, 2)) -> Any:
    """P(unfaithful) = sigmoid(4 * the first value of layer 2)."""
    from faithproxy.detectors.probe import Probe

    weights = np.zeros(H * len(layers))
    weights[H * layers.index(2)] = 4.0
    classifier = {"kind": "logistic", "mean": np.zeros(H * len(layers)), "std": np.ones(H * len(layers)),
                  "weights": weights, "bias": 0.0}  # fmt: skip
    return Probe(model=model, layers=list(layers), hidden_size=H, classifier=classifier, threshold=0.5)


def _featured(chain_id: str, steps: list[tuple[str, str, bool | None, float | None]]) -> LabelledChain:
    """A chain whose perception steps carry `last_token` features: layer 2's first value is the signal."""
    from faithproxy.clients.hidden_states import Features

    out = []
    for text, kind, faithful, signal in steps:
        extra = {}
        if signal is not None:
            vectors = np.zeros((2, H), dtype=np.float32)
            vectors[1, 0] = signal
            extra["features"] = Features(vectors, [1, 2]).to_json()
        out.append(LabelledStep(text, kind, faithful, None, extra))
    return LabelledChain(chain_id, "What is shown?", out, extra={"model": "tiny-vlm"})


# signals: clearly unfaithful (+3: P 1.0), clearly faithful (-3), uncertain (0: P 0.5) where the judge decides
FEATURED = [
    _featured("c1", [("The image shows a car.", "perception", True, -3.0),
                     ("The car is blue.", "perception", False, 3.0),
                     ("So the answer is B.", "reasoning", None, None)]),
    _featured("c3", [("The sky is green.", "perception", False, 0.0),
                     ("The sun is red.", "perception", False, 3.0)]),
]  # fmt: skip


async def test_probe_replay_reads_the_steps_features() -> None:
    from faithproxy.benchmarks.evaluation.replay import probe_replay_deps

    detector = make_detector("probe", **probe_replay_deps(FEATURED, _probe()))
    predictions, report = await replay(FEATURED, detector, kinds="gold", progress=False)
    assert [s.faithful for s in predictions[0].steps] == [True, False, None]
    assert [s.faithful for s in predictions[1].steps] == [True, False]  # P 0.5 is not above the threshold 0.5
    assert predictions[0].steps[1].score == pytest.approx(1 / (1 + np.exp(-12.0)))
    assert report.errors == 0 and report.judge_calls is None and report.decided_by is None
    assert (report.f1["unfaithful"]["tp"], report.f1["unfaithful"]["fn"], report.f1["unfaithful"]["fp"]) == (2, 1, 0)


async def test_cascade_replay_counts_the_stages(judge: tuple[str, Any]) -> None:
    from faithproxy.benchmarks.evaluation.replay import probe_replay_deps

    url, _ = judge
    deps = probe_replay_deps(FEATURED, _probe())
    detector = make_detector("cascade", judges=_judges(url), default_judge="claude", cascade_low=0.1,
                             cascade_high=0.9, **deps)  # fmt: skip
    try:
        predictions, report = await replay(FEATURED, detector, judge="claude", kinds="gold", progress=False)
    finally:
        await detector.judge.aclose()
    # the uncertain step went to the oracle judge, which knows "The sky is green." is unfaithful
    assert [s.faithful for s in predictions[1].steps] == [False, False]
    assert predictions[1].steps[0].extra["reason"].startswith("cascade:")
    assert report.f1["f1"] == 1.0 and report.errors == 0
    # each perception step's final verdict: c1's two and c3's second by the probe (the judge flagged c3's
    # first, so replay asked again about the second), c3's first by the judge
    assert report.decided_by == {"probe": 3, "judge": 1} and report.probe_decided_share == 0.75
    assert report.judge_calls == 1


async def test_a_perception_step_without_features_is_a_failed_call() -> None:
    from faithproxy.benchmarks.evaluation.replay import probe_replay_deps

    chains = [*FEATURED, _featured("c9", [("The dog is brown.", "perception", True, None)])]
    detector = make_detector("probe", **probe_replay_deps(chains, _probe()))
    predictions, report = await replay(chains, detector, kinds="gold", progress=False)
    assert report.errors == 1 and predictions[2].steps[0].faithful is None
    assert "no recorded features" in predictions[2].steps[0].extra["error"]


@pytest.mark.parametrize(
    ("probe_args", "message"),
    [
        ({"model": "other-vlm"}, "trained on hidden states of model 'other-vlm'; the chains are of 'tiny-vlm'"),
        ({"layers": (2, 3)}, "reads layers [2, 3]; the recorded features hold layers [1, 2] (missing [3])"),
    ],
)
def test_replay_cli_refuses_a_probe_the_features_do_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], probe_args: dict[str, Any], message: str
) -> None:
    from faithproxy.cli import main as faithproxy

    chains, probe = tmp_path / "chains.jsonl", tmp_path / "probe.json"
    write_chains(chains, FEATURED)
    _probe(**probe_args).save(probe)
    args = ["bench", "replay", "--traces", str(chains), "--detector", "probe", "--probe", str(probe)]
    assert faithproxy(args) == 2
    assert message in capsys.readouterr().err


def test_replay_cli_probe_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from faithproxy.cli import main as faithproxy

    chains, probe = tmp_path / "chains.jsonl", tmp_path / "probe.json"
    write_chains(chains, FEATURED)
    _probe().save(probe)
    base = ["bench", "replay", "--traces", str(chains)]
    assert faithproxy([*base, "--detector", "probe"]) == 2
    assert "'probe' needs --probe FILE" in capsys.readouterr().err
    assert faithproxy([*base, "--detector", "none", "--probe", str(probe)]) == 2
    assert "--probe is for the detectors that read hidden states, not 'none'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert faithproxy([*base, "--detector", "probe", "--probe", str(tmp_path / "bad.json")]) == 2
    assert "--probe: not a faithproxy probe file" in capsys.readouterr().err
    assert faithproxy([*base, "--detector", "probe", "--probe", str(probe), "--kinds", "gold", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["f1"]["unfaithful"]["tp"] == 2 and report["errors"] == 0
