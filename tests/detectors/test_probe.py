"""The probe file format (round trip, refusals) and ProbeDetector over a stand-in hidden-states client."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from faithproxy.clients.hidden_states import Features, HiddenStates, HiddenStatesClient
from faithproxy.detectors.features import chain_text, read_step_features
from faithproxy.detectors.probe import Probe, ProbeDetector, ProbeFileError
from faithproxy.detectors.registry import DetectorDeps
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.errors import DetectorError, ProbeMismatch, UpstreamError
from faithproxy.faithcore.reasoning_formats import ReasoningFormat
from faithproxy.faithcore.types import Channel, Faithfulness, Step, StepKind

H = 4
LAYERS = [1, 2]


def make_probe(**overrides: Any) -> Probe:
    """P(unfaithful) rises with the first feature of layer 2 (input index H)."""
    weights = np.zeros(H * len(LAYERS))
    weights[H] = 4.0
    classifier = {"kind": "logistic", "mean": np.zeros(H * 2), "std": np.ones(H * 2), "weights": weights, "bias": 0.0}
    fields: dict[str, Any] = {
        "model": "tiny-vlm",
        "layers": LAYERS,
        "hidden_size": H,
        "classifier": classifier,
        "threshold": 0.5,
        "training": {"data_sha256": "ab" * 32, "n_train": 10},
        "validation": {"f1": 0.8, "auroc": 0.9},
    }
    return Probe(**(fields | overrides))


def test_round_trip_keeps_predictions_and_metadata(tmp_path: Path) -> None:
    probe = make_probe()
    path = tmp_path / "probe.json"
    probe.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "faithproxy-probe" and data["version"] == 1
    assert data["model"] == "tiny-vlm" and data["layers"] == LAYERS and data["recipe"]["name"] == "last_token"
    assert data["training"]["data_sha256"] == "ab" * 32 and data["validation"]["f1"] == 0.8
    loaded = Probe.load(path)
    x = np.random.default_rng(0).normal(size=(5, H * 2))
    np.testing.assert_allclose(loaded.predict(x), probe.predict(x))
    assert loaded.threshold == 0.5 and loaded.layers == LAYERS


def test_mlp_classifier_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    classifier = {"kind": "mlp", "mean": np.zeros(8), "std": np.ones(8), "w1": rng.normal(size=(8, 3)),
                  "b1": np.zeros(3), "w2": rng.normal(size=3), "b2": 0.1}  # fmt: skip
    probe = make_probe(classifier=classifier)
    probe.save(tmp_path / "p.json")
    x = rng.normal(size=(4, 8))
    np.testing.assert_allclose(Probe.load(tmp_path / "p.json").predict(x), probe.predict(x))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "something-else"}, "not a faithproxy probe"),
        ({"version": 99}, "version 99"),
        ({"recipe": {"name": "mean_pool"}}, "unknown feature recipe"),
        ({"threshold": 1.5}, "not a probability"),
        ({"hidden_size": 5}, "classifier has 8 inputs"),
    ],
)
def test_malformed_files_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    data = make_probe().to_json() | change
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(ProbeFileError, match=message):
        Probe.load(tmp_path / "p.json")


def test_refuses_another_model_with_409() -> None:
    with pytest.raises(ProbeMismatch) as info:
        make_probe().check_compatible(model="other-vlm")
    assert info.value.status_code == 409 and info.value.code == "probe_mismatch"
    assert "tiny-vlm" in info.value.message and "other-vlm" in info.value.message


def test_refuses_layers_the_server_does_not_capture() -> None:
    with pytest.raises(ProbeMismatch, match=r"missing \[2\]"):
        ProbeDetector(make_probe(), FakeHidden(layers=[0, 1]))


def test_wrong_feature_width_is_a_mismatch() -> None:
    with pytest.raises(ProbeMismatch, match="expects 8 features"):
        make_probe().predict(np.zeros((1, 6)))


def test_features_json_round_trip() -> None:
    vectors = np.arange(8, dtype=np.float32).reshape(2, 4)
    features = Features(vectors, [1, 2])
    back = Features.from_json(json.loads(json.dumps(features.to_json())))
    np.testing.assert_array_equal(back.vectors, vectors)
    assert back.layers == [1, 2] and back.recipe == "last_token"
    np.testing.assert_array_equal(back.select([2]), vectors[1])
    with pytest.raises(ValueError, match="not captured"):
        back.select([3])


# ---- the detector over a stand-in client ------------------------------------------------------


class FakeHidden(HiddenStatesClient):
    """Answers each capture with states whose layer-2 first value is the step's `score` (by text)."""

    def __init__(self, layers: list[int] = LAYERS, scores: dict[str, float] | None = None, fail: bool = False):
        super().__init__(generator=None, layers=layers)  # type: ignore[arg-type]
        self.scores = scores or {}
        self.fail = fail
        self.texts: list[str] = []

    async def capture(self, model: str, messages: list[dict[str, Any]], assistant_text: str) -> HiddenStates:
        if self.fail:
            raise UpstreamError("vLLM returned no hidden_states_path", code="no_hidden_states")
        self.texts.append(assistant_text)
        last = assistant_text.rsplit(".", 2)[-2].strip() + "." if "." in assistant_text else assistant_text
        states = np.zeros((3, len(self.layers), H), dtype=np.float32)
        states[-1, self.layers.index(2), 0] = self.scores.get(last.split("\n")[-1].strip(), 0.0)
        return HiddenStates(np.arange(3), states, self.layers)


def step(index: int, text: str, kind: StepKind = StepKind.PERCEPTION, raw: str | None = None) -> Step:
    return Step(index=index, text=text, raw=raw if raw is not None else f" {text}", kind=kind)


def ctx(reasoning_format: ReasoningFormat | None = None, **options: Any) -> RequestView:
    return RequestView(request_id="r", model="tiny-vlm", messages=[{"role": "user", "content": "q"}], question="q",
                       options=options, reasoning_format=reasoning_format)  # fmt: skip


async def test_detector_scores_perception_steps_and_uses_request_threshold() -> None:
    hidden = FakeHidden(scores={"The ball is red.": 2.0, "It is small.": -2.0})
    detector = ProbeDetector(make_probe(), hidden)
    steps = [
        step(0, "The ball is red.", raw="<think>\nThe ball is red."),
        step(1, "So it is red.", StepKind.REASONING),
        step(2, "It is small."),
    ]
    result = await detector.check(ctx(), steps)
    verdicts = result.verdicts
    assert [v.faithfulness for v in verdicts] == [Faithfulness.UNFAITHFUL, Faithfulness.FAITHFUL, Faithfulness.FAITHFUL]
    assert verdicts[0].score == pytest.approx(1 / (1 + np.exp(-8.0)))
    assert verdicts[1].score is None
    # one capture per perception step, each ending at that step, without trailing space
    assert hidden.texts == ["<think>\nThe ball is red.", "<think>\nThe ball is red. So it is red. It is small."]
    # the features come back in the result, one per step; the steps are left as they were (the driver
    # puts the features on them, as below)
    assert result.features is not None and isinstance(result.features[0], Features) and result.features[1] is None
    assert steps[0].features is None
    for s, features in zip(steps, result.features, strict=True):
        s.features = features
    # a threshold above the score passes it; the features are not read again
    fresh = (await detector.check(ctx(probe_threshold=0.99999), steps)).verdicts
    assert fresh[0].faithfulness is Faithfulness.FAITHFUL and len(hidden.texts) == 2


async def test_detector_refuses_other_model_and_wraps_capture_errors() -> None:
    detector = ProbeDetector(make_probe(), FakeHidden(fail=True))
    other = dataclasses.replace(ctx(), model="other-vlm")
    with pytest.raises(ProbeMismatch):
        detector.validate_request(other)
    with pytest.raises(DetectorError, match="hidden states unavailable"):
        await detector.check(ctx(), [step(0, "The ball is red.")])


def test_chain_text_restores_think_tag_for_reasoning_channel() -> None:
    steps = [Step(index=0, text="A.", raw="A.", channel=Channel.REASONING)]
    assert chain_text(steps) == "<think>A."
    assert chain_text([step(0, "A.", raw="<think>\nA.")]) == "<think>\nA."


def test_capture_text_follows_the_reasoning_format() -> None:
    """The capture's partial message renders the chain as the model saw it: the opening think marker is
    the model's own (think), the template's (think_prompt: written back, since a partial message replaces
    the generation prompt's tail), or left to the template (qwen3, which re-renders a think block itself)."""
    from faithproxy.detectors.features import capture_texts, chain_text
    from faithproxy.faithcore.reasoning_formats import get_format

    def parsed(index: int, raw: str, channel: Channel = Channel.REASONING) -> Step:
        return Step(index=index, text=raw.strip(), raw=raw, channel=channel, kind=StepKind.PERCEPTION)

    think, prompt, qwen3 = get_format("think"), get_format("think_prompt"), get_format("qwen3")
    accepted = [parsed(0, "\nThe ball is red.")]
    assert chain_text(accepted, think) == "<think>\nThe ball is red."
    assert chain_text(accepted, prompt) == "<think>\n\nThe ball is red."
    assert chain_text([parsed(0, "The ball is red.")], prompt) == "<think>\nThe ball is red."
    assert chain_text([parsed(0, "The ball is red.")], qwen3) == "The ball is red."
    # unparsed (all in content): think_prompt's model never wrote the marker; think's did
    assert chain_text([parsed(0, "The ball is red.", Channel.CONTENT)], prompt) == "<think>\nThe ball is red."
    assert chain_text([parsed(0, "<think>\nThe ball is red.", Channel.CONTENT)], think) == "<think>\nThe ball is red."
    # an answer step after parsed thinking: the closing marker the parser dropped is back
    both = [parsed(0, "The ball is red."), parsed(1, "\n\nIt is red.", Channel.CONTENT)]
    assert chain_text(both, prompt) == "<think>\nThe ball is red.</think>\n\nIt is red."
    # the first batch of a chain (nothing accepted yet) keeps the marker in front of its first step
    prefix, pieces = capture_texts([], both, prompt)
    assert (prefix, pieces) == ("<think>\n", ["The ball is red.", "</think>\n\nIt is red."])
    assert capture_texts(both[:1], both[1:], prompt) == ("<think>\nThe ball is red.", ["</think>\n\nIt is red."])


async def test_detector_captures_with_the_requests_format() -> None:
    from faithproxy.faithcore.reasoning_formats import get_format

    hidden = FakeHidden(scores={"The ball is red.": 2.0})
    detector = ProbeDetector(make_probe(), hidden)
    first = Step(index=0, text="The ball is red.", raw="The ball is red.", channel=Channel.REASONING,
                 kind=StepKind.PERCEPTION)  # fmt: skip
    verdicts = (await detector.check(ctx(get_format("think_prompt")), [first])).verdicts
    assert hidden.texts == ["<think>\nThe ball is red."] and verdicts[0].faithfulness is Faithfulness.UNFAITHFUL
    # features of another recipe (a trace's) are read again under the probe's own
    first.features = Features(np.zeros((2, H), dtype=np.float32), LAYERS, recipe="mean_last_4")
    again = await detector.check(ctx(get_format("qwen3")), [first])
    assert again.features is not None and again.features[0] is not None
    assert hidden.texts[-1] == "The ball is red." and again.features[0].recipe == "last_token"


def test_mean_last_recipe() -> None:
    from faithproxy.detectors.probe import features_of, parse_recipe

    states = np.arange(4 * 2 * H, dtype=np.float32).reshape(4, 2, H)
    got = features_of(HiddenStates(np.arange(4), states, LAYERS), parse_recipe("mean_last_2"))
    assert got.recipe == "mean_last_2" and np.allclose(got.vectors, states[2:].mean(0))
    assert features_of(HiddenStates(np.arange(4), states, LAYERS), parse_recipe("last_token")).recipe == "last_token"
    with pytest.raises(ProbeFileError, match="unknown feature recipe 'mean_last_0'"):
        parse_recipe("mean_last_0")
    data = make_probe(recipe=parse_recipe("mean_last_8")).to_json()
    assert Probe.from_json(data).recipe == {"name": "mean_last", "tokens": 8, "standardize": True}
    data["recipe"] = {"name": "mean_last", "tokens": "8"}
    with pytest.raises(ProbeFileError, match="whole number of tokens"):
        Probe.from_json(data)


async def test_features_for_traces_are_returned_not_written() -> None:
    """The server's feature recorder (any detector, FAITHPROXY_RECORD_FEATURES): `last_token` features of
    the perception steps that have none, in the capture the request's format renders; a failed capture
    leaves every step without."""
    from faithproxy.faithcore.reasoning_formats import get_format

    hidden = FakeHidden()
    steps = [step(0, "The ball is red."), step(1, "So it is red.", StepKind.REASONING), step(2, "It is small.")]
    features = await read_step_features(hidden, ctx(get_format("think")), steps)
    assert [f is not None for f in features] == [True, False, True]
    assert all(f is None or f.recipe == "last_token" for f in features)
    assert all(s.features is None for s in steps) and len(hidden.texts) == 2
    assert await read_step_features(FakeHidden(fail=True), ctx(), steps) == (None, None, None)
    steps[0].features, steps[2].features = features[0], features[2]
    assert await read_step_features(hidden, ctx(), steps) == (None, None, None) and len(hidden.texts) == 2


def test_the_probe_reads_its_own_file(tmp_path: Path) -> None:
    """The server hands over the path (FAITHPROXY_PROBE_PATH); the probe's from_deps loads it, and a bad
    file stops the build (the server's start)."""
    path = tmp_path / "probe.json"
    make_probe().save(path)
    built = ProbeDetector.from_deps(DetectorDeps(probe_path=str(path), hidden=FakeHidden()), {})
    assert built is not None and built.probe.model == "tiny-vlm"
    assert ProbeDetector.from_deps(DetectorDeps(probe_path=str(path)), {}) is None  # no hidden states
    path.write_text("{}", encoding="utf-8")
    with pytest.raises(ProbeFileError):
        ProbeDetector.from_deps(DetectorDeps(probe_path=str(path), hidden=FakeHidden()), {})
