"""bench/plot.py on a small synthetic side_by_side.json (2 rounds, 3
shapes, 3 backends): the shape labels, the medians and their spread over
the rounds, the ratios over the strongest other backend, and, where
matplotlib is installed, the picture main() writes (a PNG, x labels that do
not overlap)."""
import copy
import itertools
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import plot  # noqa: E402

# (B, T, H, Hkv, d, causal, window, softcap)
SHAPES = [(4, 4096, 32, 8, 128, True, 0, 0.0),
          (1, 16384, 32, 8, 128, True, 0, 0.0),
          (4, 4096, 32, 8, 128, True, 1024, 0.0)]
BACKENDS = ["gqattn:cuda-hopper", "sdpa-cudnn", "flex"]
# TFLOP/s per (shape index, backend): (fwd round 0, fwd round 1), (bwd ...)
TFLOPS = {
    (0, "gqattn:cuda-hopper"): ((600.0, 620.0), (550.0, 560.0)),
    (0, "sdpa-cudnn"): ((610.0, 630.0), (480.0, 500.0)),
    (0, "flex"): ((380.0, 370.0), (320.0, 330.0)),
    (1, "gqattn:cuda-hopper"): ((690.0, 700.0), (600.0, 590.0)),
    (1, "sdpa-cudnn"): ((660.0, 680.0), (560.0, 550.0)),
    (1, "flex"): ((420.0, 430.0), (390.0, 400.0)),
    (2, "gqattn:cuda-hopper"): ((500.0, 490.0), (400.0, 410.0)),
    (2, "flex"): ((310.0, 300.0), (250.0, 240.0)),  # SDPA has no window
}


def shape_key(cfg):  # as side_by_side.shape_key writes it
    B, T, H, Hkv, d, causal, window, softcap = cfg
    return f"B{B} T{T} H{H}/{Hkv} d{d} c{int(causal)} w{window} cap{softcap:g}"


def record(cfg, backend, fwd, bwd, rnd):
    B, T, H, Hkv, d, causal, window, softcap = cfg
    rec = dict(backend=backend, shape=shape_key(cfg), round=rnd, fwd_tflops=fwd, bwd_tflops=bwd,
               B=B, H=H, Hkv=Hkv, d=d, causal=causal, window=window, softcap=softcap)
    if backend.startswith("gqattn:"):  # gqattn_bench writes Tq and Tk, causal as 0/1
        rec.update(Tq=T, Tk=T, causal=int(causal))
    else:
        rec["T"] = T
    return rec


def synthetic(rounds=2):
    results = [record(SHAPES[s], b, fwd[r], bwd[r], r)
               for r in range(rounds) for (s, b), (fwd, bwd) in TFLOPS.items()]
    return dict(results=results, medians=[], table=[])


def test_labels_short_unique_and_named_by_what_differs():
    p = plot.prepare(synthetic())
    assert p["shapes"] == [shape_key(c) for c in SHAPES]
    assert p["labels"] == ["T4k d128 causal", "B1 T16k", "w1024"]
    assert len(set(p["labels"])) == len(p["labels"])
    assert all(len(label) <= 20 for label in p["labels"])
    assert p["common"] == "B4 T4k H32/8 d128 causal"
    assert p["backends"] == BACKENDS


def test_labels_from_shape_keys_alone():
    # "medians" records carry no fields: the labels come from the keys.
    keys = [shape_key(c) for c in SHAPES]
    fields = [plot.shape_fields(k) for k in keys]
    assert plot.shape_labels(keys, fields) == ["T4k d128 causal", "B1 T16k", "w1024"]
    assert plot.shape_fields("not a shape key") is None
    assert plot.shape_labels(["odd"], [None]) == ["odd"]


def test_labels_of_the_standard_shapes():
    cfgs = [(16, 1024, 32, 8, 128, True, 0, 0.0), (4, 4096, 32, 8, 128, True, 0, 0.0),
            (1, 16384, 32, 8, 128, True, 0, 0.0), (4, 4096, 32, 8, 128, False, 0, 0.0),
            (4, 4096, 32, 8, 64, True, 0, 0.0), (4, 4096, 16, 8, 256, True, 0, 0.0),
            (2, 8192, 16, 8, 256, True, 4096, 50.0), (4, 4096, 32, 8, 128, True, 1024, 0.0),
            (4, 4096, 32, 8, 128, True, 0, 30.0), (4, 4096, 32, 1, 128, True, 0, 0.0)]
    keys = [shape_key(c) for c in cfgs]
    labels = plot.shape_labels(keys, [plot.shape_fields(k) for k in keys])
    assert labels == ["B16 T1k", "T4k d128 causal", "B1 T16k", "noncausal", "d64", "H16/8 d256",
                      "B2 T8k H16/8 d256 w4096 cap50", "w1024", "cap30", "H32/1"]
    assert len(set(labels)) == len(labels)
    # wrapped onto short lines
    assert all(len(line) <= plot.LABEL_LINE
               for label in labels for line in plot.wrap_label(label).splitlines())


def test_medians_and_spreads_over_rounds():
    p = plot.prepare(synthetic())
    assert p["rounds"] == 2
    stats = p["stats"]
    assert len(stats) == 2 * len(TFLOPS)
    for (s, b), (fwd, bwd) in TFLOPS.items():
        for metric, values in (("fwd_tflops", fwd), ("bwd_tflops", bwd)):
            st = stats[(shape_key(SHAPES[s]), b, metric)]
            assert st.median == pytest.approx(sum(values) / 2)
            assert (st.lo, st.hi) == (min(values), max(values))
    # no SDPA on the window shape: no bar, no record
    assert (shape_key(SHAPES[2]), "sdpa-cudnn", "fwd_tflops") not in stats


def test_ratios_over_the_strongest_other():
    p = plot.prepare(synthetic())
    k = [shape_key(c) for c in SHAPES]
    fwd, bwd = p["ratios"]["fwd_tflops"], p["ratios"]["bwd_tflops"]
    assert set(fwd) == {(key, "gqattn:cuda-hopper") for key in k}  # ours only
    assert fwd[(k[0], "gqattn:cuda-hopper")] == pytest.approx(610 / 620)   # vs cuDNN
    assert bwd[(k[1], "gqattn:cuda-hopper")] == pytest.approx(595 / 555)
    assert fwd[(k[2], "gqattn:cuda-hopper")] == pytest.approx(495 / 305)   # vs flex
    assert plot.is_ours("gqattn:cuda-flash:nondet") and plot.is_ours("cuda-flash")
    assert not plot.is_ours("sdpa-flash")


def test_one_round_gives_no_spread():
    data = synthetic(rounds=1)
    p = plot.prepare(data)
    assert p["rounds"] == 1
    for (s, b), (fwd, _) in TFLOPS.items():
        st = p["stats"][(shape_key(SHAPES[s]), b, "fwd_tflops")]
        assert st.median == fwd[0] and st.lo is None and st.hi is None
    # a JSON written before rounds existed: no "round" in its records
    for rec in data["results"]:
        del rec["round"]
    assert plot.rounds_of(data) == 1
    assert all(st.lo is None for st in plot.prepare(data)["stats"].values())


def test_error_records_are_skipped():
    data = synthetic()
    data["results"].append(dict(backend="flex", shape=shape_key(SHAPES[0]), round=1,
                                error="RuntimeError: out of memory"))
    assert plot.prepare(data)["stats"] == plot.prepare(synthetic())["stats"]


def test_figure_grows_with_the_shapes():
    short = plot.figure_width(["a"] * 3, 3)
    assert plot.figure_width(["a"] * 12, 3) > short
    assert plot.figure_width(["a"] * 12, 6) > plot.figure_width(["a"] * 12, 3)


def tick_boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in fig.axes[-1].get_xticklabels()
            if t.get_text()]


def test_main_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "side_by_side.json"
    src.write_text(json.dumps(synthetic()))
    out = tmp_path / "side_by_side.png"
    plot.main([str(src), str(out), "--title", "synthetic"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_x_labels_do_not_overlap():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    # twelve more shapes that each differ in many fields: long labels
    data = synthetic()
    cfgs = [(b, t, h, 8, d, True, w, 0.0) for b, t, h, d, w in
            itertools.product((1, 2), (8192, 32768), (16,), (64, 256), (0,))][:8]
    cfgs += [(2, 32768, 16, 8, 256, False, 4096, 50.0), (3, 12288, 24, 4, 96, True, 777, 12.5),
             (5, 2048, 8, 2, 192, False, 2048, 30.0), (7, 3000, 32, 8, 128, True, 0, 0.0)]
    for i, cfg in enumerate(cfgs):
        for b in BACKENDS:
            for r in range(2):
                data["results"].append(record(cfg, b, 100.0 + i + r, 90.0 + i, r))
    for d in (synthetic(), data):
        fig = plot.draw(copy.deepcopy(d))
        boxes = tick_boxes(fig)
        assert len(boxes) == len(plot.prepare(d)["shapes"])
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b)
        plt.close(fig)
