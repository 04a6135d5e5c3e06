"""bench/ab_summary.py without a GPU: the merge of scripts/h200-ab's
per-variant files, the per-variant table, and the groups of repeated
variants with their means, ranges and the overlap verdict."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ab_summary  # noqa: E402

T4K = dict(B=4, Tq=4096, Tk=4096, H=32, Hkv=8, d=128, causal=1, window=0, softcap=0.0)
NON_CAUSAL = dict(T4K, causal=0)


def record(variant, shape, fwd, bwd=None):
    r = dict(shape, variant=variant, fwd_tflops=fwd)
    if bwd is not None:
        r["bwd_tflops"] = bwd
    return r


def test_group_of_drops_trailing_digits_only():
    assert ab_summary.group_of("on") == "on"
    assert ab_summary.group_of("on2") == "on"
    assert ab_summary.group_of("off13") == "off"
    assert ab_summary.group_of("d64v2x") == "d64v2x"
    assert ab_summary.group_of("7") == "7"  # all digits: keep the label


def test_merge_tags_variants_and_skips_what_is_not_json(tmp_path):
    (tmp_path / "ab-on.jsonl").write_text(json.dumps(dict(T4K, fwd_tflops=600.0)) + "\n"
                                          "Segmentation fault\n")
    (tmp_path / "ab-off.jsonl").write_text(json.dumps(dict(T4K, fwd_tflops=590.0)) + "\n")
    out = tmp_path / "ab.jsonl"
    records = ab_summary.merge(str(tmp_path), ["on", "off", "failed-build"], str(out))
    assert [(r["variant"], r["fwd_tflops"]) for r in records] == [("on", 600.0), ("off", 590.0)]
    assert ab_summary.load(str(out)) == records


def test_variant_table_has_a_cell_per_variant_and_shape():
    records = [record("on", T4K, 600.0, 500.0), record("off", T4K, 590.0),
               record("on", NON_CAUSAL, 630.0), dict(NON_CAUSAL, variant="off", error="x")]
    lines = ab_summary.variant_table(records)
    assert len(lines) == 3
    assert lines[0].split()[-2:] == ["on", "off"]
    assert lines[1].split()[-2:] == ["600.0/500.0", "590.0/-"]
    assert lines[2].split()[-2:] == ["630.0/-", "error"]


def test_groups_read_means_ranges_and_overlap():
    # A first reading of the unchanged wide kernel (2026-12-03, H200):
    # three "on" runs against two "off" runs, apart.
    records = [record("on", NON_CAUSAL, 587.2), record("off", NON_CAUSAL, 633.7),
               record("on2", NON_CAUSAL, 596.0), record("off2", NON_CAUSAL, 631.2),
               record("on3", NON_CAUSAL, 594.1),
               # A shape where the groups overlap.
               record("on", T4K, 609.8), record("off", T4K, 611.1),
               record("on2", T4K, 612.1), record("off2", T4K, 599.4)]
    readings = {(shape, p): row for shape, p, row in ab_summary.group_readings(records)}
    non_causal = readings[(ab_summary.shape_label(NON_CAUSAL), "fwd")]
    assert [g for g, *_ in non_causal] == ["on", "off"]
    on, off = non_causal
    assert on[1] == pytest.approx((587.2 + 596.0 + 594.1) / 3)
    assert (on[2], on[3], on[4]) == (587.2, 596.0, 3)
    assert (off[2], off[3], off[4]) == (631.2, 633.7, 2)
    assert not ab_summary.overlap(on[2:4], off[2:4])
    # No bwd was timed: no bwd row.
    assert (ab_summary.shape_label(NON_CAUSAL), "bwd") not in readings
    lines = ab_summary.group_table(records)
    nc = next(line for line in lines if line.startswith(ab_summary.shape_label(NON_CAUSAL)))
    assert "apart" in nc and "+6.8%" in nc  # 632.45 / 592.43
    t4k = next(line for line in lines if line.startswith(ab_summary.shape_label(T4K)))
    assert "overlap" in t4k


def test_main_merges_then_prints(tmp_path, capsys):
    (tmp_path / "ab-on.jsonl").write_text(json.dumps(dict(T4K, fwd_tflops=600.0)) + "\n")
    (tmp_path / "ab-off.jsonl").write_text(json.dumps(dict(T4K, fwd_tflops=500.0)) + "\n")
    out = tmp_path / "ab.jsonl"
    ab_summary.main(["--logs", str(tmp_path), "--out", str(out), "on", "off"])
    printed = capsys.readouterr().out
    assert "600.0/-" in printed and "-16.7% apart" in printed
    ab_summary.main([str(out)])
    assert "-16.7% apart" in capsys.readouterr().out
