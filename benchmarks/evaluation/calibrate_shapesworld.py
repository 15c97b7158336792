"""The learned ShapesWorld judge's flag-threshold curve on validation-seed chains, end to end.

    python -m faithproxy.benchmarks.evaluation.calibrate_shapesworld \
        --chains benchmarks/results/shapesworld-validation-vanilla.jsonl --n 100 --workdir var/calibrate-sw \
        --png benchmarks/results/judge-learned-calibration-validation.png \
        --out benchmarks/results/judge-learned-calibration-validation.json

It writes the validation scenes' images (`--images` of `bench calibrate` finds them by file name), starts
the learned judge on real vLLM as `bench shapesworld` does (greedy, logprobs on: the judge backend asks
for them by default) and runs `faithproxy bench calibrate --judge learned` over the labelled chains,
three new steps per judge call (the live proxy sends a few at a time; the judge was trained on 1 to 6),
every threshold from 0 to 0.95, picking for `--target`/`--at-least`. The chains are labelled by ground
truth: `benchmarks/results/shapesworld-validation-vanilla.jsonl` holds vLLM's greedy chains for items
0..99 of the validation seed (997). Thresholds are chosen here, never on held-out scenes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from faithproxy.benchmarks.shapesworld.model.corpus import VALIDATION_SEED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faithproxy.benchmarks.evaluation.calibrate_shapesworld",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--chains", type=Path, required=True, help="labelled validation chains (JSONL)")
    parser.add_argument("--n", type=int, required=True, help="validation items the chains are of (0..n-1)")
    parser.add_argument("--workdir", type=Path, default=Path("var/calibrate-sw"), help="images and the judge's log")
    parser.add_argument("--target", choices=["precision", "recall", "f1"], default="precision")
    parser.add_argument("--at-least", default="0.45", help="what the pick must reach (issue 32: precision 0.45)")
    parser.add_argument("--batch", default="3", help="most new steps per judge call")
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from faithproxy.benchmarks.evaluation.shapesworld_bench import JUDGE_SERVED_NAME, JUDGE_WEIGHTS_DIR, start_judge
    from faithproxy.benchmarks.shapesworld.export import image_filename
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
    from faithproxy.benchmarks.shapesworld.scenes import png_bytes, render

    images = args.workdir / "images"
    images.mkdir(parents=True, exist_ok=True)
    for item in heldout_items(args.n, VALIDATION_SEED):
        (images / image_filename(item.scene)).write_bytes(png_bytes(render(item.scene)))
    with start_judge(JUDGE_WEIGHTS_DIR, args.workdir / "judge-vllm.log") as server:
        judges = [{"name": "learned", "backend": "openai", "model": JUDGE_SERVED_NAME,
                   "base_url": server.openai_base_url, "api_key": "EMPTY", "temperature": 0.0, "max_tokens": 256,
                   "timeout_s": 300, "max_retries": 0}]  # fmt: skip
        command = [sys.executable, "-m", "faithproxy.cli", "bench", "calibrate", "--judge", "learned",
                   "--chains", str(args.chains), "--judges", json.dumps(judges), "--images", str(images),
                   "--target", args.target, "--at-least", args.at_least, "--batch", args.batch,
                   "--thresholds", ",".join(f"{0.05 * k:.2f}" for k in range(20)), "--png", str(args.png),
                   "--out", str(args.out), "--no-progress"]  # fmt: skip
        return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
