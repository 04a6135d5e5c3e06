"""The host-side logic of bench/short_query.py, without a GPU: its FLOP
count (no mask: every query keeps every key) and that every shape is one
cuda-hopper packs (Tq short of a 128-row tile, a power-of-two group). The
timing is checked by running the script on the GPU machine."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import short_query as sq  # noqa: E402


def test_flops_count_every_pair():
    assert sq.flops((8, 1, 8192, 32, 8, 128)) == 4.0 * 128 * 32 * 8 * 8192
    assert sq.flops((2, 16, 100, 4, 1, 64)) == 4.0 * 64 * 4 * 2 * 16 * 100


def test_shapes_are_short_power_of_two_groups():
    for B, Tq, Tk, H, Hkv, d in sq.SHAPES:
        group = H // Hkv
        assert Tq < 128 and H % Hkv == 0 and group >= 2 and group & (group - 1) == 0
        assert sq.label((B, Tq, Tk, H, Hkv, d)) == f"B{B} Tq{Tq} Tk{Tk} H{H}/{Hkv} d{d}"


def test_the_spin_reaches_gqattn_bench(monkeypatch):
    import json
    import types
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout=json.dumps({"fwd_ms": 1.0}) + "\n")
    monkeypatch.setattr(sq.subprocess, "run", fake_run)
    shape = sq.SHAPES[0]
    assert sq.run_ours("bench", shape, 10, "cuda-hopper", 2000) == {"fwd_ms": 1.0}
    assert seen[-1][-2:] == ["--spin-ahead-us", "2000"]
    sq.run_ours("bench", shape, 10, "cuda-hopper", 0)
    assert "--spin-ahead-us" not in seen[-1]
