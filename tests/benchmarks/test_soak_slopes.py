"""The soak's verdicts (benchmarks/soak.py): a slope is only called growth when it is outside twice its
standard error, and the second half of the run is fitted on its own to show whether a figure levelled off."""

import random

from faithproxy.benchmarks import soak


def _rows(rss) -> list[dict]:
    return [{"t_min": float(t), "rss_mib": rss(t), "fds": 100, "tasks": 50, "lag_mean_ms": 1.0} for t in range(40)]


def test_a_steady_climb_is_growth_outside_its_error():
    noise = random.Random(0)
    fit = soak.slopes(_rows(lambda t: 150 + 0.25 * t + noise.gauss(0, 0.3)), warmup_min=5, end_min=39)["rss_mib"]
    assert abs(fit["slope_per_min"] - 0.25) < 0.03
    assert fit["slope_per_min"] > fit["two_se"] > 0


def test_a_figure_that_levels_off_is_flat_in_the_second_half():
    noise = random.Random(1)
    fit = soak.slopes(_rows(lambda t: 150 + min(t, 12) + noise.gauss(0, 0.3)), warmup_min=5, end_min=39)["rss_mib"]
    late = fit["second_half"]
    assert fit["slope_per_min"] > fit["two_se"]  # over the whole run it grew ...
    assert abs(late["slope_per_min"]) <= late["two_se"]  # ... and then stopped


def test_figures_a_sample_lacks_are_left_out_and_the_heap_is_read_where_glibc_has_it():
    fits = soak.slopes(_rows(lambda t: 150.0), warmup_min=5, end_min=39)
    assert "heap_in_use_mib" not in fits and fits["fds"]["slope_per_min"] == 0
    heap = soak._heap_mib()
    if heap:  # glibc ≥ 2.33
        assert heap["heap_in_use_mib"] > 0 and heap["heap_free_mib"] >= 0
