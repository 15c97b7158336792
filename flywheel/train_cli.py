"""`faithproxy train dpo|sft`: tune a model folder on exported pairs (flywheel/dpo.py), on the CPU.

    faithproxy train dpo --pairs pairs.jsonl --model MODEL_DIR --out var/tuned
    faithproxy train sft --pairs pairs.jsonl --model MODEL_DIR --out var/sft --steps 60   # the comparison

Prints progress every `--log-every` steps; writes checkpoints (`--checkpoint-every`) under
OUT/checkpoints/, the tuned model in OUT/model/ (a folder transformers and vLLM load) and
OUT/summary.json (settings, held-out pair metrics before and after, the loss curve). `--heldout`
names the held-out pairs `faithproxy export pairs --heldout` wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from faithproxy.flywheel.export_cli import heldout_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faithproxy train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="objective", required=True)
    for name, help_text in [("dpo", "DPO on the pairs"), ("sft", "supervised tuning on the chosen steps")]:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--pairs", type=Path, required=True, help="exported pairs (faithproxy export pairs)")
        p.add_argument("--heldout", type=Path, help="held-out pairs (default: the export's .heldout.jsonl, if any)")
        p.add_argument("--model", type=Path, required=True, help="the model folder to start from")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--beta", type=float, default=0.1)
        p.add_argument("--lr", type=float, default=2e-5)
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: --epochs passes)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--checkpoint-every", type=int, default=0)
        p.add_argument("--log-every", type=int, default=10)
        p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
        p.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from faithproxy.flywheel.data import load_rows
    from faithproxy.flywheel.dpo import TrainConfig, train

    torch.set_num_threads(args.threads)
    rows = load_rows(args.pairs)
    heldout_file = args.heldout or heldout_path(args.pairs)
    heldout = load_rows(heldout_file) if heldout_file.is_file() else []
    if not rows:
        print(f"faithproxy train: {args.pairs} holds no pairs", file=sys.stderr)
        return 1
    config = TrainConfig(
        objective=args.objective,
        beta=args.beta,
        lr=args.lr,
        batch_size=args.batch_size,
        epochs=args.epochs,
        steps=args.steps,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        log_every=args.log_every,
    )
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32).to(args.device)
    processor = AutoProcessor.from_pretrained(args.model)
    print(f"{args.objective}: {len(rows)} pairs ({len(heldout)} held out) from {args.pairs}, model {args.model}")
    summary = train(model, processor, rows, config, args.out, heldout=heldout)
    shown = {k: v for k, v in summary.items() if k not in ("history",)}
    print(json.dumps(shown | {"model_out": str(args.out / "model")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
