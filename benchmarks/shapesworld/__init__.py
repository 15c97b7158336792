"""ShapesWorld: synthetic images with exact ground truth, for training and testing faithfulness checks.

A scene is 1-4 flat-coloured shapes on a white 3x3 grid. Everything about it can be stated in a small
fixed "world language" (`language.py`), read back from the pixels alone (`parser.py`), and checked
sentence by sentence (`claims.py`), so chains about these images have exact faithfulness labels.

Module order (each imports only those above it):
    world      vocabulary, geometry of the grid, `WorldObject`, `Ref`
    scenes     seeded scene generator and renderer
    parser     pixels -> objects
    language   world-language sentences <-> claims
    claims     claim checking; per-sentence verdicts for a chain
    questions  multiple-choice question templates and their solvers
    perturb    controlled errors: wrong colour / shape / size / position / count
    chains     reference and hallucinated reasoning chains
    examples   regeneration and self-check training examples
    judge_reply, export, dataset
"""
