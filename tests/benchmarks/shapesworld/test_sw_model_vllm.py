"""Real vLLM serves the committed ShapesWorld model, with the same greedy output as transformers.

The model is float32 and vLLM runs it in float32 (`tinyvlm.serve`); images are 84x84, a square
patch grid (a non-square grid is where the issue's trial saw the two engines disagree).
"""

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (WEIGHTS_DIR / "config.json").is_file(), reason="no committed weights"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

N_PARITY = 10


@pytest.fixture(scope="module")
def heldout() -> list[Any]:
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    return heldout_items(N_PARITY)


@pytest.fixture(scope="module")
def transformers_replies(heldout: list[Any]) -> list[str]:
    """Computed before vLLM starts, so that the two never share the CPU."""
    from faithproxy.benchmarks.shapesworld.model.evaluate import transformers_replies as replies

    return replies(WEIGHTS_DIR, [(i.question.prompt, i.scene) for i in heldout], 160)


@pytest.fixture(scope="module")
def server(transformers_replies: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError, start_vllm

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        server = start_vllm(WEIGHTS_DIR, served_model_name=SERVED_NAME, log_path=log_path)
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    with server:
        yield server


@pytest.fixture(scope="module")
def judge_server(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The learned judge on a second vLLM, started as `faithproxy bench shapesworld` starts it."""
    from faithproxy.benchmarks.evaluation.shapesworld_bench import JUDGE_WEIGHTS_DIR, start_judge
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError

    if not (JUDGE_WEIGHTS_DIR / "config.json").is_file():
        pytest.skip("no committed judge weights")
    try:
        judge = start_judge(JUDGE_WEIGHTS_DIR, tmp_path_factory.mktemp("judge-vllm") / "vllm.log")
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    with judge:
        yield judge


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    from faithproxy.benchmarks.shapesworld.model.evaluate import VLLMClient

    return VLLMClient(server.openai_base_url, server.model, 160)


def test_vllm_answers_with_well_formed_chains_identical_to_transformers(
    client: Any, heldout: list[Any], transformers_replies: list[str]
) -> None:
    from faithproxy.benchmarks.shapesworld.model.scoring import score_reply

    replies = [client.reply(i.question.prompt, i.scene) for i in heldout]  # one at a time
    assert all(score_reply(i, r).well_formed for i, r in zip(heldout, replies, strict=True)), replies
    assert replies == transformers_replies


async def test_the_benchmark_scores_vanilla_and_corrected_chains_by_ground_truth(
    server: Any, judge_server: Any, client: Any, heldout: list[Any], tmp_path: Any
) -> None:
    """A small `faithproxy bench shapesworld` run: real vLLM, the proxy, the pixel judge over HTTP, and
    the learned judge on a second real vLLM through the OpenAI-compatible judge backend."""
    from faithproxy.benchmarks.evaluation.shapesworld_bench import (
        chain_scores,
        draft_scores,
        labelled_record,
        run_all,
        score_rows,
    )

    items = heldout[:5]
    raw = await run_all(
        server.base_url, items, ["judge", "judge:learned"], 5, tmp_path, 3, judge_url=judge_server.base_url
    )
    assert raw["vanilla_replies"] == [client.reply(i.question.prompt, i.scene) for i in items]  # greedy, untouched
    replies = raw["judge"]["replies"]
    traces = [raw["traces"][request_id] for _, request_id, _ in replies]  # one trace per request, none lost
    drafts = draft_scores(items, traces)
    truth = drafts["detector_vs_ground_truth"]
    assert drafts["draft_perception_steps"] > 0
    # The pixel judge reads the same objects the scenes were drawn from: it flags exactly the false drafts.
    assert truth["fp"] == 0 and truth["fn"] == 0, drafts
    flagged = truth["tp"]
    assert sum(drafts["regeneration_outcomes"].values()) == flagged
    corrected = chain_scores(items, [content for content, _, _ in replies])
    residual = sum(s["residual"] for t in traces for s in t["steps"] if s["kind"] == "perception")
    # Every false sentence left in the returned chains is one the proxy kept after K failed tries.
    assert corrected["unfaithful_steps"] == residual
    fixed = sum(n for k, n in drafts["regeneration_outcomes"].items() if k.startswith("fixed"))
    assert drafts["accepted_fixes_true_by_ground_truth"] == (1.0 if fixed else 0.0)
    record = labelled_record(items[0], replies[0][0], items[0].id)
    assert record["gold_answer"] == items[0].question.gold_letter and record["steps"]
    assert {s["kind"] for s in record["steps"]} <= {"perception", "reasoning"}

    rows = score_rows(items, raw, ["judge", "judge:learned"])
    pixels, learned = rows["judge"], rows["judge:learned"]
    assert pixels["false_flags"]["steps"] == 0 and pixels["judge_bill"]["calls"] > 0
    # The learned judge, reached as a deployment reaches a vLLM-served VLM: every request billed, the
    # prompt tokens vLLM read from its prefix cache reported apart (--enable-prompt-tokens-details),
    # every reply read by the detector's parser, at most one image description per request.
    bill = learned["judge_bill"]
    assert bill["calls"] >= len(items) and bill["input_tokens"] > 0 and bill["output_tokens"] > 0
    assert bill["cached_input_tokens"] > 0
    assert 1 <= bill["descriptions"] <= len(items)
    assert learned["unchecked_steps"] == {}
    g = learned["detector_vs_ground_truth"]
    assert g["tp"] + g["fp"] + g["fn"] + g["tn"] == learned["draft_perception_steps"] > 0
    assert learned["false_flags"]["steps"] >= g["fp"]  # false flags on reasoning steps count there too
    kinds = learned["errors_by_kind"]
    assert sum(c["fp"] for c in kinds["by_step_type"].values()) == g["fp"]
    assert sum(kinds["missed_by_error_kind"].values()) == g["fn"]
    # Greedy decoding: a chain in which the detector flagged nothing (one round) is the one vanilla vLLM wrote.
    for row in rows.values():
        assert row["untouched_identical_to_vanilla"] in (None, 1.0), row["answers_vs_vanilla"]
        assert row["answers_vs_vanilla"]["by_cause"]["untouched"]["answers_changed"] == 0
    # A chain whose flags were all kept resumed after each: its text may differ from vanilla's (the
    # dropped read-ahead spent max_tokens), and it is counted apart, never as untouched.
    kept = learned["answers_vs_vanilla"]["by_cause"]["kept"]["chains"]
    assert (learned["kept_identical_to_vanilla"] is None) == (kept == 0)


async def test_reflect_regenerator_samples_n_rewrites_from_real_vllm(server: Any) -> None:
    """vLLM honours `n` and the per-try seeds: a sampled try gets n rewrites, the same ones each time,
    and the regenerator hands back neither the flagged sentence nor a rejected rewrite."""
    from faithproxy.benchmarks.shapesworld.dataset import generate_items
    from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED, user_message
    from faithproxy.benchmarks.shapesworld.model.evaluate import data_url
    from faithproxy.clients.vllm import VLLMClient, choice_texts
    from faithproxy.faithcore.context import RequestView
    from faithproxy.faithcore.types import Step, StepKind
    from faithproxy.regenerators.prompts import build_regeneration_prompt
    from faithproxy.regenerators.reflect import ReflectRegenerator

    item = next(i for i in generate_items(HELDOUT_SEED, 20, hallucination_rate=1.0) if i.hallucination)
    chain = item.chain
    k = chain.first_unfaithful
    assert k is not None
    image = data_url(item.scene)
    messages = [user_message(item.question.prompt, image)]
    generator = VLLMClient(server.base_url)
    prompt = build_regeneration_prompt(item.question.prompt, chain.sentences[:k], chain.sentences[k])
    try:
        body = {
            "model": server.model,
            "messages": [user_message(prompt, image)],
            "max_tokens": 40,
            "temperature": 0.8,
            "n": 4,
            "seed": 8,
        }
        first, again = [choice_texts(await generator.chat(body)) for _ in range(2)]
        assert len(first) == 4 and first == again
        regenerator = ReflectRegenerator(generator, temperature=0.8, max_tokens=40, samples=4)
        step = Step(index=k, text=chain.sentences[k], raw=chain.sentences[k], kind=StepKind.PERCEPTION)
        for attempt in (1, 2, 3):
            view = RequestView("r", server.model, messages, item.question.prompt)
            rewrite = await regenerator.regenerate(view, chain.sentences[:k], step, attempt)
            candidate = rewrite.candidate
            assert candidate is None or (candidate != step.text and candidate not in step.rejected)
            assert rewrite.usage.completion_tokens > 0
            if candidate is not None:
                step.rejected.append(candidate)  # as the session does when the detector rejects it
    finally:
        await generator.aclose()
