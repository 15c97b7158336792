"""Real vLLM serves the committed ShapesWorld model, with the same greedy output as transformers.

The model is float32 and vLLM runs it in float32 (`tinyvlm.serve`); images are 84x84, a square
patch grid (a non-square grid is where the issue's trial saw the two engines disagree).
"""

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from shapesworld.model import WEIGHTS_DIR

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (WEIGHTS_DIR / "config.json").is_file(), reason="no committed weights"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

N_PARITY = 10


@pytest.fixture(scope="module")
def heldout() -> list[Any]:
    from shapesworld.model.scoring import heldout_items

    return heldout_items(N_PARITY)


@pytest.fixture(scope="module")
def transformers_replies(heldout: list[Any]) -> list[str]:
    """Computed before vLLM starts, so that the two never share the CPU."""
    from shapesworld.model.evaluate import transformers_replies as replies

    return replies(WEIGHTS_DIR, [(i.question.prompt, i.scene) for i in heldout], 160)


@pytest.fixture(scope="module")
def client(transformers_replies: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from shapesworld.model.evaluate import SERVED_NAME, VLLMClient
    from tinyvlm.serve import VLLMStartError, start_vllm

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    try:
        server = start_vllm(WEIGHTS_DIR, served_model_name=SERVED_NAME, log_path=log_path)
    except VLLMStartError as exc:
        pytest.fail(str(exc))
    with server:
        yield VLLMClient(server.openai_base_url, server.model, 160)


def test_vllm_answers_with_well_formed_chains_identical_to_transformers(
    client: Any, heldout: list[Any], transformers_replies: list[str]
) -> None:
    from shapesworld.model.scoring import score_reply

    replies = [client.reply(i.question.prompt, i.scene) for i in heldout]  # one at a time
    assert all(score_reply(i, r).well_formed for i, r in zip(heldout, replies, strict=True)), replies
    assert replies == transformers_replies
