"""The fleet UPR's PromQL (tests/deploy/upr_queries.py): its Wilson interval evaluated by promtool on
counter values equals the formula's, which gives the textbook interval; the dashboard carries the same
queries."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.upr_queries import sampled_share, upr, wilson

REPO = Path(__file__).resolve().parents[2]
DOOR = "/v1/chat/completions"


def test_the_wilson_formula_gives_the_textbook_interval() -> None:
    # Wilson (1927) 95% intervals as tabulated (e.g. Newcombe 1998, Table I): 0/10 and 5/10
    low, high = wilson(0, 10)
    assert abs(low) < 1e-12 and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_promtool_evaluates_the_queries_as_the_formula(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is needed (Debian package prometheus)"
    # every series exists from the start, at zero (server/observe/metrics.py pre-initialises them)
    counts = {
        ("m", "unfaithful"): 12,
        ("m", "faithful"): 25,
        ("m", "unknown"): 3,
        ("n", "unfaithful"): 0,
        ("n", "faithful"): 7,
    }
    series = [
        {"series": f'faithproxy_perception_steps_total{{source="shadow",model="{model}",endpoint="{DOOR}",'
         f'verdict="{verdict}"}}', "values": f"{value}x3"}
        for (model, verdict), value in counts.items()
    ]  # fmt: skip
    inline = 'faithproxy_perception_steps_total{source="inline",model="m",endpoint="x",verdict="unfaithful"}'
    series.append({"series": inline, "values": "99x3"})  # not shadow: left out
    for outcome, value in (("not_sampled", 90), ("checked", 8), ("queue_full", 2)):
        series.append({"series": f'faithproxy_shadow_requests_total{{model="m",endpoint="{DOOR}",outcome="{outcome}"}}',
                       "values": f"{value}x3"})  # fmt: skip
    queries = upr("shadow", window=None)
    m, n = wilson(12, 40), wilson(0, 7)
    expected = {  # expression -> {labels: value}
        queries["upr"]: {'{model="m"}': 12 / 40, '{model="n"}': 0.0},
        queries["lower"]: {'{model="m"}': m[0], '{model="n"}': n[0]},
        queries["upper"]: {'{model="m"}': m[1], '{model="n"}': n[1]},
        sampled_share(window=None): {'{model="m"}': 0.1},
    }
    spec = {
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "2m",
                        "exp_samples": [{"labels": labels, "value": value} for labels, value in samples.items()],
                    }
                    for expr, samples in expected.items()
                ],
            }
        ]
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_shows_shadow_upr_with_its_interval_and_the_sampled_share() -> None:
    exprs = set()
    for path in (REPO / "deploy" / "grafana" / "dashboards").glob("*.json"):
        for panel in json.loads(path.read_text()).get("panels", []):
            exprs |= {target.get("expr") for target in panel.get("targets", [])}
    for by in ("model", "endpoint"):
        shadow = upr("shadow", by=by)
        assert {shadow["upr"], shadow["lower"], shadow["upper"]} <= exprs, by
        assert upr("inline", by="endpoint")["upr"] in exprs
        assert sampled_share(by=by) in exprs
