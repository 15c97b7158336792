import hashlib
import json

from faithproxy.benchmarks.shapesworld.dataset import generate_items, main
from faithproxy.benchmarks.shapesworld.export import write_chains_jsonl
from faithproxy.benchmarks.shapesworld.scenes import png_bytes, render

FIELDS = {"id", "question", "image", "steps", "answer", "gold_answer"}


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_records_have_the_labelled_chain_fields(tmp_path):
    items = list(generate_items(4, 30, hallucination_rate=0.5))
    path = tmp_path / "chains.jsonl"
    assert write_chains_jsonl(path, ((i.id, i.scene, i.question, i.chain) for i in items)) == 30
    records = _read(path)
    assert len({r["id"] for r in records}) == 30
    for record, item in zip(records, items, strict=True):
        assert set(record) == FIELDS
        assert record["image"] == hashlib.sha256(png_bytes(render(item.scene))).hexdigest()
        assert record["question"] == item.question.prompt
        assert record["answer"] == item.chain.answer and record["gold_answer"] == item.question.gold_letter
        for step in record["steps"]:
            assert set(step) == {"text", "kind", "faithful"}
            assert step["kind"] in ("perception", "reasoning")
            assert step["faithful"] in ((True, False) if step["kind"] == "perception" else (None,))
    assert any(s["faithful"] is False for r in records for s in r["steps"])


def test_image_paths_when_images_are_written(tmp_path):
    items = list(generate_items(4, 5))
    write_chains_jsonl(tmp_path / "c.jsonl", ((i.id, i.scene, i.question, i.chain) for i in items), tmp_path / "img")
    assert len(list((tmp_path / "img").glob("*.png"))) == 5
    for record, item in zip(_read(tmp_path / "c.jsonl"), items, strict=True):
        with open(record["image"], "rb") as image:
            assert image.read() == png_bytes(render(item.scene))


def test_items_are_reproducible_and_independent_of_count():
    assert list(generate_items(2, 12))[-3:] == list(generate_items(2, 3, start=9))


def test_command_line_writes_chains_and_examples(tmp_path, capsys):
    out, examples = tmp_path / "sw" / "chains.jsonl", tmp_path / "sw" / "examples.jsonl"
    argv = ["--seed", "1", "--count", "20", "--out", str(out), "--images", str(tmp_path / "img")]
    assert main([*argv, "--hallucination-rate", "0.5", "--examples", str(examples)]) == 0
    assert len(_read(out)) == 20
    tasks = {r["task"] for r in _read(examples)}
    assert tasks == {"regeneration", "self_check"}
    assert "wrote 20 chains" in capsys.readouterr().out
