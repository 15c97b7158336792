"""The flywheel: what the proxy corrected, turned into training data for the model it corrected.

    faithproxy export pairs   trace files or reports in Redis -> TRL's vision DPO preference pairs
    faithproxy train dpo      a model folder + exported pairs -> a tuned model folder (train extra)

Modules: `records` (reading what the proxy recorded), `images` (the requests' images, never fetched),
`pairs` (the TRL rows and their filters), `export_cli`, `data` (pairs as model inputs), `dpo` (the loss
and the training loop) and `train_cli`. The loop measured on ShapesWorld is the lab's
(benchmarks/evaluation/flywheel_loop.py).
docs/flywheel.md is the user's page.
"""
