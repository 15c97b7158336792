"""Reading a Prometheus text exposition in tests (a proxy's /metrics)."""

from __future__ import annotations

import re


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample_labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(sample_labels.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
