"""Everything that measures faithproxy rather than serves it, split by job:

- evaluation/   the offline evaluation users run (`faithproxy bench`): labelled chains, metrics, replay,
                the evaluation judge, dataset loaders, benchmark runs, reports, ShapesWorld end to end;
- performance/  speed and load benchmarks: proxy overhead, pipelining, hidden-state capture cost;
- standins/     the local judge that stands in for a real one (an oracle or the ShapesWorld pixels on
                both wire protocols), used by tests, the demo and the benchmarks (the fake upstream
                is faithproxy.testing);
- probes/       probe training and evaluation (`faithproxy probe`, the file the probe detector loads);
- shapesworld/  the synthetic world with a checkable ground truth, and its trained generator and judge;
- tinyvlm/      the tiny Qwen2.5-VL models built and trained on the CPU, and their vLLM starter.
`results/` holds data only: the JSON, Markdown and plots the scripts wrote.

This is the lab: nothing in the product (faithcore, clients, detectors, regenerators, server, flywheel)
imports it (tests/test_layers.py).
"""
