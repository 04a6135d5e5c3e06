"""The host-side summary of bench/call_series.py, without a GPU: the
per-window medians, side_by_side's 30-call median and the steady state
(the last half) of one call series. The timing itself is checked by
running the script on the GPU machine."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import call_series  # noqa: E402


def test_summary_separates_the_burst_from_the_steady_state():
    # 20 fast calls, then 130 slow ones: the shape of the T16k forward's series.
    series = [700.0] * 20 + [620.0] * 130
    r = call_series.summary("ours", "fwd", series)
    assert r["calls"] == 150
    assert r["windows"][:2] == [700.0, 700.0]
    assert r["windows"][2:] == [620.0] * 13
    # 20 of the first 30 calls are fast: the bench's median lands on the burst.
    assert r["first30_median"] == 700.0
    assert r["steady_median"] == 620.0


def test_summary_short_series_has_a_partial_last_window():
    r = call_series.summary("ours", "bwd", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    assert r["windows"] == [5.5, 11.0]
    assert r["first30_median"] == 6.0
    assert r["steady_median"] == 8.5
