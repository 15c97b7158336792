"""Hidden-state probes: training, evaluation and the probe-vs-judge comparison (`faithproxy probe`)."""
