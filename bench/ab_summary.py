"""The summary of an A/B of build variants (scripts/h200-ab), on the host.

scripts/h200-ab times each variant with gqattn_bench into one JSON-lines
file per variant; this merges them into one file (each record gains a
"variant" field) and prints two tables:
  - per variant, per shape: "fwd/bwd" TFLOP/s, as timed;
  - per group of variants, per shape and pass: the mean TFLOP/s of the
    group's runs, their range, the change of the mean against the first
    group, and whether the ranges of the two groups overlap.
A group is the variants whose labels differ only in trailing digits (on,
on2, on3 | off, off2), i.e. repeated builds or runs of one setting. Why:
one H200 run of a build moves by several percent (docs/performance.md,
"Method": up to 13%; 2026-12-03, one build read 605 and 636 TFLOP/s).
Where the ranges overlap the difference is within the spread; "apart" is
needed for a reading but is not enough: three runs against two alternating
ones read 6.8% apart on a kernel that had not changed, and a second call
did not repeat it (2026-12-03, H200). Alternate the settings' runs, and
repeat a call before believing a few percent.
Checked by bench/tests/test_ab_summary.py (synthetic records).

usage: python bench/ab_summary.py --logs DIR --out AB.jsonl LABEL...   (merge, then print)
       python bench/ab_summary.py AB.jsonl                             (print a merged file)
"""
import argparse
import json
import os
import re
import statistics

PASSES = ("fwd", "bwd")


def shape_label(r):
    return "B{B} T{Tq}/{Tk} H{H}/{Hkv} d{d} c{causal} w{window} cap{softcap:g}".format(**r)


def group_of(label):
    """The setting a variant label stands for: the label without trailing digits."""
    return re.sub(r"\d+$", "", label) or label


def merge(logs_dir, labels, out_path):
    """ab-LABEL.jsonl of every label in logs_dir -> one file, each record with
    its variant; returns the records. A variant with no file (its build
    failed) or a line that is not JSON (a crash's output) is left out."""
    records = []
    for label in labels:
        path = os.path.join(logs_dir, f"ab-{label}.jsonl")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                records.append(dict(r, variant=label))
    with open(out_path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return records


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def variants_in_order(records):
    return list(dict.fromkeys(r["variant"] for r in records))


def shapes_in_order(records):
    return list(dict.fromkeys(shape_label(r) for r in records))


def variant_table(records):
    """Lines: one row per shape, one "fwd/bwd" cell per variant."""
    labels = variants_in_order(records)
    cells = {}
    for r in records:
        cell = "error" if "error" in r else "{}/{}".format(r.get("fwd_tflops", "-"),
                                                          r.get("bwd_tflops", "-"))
        cells[(shape_label(r), r["variant"])] = cell
    width = max([len(s) for s in shapes_in_order(records)] + [len("TFLOP/s fwd/bwd")])
    lines = ["TFLOP/s fwd/bwd".ljust(width) + " " + " ".join(f"{l:>13s}" for l in labels)]
    for shape in shapes_in_order(records):
        lines.append(shape.ljust(width) + " " +
                     " ".join(f"{cells.get((shape, l), '-'):>13s}" for l in labels))
    return lines


def group_readings(records):
    """[(shape, pass, [(group, mean, low, high, runs)])] for every shape and
    pass that some record timed, groups in order of first appearance."""
    groups = list(dict.fromkeys(group_of(v) for v in variants_in_order(records)))
    out = []
    for shape in shapes_in_order(records):
        for pass_ in PASSES:
            row = []
            for g in groups:
                values = [r[f"{pass_}_tflops"] for r in records
                          if shape_label(r) == shape and group_of(r["variant"]) == g and
                          r.get(f"{pass_}_tflops")]
                if values:
                    row.append((g, statistics.mean(values), min(values), max(values),
                                len(values)))
            if row:
                out.append((shape, pass_, row))
    return out


def overlap(a, b):
    """Whether two (low, high) ranges share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def group_table(records):
    """Lines: per shape and pass, each group's mean [low-high] x runs, and
    against the first group the change of the mean and "overlap" or
    "apart" (the ranges')."""
    lines = []
    for shape, pass_, row in group_readings(records):
        base = row[0]
        parts = []
        for g, mean, low, high, runs in row:
            text = f"{g} {mean:.1f} [{low:.1f}-{high:.1f}] x{runs}"
            if g != base[0]:
                change = 100.0 * (mean / base[1] - 1.0)
                verdict = "overlap" if overlap((low, high), (base[2], base[3])) else "apart"
                text += f" {change:+.1f}% {verdict}"
            parts.append(text)
        lines.append(f"{shape} {pass_}: " + " | ".join(parts))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+",
                    help="a merged AB.jsonl, or with --logs the variant labels in order")
    ap.add_argument("--logs", help="folder of ab-LABEL.jsonl (scripts/h200-ab's)")
    ap.add_argument("--out", help="the merged file to write (with --logs)")
    args = ap.parse_args(argv)
    if args.logs:
        if not args.out:
            ap.error("--logs needs --out")
        records = merge(args.logs, args.inputs, args.out)
    else:
        if len(args.inputs) != 1:
            ap.error("give one merged AB.jsonl (or --logs DIR --out FILE LABEL...)")
        records = load(args.inputs[0])
    if not records:
        print("no records")
        return
    print("\n".join(variant_table(records)))
    print("groups (variants differing in trailing digits), mean [range] x runs, "
          "change against the first:")
    print("\n".join(group_table(records)))


if __name__ == "__main__":
    main()
