"""The fleet's UPR in PromQL: the rate with its 95% Wilson interval, and the share of off traffic sampled.

Declared once here; the Grafana dashboard's panels carry these strings (tests/deploy/test_upr_queries.py
holds them equal, and checks the arithmetic with promtool against `wilson` below). The server never reads
them: they are the dashboard's (deploy/grafana/dashboards/faithproxy.json), declared beside the other
readers of the deploy assets (assets.py).

faithproxy_perception_steps_total{source, model, endpoint, verdict} counts each checked perception step
once, by the verdict its original text got: source="inline" for correct/detect requests, "shadow" for off
requests checked after the fact (server/shadow/checker.py). Over a window, x = unfaithful steps and n = all
perception steps (unchecked ones included, as in the detected UPR of server/observe/metrics.py):

    UPR = x / n
    Wilson 95%: (x + z²/2) / (n + z²)  ±  z · sqrt(x (n - x) / n + z²/4) / (n + z²),   z = 1.96

The interval treats steps as independent draws; steps of one chain are not quite, so read it as a lower
bound on the uncertainty. With few steps in the window it is wide, which is the point: a shadow share of
0.01 on a quiet model says little, and the panel shows it.

    sampled share = sampled off requests / off requests     (faithproxy_shadow_requests_total)
"""

from __future__ import annotations

import math

Z = 1.96
STEPS = "faithproxy_perception_steps_total"
SAMPLED = "faithproxy_shadow_requests_total"


def _count(by: str, selector: str, window: str | None) -> str:
    series = f"{STEPS}{{{selector}}}"
    inner = f"increase({series}[{window}])" if window else series
    return f"sum by ({by}) ({inner})"


def upr(source: str, by: str = "model", window: str | None = "1h") -> dict[str, str]:
    """PromQL for the UPR of `source` (inline | shadow) per `by` (model, endpoint) over `window`, and the
    bounds of its 95% Wilson interval: {"upr", "lower", "upper", "n"}. `window` None: the counters' values
    since start (what the arithmetic test uses)."""
    x = _count(by, f'source="{source}",verdict="unfaithful"', window)
    n = _count(by, f'source="{source}"', window)
    z2 = round(Z * Z, 4)
    # Written as x/n · n/(n+z²) + (z²/2)/(n+z²) ± z·sqrt(x(n-x)/n + z²/4)/(n+z²): PromQL's precedence needs
    # no outer parentheses, and each expression starts as a ratio of sums (tests/deploy/test_assets.py).
    center = f"{x} / {n} * {n} / ({n} + {z2}) + {z2 / 2} / ({n} + {z2})"
    half = f"{Z} * sqrt({x} * ({n} - {x}) / {n} + {z2 / 4}) / ({n} + {z2})"
    return {
        "upr": f"{x} / {n}",
        "lower": f"{center} - {half}",
        "upper": f"{center} + {half}",
        "n": n,
    }


def sampled_share(by: str = "model", window: str | None = "1h") -> str:
    """PromQL for the share of off requests drawn for a shadow check, per `by` (model, endpoint)."""
    if window is None:
        drawn, every = f'{SAMPLED}{{outcome!="not_sampled"}}', SAMPLED
    else:
        drawn, every = f'increase({SAMPLED}{{outcome!="not_sampled"}}[{window}])', f"increase({SAMPLED}[{window}])"
    return f"sum by ({by}) ({drawn}) / sum by ({by}) ({every})"


def wilson(x: float, n: float, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of x successes in n trials (the formula the PromQL computes)."""
    z2 = round(z * z, 4)
    center = (x + z2 / 2) / (n + z2)
    half = z * math.sqrt(x * (n - x) / n + z2 / 4) / (n + z2)
    return center - half, center + half
