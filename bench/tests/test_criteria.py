"""bench/criteria.py without a GPU: the criteria's ratios read off a synthetic
side-by-side run (per round, both sides from the same round) and off
synthetic anchors (a backend's own family's file wins over another file's
records of it), the three verdicts, and several runs pooled."""
import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import criteria  # noqa: E402

OURS = "gqattn:cuda-hopper"


def record(backend, shape, rnd, fwd, bwd):
    return {"backend": backend, "shape": shape, "round": rnd, "fwd_tflops": fwd,
            "bwd_tflops": bwd}


def t4k_run():
    """A run of one round on the T4k shape: ours 1.10x cuDNN forward."""
    return {"results": [record(OURS, criteria.T4K, 0, 660.0, 1.0),
                        record("sdpa-cudnn", criteria.T4K, 0, 600.0, 1.0)]}


def anchor(backend, B, T, H, Hkv, hd, causal, window, softcap, fwd, bwd):
    return {"backend": backend, "B": B, "T": T, "H": H, "Hkv": Hkv, "hd": hd, "causal": causal,
            "window": window, "softcap": softcap, "fwd_tflops": fwd, "bwd_tflops": bwd}


def reading(readings, pass_, shape):
    return next(r for r in readings if r.criterion.pass_ == pass_ and r.criterion.shape == shape)


@pytest.fixture
def anchors_dir(tmp_path):
    sdpa = [{"ceiling_gemm_tflops": 698.0},
            anchor("sdpa-cudnn", 4, 4096, 32, 8, 128, True, 0, 0, 500.0, 400.0),
            # A broken Flex run kept in the SDPA file: must not win.
            anchor("flex", 4, 4096, 32, 8, 128, True, 1024, 0, 4.0, 8.0)]
    flex = [anchor("flex", 4, 4096, 32, 8, 128, True, 1024, 0, 200.0, 100.0)]
    (tmp_path / "anchors-sdpa-2026-11-30.json").write_text(json.dumps(sdpa))
    (tmp_path / "anchors-flex-2026-11-30.json").write_text(json.dumps(flex))
    return str(tmp_path)


def test_anchor_labels_match_the_runs_labels():
    entry = anchor("flex", 2, 8192, 16, 8, 256, True, 4096, 50.0, 1.0, 1.0)
    assert criteria.anchor_key(entry) == criteria.D256_WINDOW_SOFTCAP


def test_a_backends_own_file_wins(anchors_dir):
    anchors = criteria.load_anchors(anchors_dir)
    assert anchors[("flex", criteria.WINDOW)] == {"fwd": 200.0, "bwd": 100.0}
    assert anchors[("sdpa-cudnn", criteria.T4K)] == {"fwd": 500.0, "bwd": 400.0}


def test_no_anchors_reads_the_run_only(tmp_path):
    assert criteria.load_anchors(str(tmp_path)) == {}


def test_ratios_per_round_and_against_the_anchor(anchors_dir):
    results = [
        # Round 0: 660 / 600 = 1.10; round 1: 630 / 500 = 1.26.
        record(OURS, criteria.T4K, 0, 660.0, 480.0),
        record("sdpa-cudnn", criteria.T4K, 0, 600.0, 400.0),
        record(OURS, criteria.T4K, 1, 630.0, 420.0),
        record("sdpa-cudnn", criteria.T4K, 1, 500.0, 400.0),
        # Other gqattn entries of the run are not the criteria's backend.
        record("gqattn:cuda-hopper:nondet", criteria.T4K, 0, 9999.0, 9999.0),
        record("gqattn:cuda-flash", criteria.T4K, 0, 9999.0, 9999.0),
    ]
    ours, readings = criteria.read_run({"results": results}, criteria.load_anchors(anchors_dir))
    assert ours == OURS
    fwd = reading(readings, "fwd", criteria.T4K)
    assert fwd.rounds == 2
    assert fwd.run_median == pytest.approx((1.10 + 1.26) / 2)
    assert fwd.run_lowest == pytest.approx(1.10)
    # Our median over the rounds, 645, over the anchor's 500.
    assert fwd.anchor_ratio == pytest.approx(645.0 / 500.0)
    bwd = reading(readings, "bwd", criteria.T4K)
    assert bwd.run_lowest == pytest.approx(1.05)  # 420 / 400: under 1.10
    assert bwd.anchor_ratio == pytest.approx(450.0 / 400.0)


def test_a_shape_without_a_competitor_has_no_ratio(anchors_dir):
    results = [record(OURS, criteria.T16K, 0, 600.0, 500.0)]
    _, readings = criteria.read_run({"results": results}, criteria.load_anchors(anchors_dir))
    r = reading(readings, "fwd", criteria.T16K)
    assert r.run_median is None and r.run_lowest is None and r.rounds == 0
    assert r.anchor_ratio is None  # the synthetic anchors have no T16k


def test_verdicts_and_table(anchors_dir):
    results = [
        record(OURS, criteria.WINDOW, 0, 520.0, 310.0),
        record("flex", criteria.WINDOW, 0, 200.0, 100.0),
    ]
    _, readings = criteria.read_run({"results": results}, criteria.load_anchors(anchors_dir))
    fwd = reading(readings, "fwd", criteria.WINDOW)
    assert fwd.run_median == pytest.approx(2.6)
    assert criteria.met(fwd.run_median, 2.5) == "yes"
    assert criteria.met(2.499, 2.5) == "NO"
    assert criteria.met(None, 2.5) == "-"
    out = io.StringIO()
    criteria.print_table(readings, markdown=True, out=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 + len(criteria.CRITERIA)
    window_fwd = next(line for line in lines if criteria.WINDOW in line and "| fwd |" in line)
    assert "| 2.600 | 2.600 | 1 of 1 | yes | yes | 2.600 (200) | yes |" in window_fwd


def test_runs_pooled_keep_each_rounds_sides_together(anchors_dir):
    # Run A: round 0 660 / 600 = 1.10, round 1 600 / 600 = 1.00; run B:
    # round 0 700 / 560 = 1.25. Pooled: three rounds, two of them met;
    # pairing run A's round 0 with run B's cuDNN (560) would read 1.18.
    run_a = {"results": [record(OURS, criteria.T4K, 0, 660.0, 400.0),
                         record("sdpa-cudnn", criteria.T4K, 0, 600.0, 400.0),
                         record(OURS, criteria.T4K, 1, 600.0, 400.0),
                         record("sdpa-cudnn", criteria.T4K, 1, 600.0, 400.0)]}
    run_b = {"results": [record(OURS, criteria.T4K, 0, 700.0, 400.0),
                         record("sdpa-cudnn", criteria.T4K, 0, 560.0, 400.0)]}
    _, readings = criteria.read_run(criteria.pool_runs([run_a, run_b]),
                                    criteria.load_anchors(anchors_dir))
    fwd = reading(readings, "fwd", criteria.T4K)
    assert (fwd.rounds, fwd.rounds_met) == (3, 2)
    assert fwd.run_median == pytest.approx(1.10)
    assert fwd.run_lowest == pytest.approx(1.00)
    # Our median over all three rounds, 660, over the anchor's 500.
    assert fwd.anchor_ratio == pytest.approx(660.0 / 500.0)
    # The inputs are not changed.
    assert run_a["results"][0]["round"] == 0


def test_main_pools_the_runs_given(anchors_dir, tmp_path, capsys):
    paths = []
    for i, (mine, theirs) in enumerate(((660.0, 600.0), (500.0, 600.0))):
        run = {"results": [record(OURS, criteria.T4K, 0, mine, 1.0),
                           record("sdpa-cudnn", criteria.T4K, 0, theirs, 1.0)]}
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(run))
        paths.append(str(path))
    criteria.main(paths + ["--anchors", anchors_dir, "--markdown"])
    out = capsys.readouterr().out
    assert "(rounds pooled)" in out
    t4k_fwd = next(line for line in out.splitlines() if criteria.T4K in line and "| fwd |" in line)
    assert "| 1 of 2 |" in t4k_fwd


def test_a_run_without_cuda_hopper_is_refused():
    results = [record("gqattn:cuda-flash", criteria.WINDOW, 0, 1.0, 1.0),
               record("flex", criteria.WINDOW, 0, 1.0, 1.0)]
    with pytest.raises(SystemExit, match="gqattn:cuda-flash"):
        criteria.read_run({"results": results}, {})


def test_spread_shows_which_side_moved(tmp_path, capsys):
    # Ours steady (610, 616), cuDNN moving (520, 585): the verdict flips
    # with theirs. A round without cuDNN is left out of both sides.
    run = {"results": [record(OURS, criteria.T4K, 0, 610.0, 1.0),
                       record("sdpa-cudnn", criteria.T4K, 0, 520.0, 1.0),
                       record(OURS, criteria.T4K, 1, 616.0, 1.0),
                       record("sdpa-cudnn", criteria.T4K, 1, 585.0, 1.0),
                       record(OURS, criteria.T4K, 2, 900.0, 1.0)]}
    spread = next(sp for sp in criteria.read_spreads(run)
                  if sp.criterion.shape == criteria.T4K and sp.criterion.pass_ == "fwd")
    assert (spread.ours, spread.theirs) == ([610.0, 616.0], [520.0, 585.0])
    assert criteria.spread_text(spread.ours) == "613 [610-616] 1.0%"
    assert criteria.spread_text([]) == "-"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    criteria.main([str(path), "--spread", "--markdown"])
    out = capsys.readouterr().out
    t4k_fwd = next(line for line in out.splitlines() if criteria.T4K in line and "| fwd |" in line)
    assert "| 2 | 613 [610-616] 1.0% | 552 [520-585] 11.8% |" in t4k_fwd


def test_a_partial_run_is_named_as_such(anchors_dir, tmp_path, capsys):
    # side_by_side.py stopped early (partial, stopped_at): the table still
    # reads what it holds, under a note naming the run and where it stopped.
    run = dict(t4k_run(), partial=True, stopped_at={"round": 0, "shape": criteria.T16K})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(dict(run, partial=False, stopped_at=None, spin_ahead_us=2000)))
    criteria.main([str(path), "--anchors", anchors_dir])
    out = capsys.readouterr().out
    assert f"note: {path} is partial, stopped in round 1 at {criteria.T16K}" in out
    assert any(criteria.T4K in line and "1.100" in line for line in out.splitlines())
    criteria.main([str(whole), "--anchors", anchors_dir])
    assert "note:" not in capsys.readouterr().out


def test_the_gpu_of_each_run_is_named_where_recorded(anchors_dir, tmp_path, capsys):
    run = t4k_run()
    old = tmp_path / "old.json"
    old.write_text(json.dumps(run))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(dict(run, gpu={"uuid": "GPU-abc", "name": "NVIDIA H200"})))
    criteria.main([str(old), "--anchors", anchors_dir])
    assert "GPU per run" not in capsys.readouterr().out
    criteria.main([str(old), str(new), "--anchors", anchors_dir])
    assert f"GPU per run: {old}: not recorded, {new}: GPU-abc" in capsys.readouterr().out


def test_runs_of_different_protocols_are_flagged_when_pooled(anchors_dir, tmp_path, capsys):
    run = t4k_run()
    burst = tmp_path / "burst.json"
    burst.write_text(json.dumps(dict(run, settle_s=0.0, idle_ms=0)))
    old = tmp_path / "old.json"  # before the fields existed: a burst too
    old.write_text(json.dumps(run))
    paused = tmp_path / "paused.json"
    paused.write_text(json.dumps(dict(run, idle_ms=150)))
    spun = tmp_path / "spun.json"
    spun.write_text(json.dumps(dict(run, idle_ms=150, spin_ahead_us=2000)))
    criteria.main([str(burst), str(old), "--anchors", anchors_dir])
    out = capsys.readouterr().out
    assert "measured differently" not in out and "protocol:" not in out
    criteria.main([str(burst), str(paused), "--anchors", anchors_dir])
    out = capsys.readouterr().out
    assert ("note: the runs were measured differently, pooled all the same: "
            f"{burst}: sustained 0 s, settle 0 s, idle 0 ms a call, spin 0 us ahead, "
            f"{paused}: sustained 0 s, settle 0 s, idle 150 ms a call, spin 0 us ahead") in out
    criteria.main([str(paused), str(spun), "--anchors", anchors_dir])
    assert "idle 150 ms a call, spin 2000 us ahead" in capsys.readouterr().out
    criteria.main([str(paused), "--anchors", anchors_dir])
    assert ("protocol: sustained 0 s, settle 0 s, idle 150 ms a call, spin 0 us ahead"
            in capsys.readouterr().out)


def test_runs_timed_without_the_spin_are_named(anchors_dir, tmp_path, capsys):
    run = t4k_run()
    old = tmp_path / "old.json"
    old.write_text(json.dumps(run))
    spun = tmp_path / "spun.json"
    spun.write_text(json.dumps(dict(run, spin_ahead_us=2000)))
    criteria.main([str(old), str(spun), "--anchors", anchors_dir])
    notes = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("note: timed without a spin")]
    assert len(notes) == 1 and notes[0].endswith(f"upper bounds: {old}")
    criteria.main([str(spun), "--anchors", anchors_dir])
    assert "note: timed without a spin" not in capsys.readouterr().out
