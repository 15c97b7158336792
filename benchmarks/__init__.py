"""Everything that measures faithproxy rather than serves it, split by job:

- evaluation/   the offline evaluation users run (`faithproxy bench`): labelled chains, metrics, replay,
                the evaluation judge, dataset loaders, benchmark runs, reports, ShapesWorld end to end;
- performance/  speed and load benchmarks: proxy overhead, pipelining, hidden-state capture cost;
- standins/     local servers that stand in for real parts (an oracle judge on both wire protocols,
                a fast upstream, an in-loop uvicorn), used by tests, the demo and the benchmarks;
- probes/       probe training and evaluation (`faithproxy probe`, the file the probe detector loads).
`results/` holds data only: the JSON, Markdown and plots the scripts wrote.

Nothing in the product (faithcore, clients, detectors, regenerators, server) imports this package.
"""
