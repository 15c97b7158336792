"""`faithproxy probe train|eval` on synthetic feature traces (rare unfaithful steps, separable)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from faithproxy.benchmarks.probes import probe_cli
from faithproxy.cli import main as faithproxy
from faithproxy.clients.hidden_states import Features
from faithproxy.detectors.probe import Probe


def write_traces(path: Path, chains: int, seed: int, model: str = "tiny-vlm") -> None:
    """Chains of 5 steps (4 perception, 1 reasoning); about 1 perception step in 8 is unfaithful, and
    unfaithful steps have a shifted first feature of layer 2."""
    rng = np.random.default_rng(seed)
    with path.open("w") as out:
        for c in range(chains):
            steps = []
            for i in range(5):
                if i == 3:
                    steps.append({"index": i, "kind": "reasoning", "text": "So."})
                    continue
                bad = rng.random() < 0.125
                vectors = rng.normal(size=(2, 6)).astype(np.float32)
                vectors[1, 0] += 6.0 if bad else 0.0
                steps.append({
                    "index": i, "kind": "perception", "text": f"s{i}.", "faithful": not bad,
                    "detected": "unfaithful" if bad else "faithful", "features": Features(vectors, [1, 2]).to_json(),
                })  # fmt: skip
            out.write(json.dumps({"id": f"c{seed}-{c}", "model": model, "steps": steps}) + "\n")


def test_train_writes_a_self_describing_probe_and_eval_scores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_file, other = tmp_path / "train.jsonl", tmp_path / "other.jsonl"
    write_traces(train_file, 60, seed=1)
    write_traces(other, 30, seed=2)
    out = tmp_path / "probe.json"
    assert faithproxy(["probe", "train", "--traces", str(train_file), "--labels", "judge", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "imbalance: class weights" in printed and "held-out" in printed and "i<=2" in printed and "i>2" in printed

    probe = Probe.load(out)
    assert probe.model == "tiny-vlm" and probe.layers == [1, 2] and probe.hidden_size == 6
    assert len(probe.training["data_sha256"]) == 64 and probe.training["labels"] == "judge"
    assert probe.training["n_val"] > 0 and probe.training["chains_val"] == 15  # 25% of 60 chains
    assert probe.validation["f1"] > 0.8 and probe.validation["auroc"] > 0.95
    assert set(probe.validation["by_position"]) == {"i<=2", "i>2"}

    assert faithproxy(["probe", "eval", "--probe", str(out), "--traces", str(other), "--labels", "file", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["f1"] > 0.8 and result["auroc"] > 0.95 and result["n"] == 30 * 4


def test_layers_can_be_chosen_and_eval_refuses_other_model(tmp_path: Path) -> None:
    traces = tmp_path / "t.jsonl"
    write_traces(traces, 40, seed=3)
    out = tmp_path / "p.json"
    probe_cli.main(["train", "--traces", str(traces), "--labels", "file", "--out", str(out), "--layers", "2"])
    assert Probe.load(out).layers == [2] and Probe.load(out).input_size == 6
    other = tmp_path / "o.jsonl"
    write_traces(other, 5, seed=4, model="other-vlm")
    with pytest.raises(SystemExit, match="probe is for model 'tiny-vlm'"):
        probe_cli.main(["eval", "--probe", str(out), "--traces", str(other), "--labels", "file"])


def test_metrics() -> None:
    y = np.array([1, 0, 1, 0, 0])
    assert probe_cli.auroc(y, np.array([0.9, 0.1, 0.8, 0.2, 0.3])) == 1.0
    assert probe_cli.auroc(y, np.array([0.5] * 5)) == 0.5
    m = probe_cli.binary_metrics(y, np.array([1, 1, 0, 0, 0]))
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 0.5, 0.5)


def test_collect_takes_validation_scenes_and_refuses_the_benchmarks(tmp_path: Path) -> None:
    """Probe training data comes from the validation seed; the held-out seed only as an evaluation set
    (which probe train then refuses), the generator's training seeds never. Refused before vLLM starts."""
    from faithproxy.benchmarks.probes import probe_bench

    assert probe_bench.check_seed(997, for_evaluation=False) == "validation"
    assert probe_bench.check_seed(999, for_evaluation=True) == "heldout"
    assert probe_bench.build_parser().parse_args(["collect", "--model-dir", "m", "--data", "shapesworld",
                                                  "--out", "o"]).seed == 997  # fmt: skip
    out = str(tmp_path / "f.jsonl")
    with pytest.raises(SystemExit, match="seed 999 is the held-out seed the benchmark scores on"):
        probe_bench.main(["collect", "--model-dir", "nowhere", "--data", "shapesworld", "--seed", "999", "--out", out])
    with pytest.raises(SystemExit, match="draws the generator's training scenes"):
        probe_bench.main(["collect", "--model-dir", "nowhere", "--data", "shapesworld", "--seed", "1000",
                          "--for-evaluation", "--out", out])  # fmt: skip

    traces = tmp_path / "t.jsonl"
    write_traces(traces, 10, seed=5)
    lines = [json.loads(line) | {"seed": 999, "split": "heldout"} for line in traces.read_text().splitlines()]
    traces.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(SystemExit, match=r"evaluation chains \(split heldout\)"):
        probe_cli.main(["train", "--traces", str(traces), "--labels", "file", "--out", str(tmp_path / "p.json")])


def test_train_with_another_recipe_reads_its_features(tmp_path: Path) -> None:
    """`--recipe mean_last_K` takes `features_by_recipe` (probe_bench collect --recipes); the probe file
    records the recipe, and a trace without those features is refused with the collect flag to use."""
    traces = tmp_path / "t.jsonl"
    write_traces(traces, 40, seed=6)
    lines = [json.loads(line) for line in traces.read_text().splitlines()]
    for line in lines:
        for step in line["steps"]:
            if "features" in step:  # the signal only in the mean_last_4 vectors
                step["features_by_recipe"] = {"mean_last_4": step["features"]}
                step["features"] = Features(np.zeros((2, 6), dtype=np.float32), [1, 2]).to_json()
    traces.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "p.json"
    probe_cli.main(["train", "--traces", str(traces), "--labels", "file", "--out", str(out), "--recipe", "mean_last_4"])
    probe = Probe.load(out)
    assert probe.recipe["name"] == "mean_last" and probe.recipe["tokens"] == 4 and probe.validation["f1"] > 0.8
    with pytest.raises(SystemExit, match="collect with --recipes mean_last_8"):
        probe_cli.main(["train", "--traces", str(traces), "--labels", "file", "--out", str(out),
                        "--recipe", "mean_last_8"])  # fmt: skip
