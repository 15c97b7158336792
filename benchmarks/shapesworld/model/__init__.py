"""The ShapesWorld model: a tiny Qwen2.5-VL trained from scratch on CPU to write ShapesWorld chains.

The same weights serve three roles, each taught with the prompt the proxy sends at inference:
generator (image + question -> `<think>` chain and letter), regenerator (regeneration prompt ->
`[corrected sentence]`) and self-checker (self-check prompt -> FAITHFUL / UNFAITHFUL). Its perception
errors are its own: it is trained on reference chains only and errs because it is small.

Modules (each imports only those above it):
    corpus    chat messages for each task, the seeded training streams, the tokenizer
    config    model sizes (full and smoke) and the Qwen2.5-VL config built from them
    probe     a training-only read-out of each grid cell from the image tokens (keeps the vision
              tower from collapsing to a constant; never saved with the model)
    scoring   the held-out set, and scoring a reply against ground truth
    greedy    greedy generation in transformers (batched, and one request at a time)
    train     `python -m faithproxy.benchmarks.shapesworld.model.train`: train, checkpoint, evaluate, pick the
              final model
    evaluate  `python -m faithproxy.benchmarks.shapesworld.model.evaluate`: held-out evaluation through real
              vLLM, and parity

The committed weights live in `benchmarks/shapesworld/model/weights/` (see `WEIGHTS_DIR`).
"""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
