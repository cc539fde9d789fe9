"""gpu_e2e/duel_stats.py: an engine's own spread over the rounds, and whether a pair's median
is shown above a bar from its rounds alone."""

from __future__ import annotations

import pytest

from gpu_e2e import duel_stats


def _call(r, engine, elapsed, tokens=100):
    return {"round": r, "batch_size": 64, "engine": engine, "elapsed_s": elapsed, "completion_tokens": tokens}


def test_each_engines_spread_is_its_own_rate_over_the_rounds():
    calls = [_call(1, "pristine", 2.0), _call(2, "pristine", 1.0), _call(1, "patched", 1.0)]
    calls += [_call(2, "patched", 1.0) | {"repeat": 1}, _call(2, "patched", 3.0) | {"repeat": 2}]  # median 2.0
    assert duel_stats.spread({"calls": calls}) == [
        {"engine": "patched", "batch_size": 64, "rounds": 2, "min": 50.0, "max": 100.0, "max_over_min": 2.0},
        {"engine": "pristine", "batch_size": 64, "rounds": 2, "min": 50.0, "max": 100.0, "max_over_min": 2.0},
    ]


@pytest.mark.parametrize(
    ("n", "k"),
    # the order statistics of the 95% interval (k, n - k + 1), from the binomial table
    [(5, None), (6, 1), (8, 1), (9, 2), (12, 3), (20, 6), (100, 40)],
)
def test_the_median_interval_is_the_binomial_order_statistics(n, k):
    ratios = [1 + i / 1000 for i in range(n)]
    got = duel_stats.median_interval(list(reversed(ratios)))
    assert got == (None if k is None else (ratios[k - 1], ratios[n - k]))


def test_a_cell_is_above_below_or_open():
    assert duel_stats.verdict([0.99, 1.0, 1.01, 1.02, 1.03, 1.04]) == "above"
    assert duel_stats.verdict([0.90, 0.91, 0.92, 0.93, 0.94, 0.975]) == "below"
    assert duel_stats.verdict([0.90, 0.95, 1.0, 1.05, 1.1, 1.2]) == "open"
    # the ninth run's FA3 8B eager bs 128, 4 rounds: too few to tell either way
    assert duel_stats.verdict([0.8833, 0.8922, 0.9728, 1.1767]) == "open"
    # 3 rounds can never be "above", however far above
    assert duel_stats.verdict([1.5, 1.6, 1.7]) == "open"


def test_each_engines_calls_and_how_two_engines_calls_move_together():
    """calls_of: the fastest, median and slowest round an engine (a burst counts as its median);
    together: the correlation of two engines' times over the rounds both ran, None below 3."""
    calls = [_call(r, "pristine", t) for r, t in ((1, 2.0), (2, 1.0), (3, 3.0))]
    calls += [_call(r, "patched", t) for r, t in ((1, 4.0), (2, 2.0), (3, 6.0))]
    calls += [_call(r, "upstream", t) for r, t in ((1, 1.0), (2, 2.0), (3, 1.0))]
    assert duel_stats.calls_of({"calls": calls})[1] == {
        "engine": "pristine",
        "batch_size": 64,
        "rounds": 3,
        "fastest_s": 1.0,
        "median_s": 2.0,
        "slowest_s": 3.0,
    }
    assert duel_stats.together({"calls": calls}, "pristine", "patched", 64) == 1.0  # the machine's slow rounds
    assert duel_stats.together({"calls": calls}, "pristine", "upstream", 64) == -0.866
    assert duel_stats.together({"calls": calls[:2] + calls[3:5]}, "pristine", "patched", 64) is None
