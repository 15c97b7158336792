"""The ShapesWorld pixel judge on the wire: faithproxy's own judge detector, through the real anthropic
and openai SDKs, gets verdicts read off the image's pixels (no oracle, no stored scene)."""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from faithproxy.benchmarks.shapesworld.chains import reference_chain
from faithproxy.benchmarks.shapesworld.language import parse_claim, render_claim
from faithproxy.benchmarks.shapesworld.perturb import perturb_claim
from faithproxy.benchmarks.shapesworld.pixel_judge import PixelJudge
from faithproxy.benchmarks.shapesworld.questions import make_question
from faithproxy.benchmarks.shapesworld.scenes import generate_scene, png_bytes, render
from faithproxy.benchmarks.standins.judge_server import create_app, running_judge_server
from faithproxy.clients.judges import JudgeConfig, build_judge
from faithproxy.detectors.judge import JudgeDetector
from faithproxy.detectors.judge_prompt import build_judge_prompt
from faithproxy.faithcore.context import RequestView
from faithproxy.faithcore.images import parse_image_url
from faithproxy.faithcore.types import Faithfulness, Step, StepKind
from tests.support import local_judge_config

F, U, N = Faithfulness.FAITHFUL, Faithfulness.UNFAITHFUL, Faithfulness.UNKNOWN


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


@pytest.fixture(params=["anthropic", "openai"])
async def detector(request: pytest.FixtureRequest) -> AsyncIterator[JudgeDetector]:
    async with running_judge_server(create_app(PixelJudge())) as url:
        backend = request.param
        judge = build_judge(local_judge_config(backend, url, name=f"pixels-{backend}"))
        detector = JudgeDetector({judge.name: judge}, judge.name)
        yield detector
        await detector.aclose()


def chain_steps(seed: int) -> Any:
    scene = generate_scene(1234, seed)
    return reference_chain(scene, make_question(scene, random.Random(seed), "attribute")).steps


def chain_with_one_wrong_step(seed: int) -> tuple[bytes, list[str], int]:
    """A scene's reference chain with one object sentence changed to something the image contradicts."""
    scene = generate_scene(1234, seed)
    rng = random.Random(seed)
    chain = reference_chain(scene, make_question(scene, rng, "attribute"))
    texts = [s.text for s in chain.steps]
    candidates = [i for i, s in enumerate(chain.steps) if s.kind == "perception" and parse_claim(s.text) is not None]
    wrong = candidates[-1]
    changed = perturb_claim(parse_claim(texts[wrong]), scene.objects, rng)
    assert changed is not None
    texts[wrong] = render_claim(changed)
    return png_bytes(render(scene)), texts, wrong


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_the_pixel_judge_finds_the_contradicted_sentence(detector: JudgeDetector, seed: int) -> None:
    png, texts, wrong = chain_with_one_wrong_step(seed)
    steps = [Step(index=i, text=t, raw=t, kind=StepKind.PERCEPTION) for i, t in enumerate(texts)]
    view = RequestView(
        request_id=f"sw-{seed}",
        model="generator",
        messages=[],
        question="?",
        images=(parse_image_url(data_url(png)),),
    )
    verdicts = (await detector.check(view, steps)).verdicts
    got = [v.faithfulness for v in verdicts]
    assert got[:wrong] == [F] * wrong and got[wrong] is U, (texts, got)
    assert all(v is N for v in got[wrong + 1 :])  # after the first unfaithful step nothing is judged
    # The judge types sentences itself: the world's perception sentences, then "So ..." reasoning.
    kinds = [StepKind.PERCEPTION if s.kind == "perception" else StepKind.REASONING for s in chain_steps(seed)]
    assert [v.kind for v in verdicts] == kinds


async def test_the_pixel_judge_refuses_a_request_without_an_inline_image() -> None:
    async with running_judge_server(create_app(PixelJudge())) as url, httpx.AsyncClient(base_url=url) as http:
        prompt = build_judge_prompt("?", ["There is 1 object in the image."])
        body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": prompt}]}
        reply = await http.post("/v1/messages", json=body)
        assert reply.status_code == 400 and "inline" in reply.json()["error"]["message"]
        broken = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@@"}}
        body["messages"][0]["content"] = [broken, {"type": "text", "text": prompt}]
        assert (await http.post("/v1/messages", json=body)).status_code == 400


async def test_judge_upr_through_the_pixel_judge_reproduces_ground_truth(tmp_path: Any) -> None:
    """`faithproxy bench judge-upr` (whole-chain evaluation prompt) against the pixel judge: on chains
    with planted errors its labels, and so its UPR, are the ground truth's."""
    from faithproxy.benchmarks.evaluation.judge_upr import judge_upr
    from faithproxy.benchmarks.evaluation.labelled import read_chains
    from faithproxy.benchmarks.evaluation.metrics import upr
    from faithproxy.benchmarks.shapesworld.chains import hallucinated_chain
    from faithproxy.benchmarks.shapesworld.export import write_chains_jsonl

    records = []
    for i in range(12):
        scene = generate_scene(4321, i)
        rng = random.Random(i)
        question = make_question(scene, rng, "count" if i % 2 else "attribute")
        planted = hallucinated_chain(scene, question, rng) if i % 3 else None
        records.append((f"c{i}", scene, question, planted.chain if planted else reference_chain(scene, question)))
    path = tmp_path / "gold.jsonl"
    write_chains_jsonl(path, records, image_dir=tmp_path / "images")
    gold = read_chains(path)
    async with running_judge_server(create_app(PixelJudge())) as url:
        backend = build_judge(JudgeConfig(name="pixels", backend="openai", model="m", base_url=f"{url}/v1",
                                          api_key="k", timeout_s=5, max_retries=0))  # fmt: skip
        labelled, report = await judge_upr(gold, backend, progress=False)
        await backend.aclose()
    assert report.errors == 0 and report.judge_calls == 12
    assert [[(s.kind, s.faithful) for s in c.steps] for c in labelled] == [
        [(s.kind, s.faithful) for s in c.steps] for c in gold
    ]
    truth = upr(gold)
    assert report.upr["unfaithful_steps"] == truth.unfaithful_steps > 0
