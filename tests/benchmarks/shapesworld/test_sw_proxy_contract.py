"""The world language must pass through the proxy's own step machinery unchanged: its segmenter must
cut a chain into exactly our sentences, and its heuristic typer must type them as we label them."""

from faithproxy.benchmarks.shapesworld.dataset import generate_items
from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.segmenter import segment_text


def test_segmenter_and_typer_agree_with_the_chain_labels():
    for item in generate_items(0, 60, hallucination_rate=0.5):
        segments = [s.text for s in segment_text(item.chain.text()) if s.text]
        assert segments == [*item.chain.sentences, f"The answer is {item.chain.answer}."]
        assert [classify_step(s.text).value for s in item.chain.steps] == [s.kind for s in item.chain.steps]
