"""The learned ShapesWorld judge on real vLLM with log-probabilities on: the judge detector, through the
OpenAI-compatible backend, reads its confidence in a flag from the reply's tokens (the call recorded in
tests/detectors/vllm_logprobs/unfaithful.json, made again live). The same judge through the Anthropic
backend (vLLM serves the Messages API too), which gives no log-probabilities: self-consistency asks the
flag again and its confidence is the share of replies that agree."""

import base64
import importlib.util
import io
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from faithproxy.benchmarks.evaluation.shapesworld_bench import JUDGE_SERVED_NAME, JUDGE_WEIGHTS_DIR

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (JUDGE_WEIGHTS_DIR / "config.json").is_file(), reason="no committed judge weights"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from faithproxy.benchmarks.evaluation.shapesworld_bench import start_judge
    from faithproxy.benchmarks.tinyvlm.serve import VLLMStartError

    try:
        judge = start_judge(JUDGE_WEIGHTS_DIR, tmp_path_factory.mktemp("judge-vllm") / "vllm.log")
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    with judge:
        yield judge


async def judged(judge_server: Any, backend: str, samples: int = 1) -> tuple[list[Any], int, Any]:
    """The judge detector's verdicts on one corpus call (a flagged sentence, description given), the index
    the corpus marks as the first unfaithful sentence, and the request's judge bill."""
    from faithproxy.benchmarks.shapesworld.model.judge_corpus import judge_seed, judge_stream
    from faithproxy.benchmarks.shapesworld.model.train_judge import truth_of
    from faithproxy.clients.judges import JudgeConfig, build_judge
    from faithproxy.detectors.judge import JudgeDetector
    from faithproxy.detectors.judge_prompt import parse_judge_prompt_details
    from faithproxy.faithcore.context import RequestView
    from faithproxy.faithcore.images import parse_image_url
    from faithproxy.faithcore.types import Step, StepKind

    corpus = itertools.islice(judge_stream(judge_seed(7)), 200)
    sample = next(
        s for s in corpus if truth_of(s) is not None and not parse_judge_prompt_details(s.text).asks_description
    )
    prompt = parse_judge_prompt_details(sample.text)
    buffer = io.BytesIO()
    sample.image().save(buffer, format="PNG")
    image = parse_image_url("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    config = JudgeConfig(
        name="learned",
        backend=backend,
        model=JUDGE_SERVED_NAME,
        # the OpenAI SDK is given the /v1 root, the Anthropic SDK the server's (it adds /v1/messages)
        base_url=judge_server.openai_base_url if backend == "openai" else judge_server.base_url,
        api_key="EMPTY",  # type: ignore[arg-type]
        max_tokens=64,
        temperature=0.0,
        timeout_s=120,
    )
    counts = {"learned": samples} if samples > 1 else None
    detector = JudgeDetector({"learned": build_judge(config)}, "learned", samples=counts)
    as_steps = [Step(index=i, text=t, raw=t, kind=StepKind.PERCEPTION) for i, t in enumerate(prompt.sentences)]
    view = RequestView("r", "m", [], prompt.question, (image,), accepted=tuple(as_steps[: prompt.already_checked]))
    view.judge_state.description = prompt.description  # the call as the corpus wrote it, description given
    try:
        verdicts = (await detector.check(view, as_steps[prompt.already_checked :])).verdicts
    finally:
        await detector.aclose()
    return list(verdicts), truth_of(sample) - prompt.already_checked, view.judge_state.summary()


async def test_the_learned_judge_s_flag_carries_its_confidence(judge_server: Any) -> None:
    from faithproxy.faithcore.types import Faithfulness

    verdicts, truth, _ = await judged(judge_server, "openai")
    flagged = [v for v in verdicts if v.faithfulness is Faithfulness.UNFAITHFUL]
    assert len(flagged) == 1 and verdicts.index(flagged[0]) == truth
    # recorded: UNFAITHFUL at 0.68 against FAITHFUL at 0.32, the sentence number certain
    assert flagged[0].confidence == pytest.approx(0.676, abs=0.05)


async def test_through_the_anthropic_api_self_consistency_gives_the_confidence(judge_server: Any) -> None:
    """Greedy, so all 4 replies agree: the confidence is 4/4, and the 3 extra calls are billed. (What
    sampled replies agree on is the judge's, not the proxy's, to decide: not asserted here.)"""
    from faithproxy.faithcore.types import Faithfulness

    alone, truth, _ = await judged(judge_server, "anthropic")
    flagged = [v for v in alone if v.faithfulness is Faithfulness.UNFAITHFUL]
    assert len(flagged) == 1 and alone.index(flagged[0]) == truth
    assert flagged[0].confidence is None  # no log-probabilities on the Messages API: unknown
    verdicts, _, bill = await judged(judge_server, "anthropic", samples=4)
    flagged = [v for v in verdicts if v.faithfulness is Faithfulness.UNFAITHFUL]
    assert len(flagged) == 1 and verdicts.index(flagged[0]) == truth
    assert flagged[0].confidence == 1.0
    assert bill["calls"] == 4, bill
