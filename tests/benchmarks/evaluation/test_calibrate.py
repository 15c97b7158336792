"""`faithproxy bench calibrate` on a tiny labelled file with a scripted judge that gives confidences."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from faithproxy.benchmarks.evaluation.calibrate import Flag, curve, judge_line, pick
from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep, write_chains
from faithproxy.cli import main
from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig, JudgeResult, UserTurn, turn_text
from faithproxy.clients.logprobs import TokenChoice
from faithproxy.detectors.judge_prompt import parse_judge_prompt_details
from faithproxy.faithcore.images import ImageRef

# what the scripted judge flags, with its P(UNFAITHFUL); the gold labels say which flags are right
FLAGS = {"The square is red.": 0.9, "The circle is blue.": 0.55, "The star is green.": 0.4}
CHAINS = [
    ("c1", [("The square is red.", False), ("So the answer is A.", None)]),
    ("c2", [("The circle is blue.", True), ("The star is green.", False)]),
    ("c3", [("There is a triangle.", True), ("So the answer is B.", None)]),
]


class ScriptedJudge(JudgeBackend):
    """Flags the first checked sentence found in FLAGS, with its confidence in the verdict token."""

    async def complete(self, system: str, user: UserTurn, images: Sequence[ImageRef] = ()) -> JudgeResult:
        prompt = parse_judge_prompt_details(turn_text(user))
        checked = list(enumerate(prompt.sentences))[prompt.already_checked :]
        hit = next(((k, FLAGS[s]) for k, s in checked if s in FLAGS), None)
        if hit is None:
            return JudgeResult("[Faithfulness]: FAITHFUL", 10, 5, 0.0)
        text = f"[Faithfulness]: UNFAITHFUL\n[First unfaithful sentence]: {hit[0] + 1}"
        top = (("UNFAITHFUL", math.log(hit[1])), ("FAITHFUL", math.log(1 - hit[1])))
        tail = text[len("[Faithfulness]: UNFAITHFUL") :]
        tokens = (TokenChoice("[Faithfulness]: ", 0.0), TokenChoice("UNFAITHFUL", top[0][1], top))
        return JudgeResult(text, 10, 5, 0.0, tokens=(*tokens, TokenChoice(tail, 0.0)))

    async def aclose(self) -> None:
        pass


def test_the_curve_and_the_pick() -> None:
    flags = [Flag(True, True, 0.9), Flag(False, True, 0.55), Flag(True, True, 0.4), Flag(False, False)]
    points = {p.threshold: p for p in curve(flags, [0.0, 0.5, 0.6, 0.95], detect_tokens=100, tokens_per_call=10)}
    assert (points[0.0].precision, points[0.0].recall, points[0.0].rewrite_tries) == (pytest.approx(2 / 3), 1.0, 9)
    assert (points[0.6].precision, points[0.6].recall, points[0.6].false_flag_tries) == (1.0, 0.5, 0)
    assert points[0.6].judge_tokens == 100 + 3 * 10 and points[0.95].flags == 0 and points[0.95].precision is None
    assert pick(list(points.values()), "precision", 0.9).threshold == 0.6  # type: ignore[union-attr]
    assert pick(list(points.values()), "recall", 0.9).threshold == 0.0  # type: ignore[union-attr]
    assert pick(list(points.values()), "f1").threshold == 0.0  # type: ignore[union-attr]
    assert pick(list(points.values()), "recall", 1.1) is None
    # a flag without a confidence is always acted on: thresholds do not apply to it
    assert curve([Flag(True, True, None)], [0.9])[0].recall == 1.0
    config = JudgeConfig(name="j", backend="openai", model="m", api_key="secret")  # type: ignore[arg-type]
    line = json.loads(judge_line(config, 0.6))
    assert line["flag_threshold"] == 0.6 and "api_key" not in line and line["name"] == "j"


def test_the_command_replays_the_judge_and_writes_the_pick_and_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import faithproxy.clients.judges as judges

    def step(text: str, faithful: bool | None) -> LabelledStep:
        return LabelledStep(text, "perception" if faithful is not None else "reasoning", faithful)

    chains = [LabelledChain(cid, "Which?", [step(t, f) for t, f in steps]) for cid, steps in CHAINS]
    path = tmp_path / "validation.jsonl"
    write_chains(path, chains)
    monkeypatch.setattr(judges, "build_judges", lambda configs: {c.name: ScriptedJudge(c) for c in configs})
    config = [{"name": "s", "backend": "openai", "model": "m", "api_key": "k", "flag_threshold": 0.3}]
    out, png = tmp_path / "curve.json", tmp_path / "curve.png"
    argv = ["bench", "calibrate", "--judge", "s", "--chains", str(path), "--judges", json.dumps(config),
            "--target", "precision", "--at-least", "0.9", "--png", str(png), "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["labelled_perception_steps"] == 4 and data["flags_without_confidence"] == 0
    first = data["curve"][0]  # threshold 0: every flag acted on (the configured 0.3 is not applied in the replay)
    assert (first["true_flags"], first["false_flags"], first["missed"]) == (2, 1, 0)
    assert data["chosen"]["threshold"] == 0.6 and data["chosen"]["precision"] == 1.0 and data["chosen"]["recall"] == 0.5
    assert json.loads(data["judge_config"])["flag_threshold"] == 0.6
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "chosen for precision: 0.60" in printed and '"flag_threshold": 0.6' in printed
