"""cuda-hopper's speed criteria, read off one side-by-side run or several.

Reads the JSON that bench/side_by_side.py writes and prints, for every
speed line cuda-hopper is held to (CRITERIA below: forward lines in group 5,
backward lines in group 6), gqattn's ratio to the competitor the line names,
three ways:
  - in the run: the median over the run's rounds, the lowest round and in
    how many rounds the line is met (each round's ratio takes both sides
    from that round);
  - against the anchors: gqattn's median TFLOP/s over the competitor's number
    in ../shared/anchors (measured once, 2026-11-30, on an H200), which does
    not move with the competitor's run-to-run spread.
The H200 moves a backend's TFLOP/s by up to 13% between runs
(docs/performance.md), as much as the 1.10x lines, so a line met on one basis
may be missed on another; this prints all three rather than choosing.
Given several runs, their rounds are pooled (each round's ratio still takes
both sides from that round of that run): a line near its mark is then read
over more rounds than one call holds. Pool only runs of the same kernels, or
say which differ. Runs timed differently (side_by_side.py's --sustained,
--settle, --idle-ms, --spin-ahead-us, --back-to-back) read different levels;
pooled together they are flagged with each run's protocol, and a lone run not
timed in plain bursts says how it was. Runs timed without a spin ahead of each
call (side_by_side.py before 974fb9d, or --spin-ahead-us 0) are named: PyTorch's
host queueing is inside their competitors' times, so their in-run ratios are
upper bounds.

With --spread it prints instead, per line, both sides' TFLOP/s over the
rounds (median, range, range as a percentage of the median): when a
verdict differs between rounds, which side moved.
Checked by bench/tests/test_criteria.py (synthetic runs and anchors).

usage: python bench/criteria.py RUN.json [MORE.json ...] [--anchors DIR] [--ours LABEL]
                                [--markdown] [--spread]
(LABEL default gqattn:cuda-hopper, the backend the criteria are for)
"""
import argparse
import glob
import json
import os
import statistics
import sys
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import shape_key  # noqa: E402  (the run's shape labels)

# One speed line: gqattn / competitor >= line, on one shape, for the forward
# or the backward. The shapes are side_by_side.py's labels (shape_key).
Criterion = namedtuple("Criterion", "pass_ shape competitor line")
CUDNN, FLEX = "sdpa-cudnn", "flex"
T4K = "B4 T4096 H32/8 d128 c1 w0 cap0"
T16K = "B1 T16384 H32/8 d128 c1 w0 cap0"
NON_CAUSAL = "B4 T4096 H32/8 d128 c0 w0 cap0"
D64 = "B4 T4096 H32/8 d64 c1 w0 cap0"
D256 = "B4 T4096 H16/8 d256 c1 w0 cap0"
WINDOW = "B4 T4096 H32/8 d128 c1 w1024 cap0"
SOFTCAP = "B4 T4096 H32/8 d128 c1 w0 cap30"
D256_WINDOW_SOFTCAP = "B2 T8192 H16/8 d256 c1 w4096 cap50"
CRITERIA = [
    Criterion("fwd", T4K, CUDNN, 1.10),
    Criterion("fwd", T16K, CUDNN, 1.10),
    Criterion("fwd", D64, CUDNN, 1.0),
    Criterion("fwd", D256, CUDNN, 1.0),
    Criterion("fwd", NON_CAUSAL, CUDNN, 1.0),
    Criterion("fwd", WINDOW, FLEX, 2.5),
    Criterion("fwd", SOFTCAP, FLEX, 2.5),
    Criterion("fwd", D256_WINDOW_SOFTCAP, FLEX, 2.5),
    Criterion("bwd", T4K, CUDNN, 1.10),
    Criterion("bwd", T16K, CUDNN, 1.10),
    Criterion("bwd", D64, CUDNN, 1.0),
    Criterion("bwd", D256, CUDNN, 1.2),
    Criterion("bwd", WINDOW, FLEX, 3.0),
    Criterion("bwd", SOFTCAP, FLEX, 3.0),
    Criterion("bwd", D256_WINDOW_SOFTCAP, FLEX, 3.0),
]

# What one criterion measured: ratios None where the run (or the anchors)
# has no number for a side.
Reading = namedtuple("Reading",
                     "criterion run_median run_lowest rounds rounds_met anchor_ratio anchor_tflops")


def default_anchors_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "shared", "anchors"))


def anchor_key(entry):
    """anchors.py's record -> side_by_side.py's shape label."""
    return shape_key((entry["B"], entry["T"], entry["H"], entry["Hkv"], entry["hd"],
                      entry["causal"], entry["window"], float(entry["softcap"])))


def load_anchors(directory):
    """(backend, shape label) -> {"fwd": TFLOP/s, "bwd": TFLOP/s} from every
    anchors-FAMILY-DATE.json in directory; {} if there is none. A backend's
    numbers come from its own family's file where that has them: the SDPA
    file also holds a first, broken FlexAttention run (4-18 TFLOP/s), and
    the anchors' README reports the Flex file's rerun. Within one file a
    later record of a shape wins."""
    anchors, from_own_file = {}, set()
    for path in sorted(glob.glob(os.path.join(directory, "anchors-*.json"))):
        family = os.path.basename(path)[len("anchors-"):].split("-")[0]
        with open(path) as f:
            for entry in json.load(f):
                if "backend" not in entry or "hd" not in entry:
                    continue  # the ceiling record
                key = (entry["backend"], anchor_key(entry))
                own = entry["backend"].startswith(family)
                if key in from_own_file and not own:
                    continue
                anchors[key] = {"fwd": entry.get("fwd_tflops"), "bwd": entry.get("bwd_tflops")}
                if own:
                    from_own_file.add(key)
    return anchors


# The criteria are cuda-hopper's.
DEFAULT_OURS = "gqattn:cuda-hopper"


def check_ours(results, ours):
    """ours, if the run timed it; else exits naming the gqattn backends it did."""
    names = sorted({r["backend"] for r in results})
    if ours not in names:
        raise SystemExit(f"the run has no {ours}; its gqattn backends: "
                         f"{', '.join(n for n in names if n.startswith('gqattn:')) or 'none'}")
    return ours


def tflops(record, pass_):
    value = record.get(f"{pass_}_tflops") if record else None
    return value if value else None


def paired_rounds(c, results, ours):
    """[(ours, competitor's)] TFLOP/s of c's shape and pass, one pair per
    round that timed both."""
    pairs = []
    for i in sorted({r.get("round", 0) for r in results}):
        here = {r["backend"]: r for r in results
                if r["shape"] == c.shape and r.get("round", 0) == i}
        mine, theirs = tflops(here.get(ours), c.pass_), tflops(here.get(c.competitor), c.pass_)
        if mine and theirs:
            pairs.append((mine, theirs))
    return pairs


def read_criterion(c, results, ours, anchors):
    per_round = [mine / theirs for mine, theirs in paired_rounds(c, results, ours)]
    mine_all = [tflops(r, c.pass_) for r in results
                if r["shape"] == c.shape and r["backend"] == ours]
    mine_all = [v for v in mine_all if v]
    anchor = (anchors.get((c.competitor, c.shape)) or {}).get(c.pass_)
    anchor_ratio = statistics.median(mine_all) / anchor if mine_all and anchor else None
    return Reading(c, statistics.median(per_round) if per_round else None,
                   min(per_round) if per_round else None, len(per_round),
                   sum(met(v, c.line) == "yes" for v in per_round), anchor_ratio, anchor)


# Both sides of one criterion over its rounds: when a verdict differs
# between rounds, which side moved.
Spread = namedtuple("Spread", "criterion ours theirs")


def read_spreads(run, ours=DEFAULT_OURS):
    results = run["results"]
    ours = check_ours(results, ours)
    spreads = []
    for c in CRITERIA:
        pairs = paired_rounds(c, results, ours)
        spreads.append(Spread(c, [m for m, _ in pairs], [t for _, t in pairs]))
    return spreads


def spread_text(values):
    """median [lowest-highest] and the range as a percentage of the median."""
    if not values:
        return "-"
    median = statistics.median(values)
    return (f"{median:.0f} [{min(values):.0f}-{max(values):.0f}] "
            f"{100 * (max(values) - min(values)) / median:.1f}%")


SPREAD_HEADER = ["pass", "shape", "against", "rounds", "ours: median [range] range %",
                 "theirs: median [range] range %"]


def spread_rows(spreads):
    for sp in spreads:
        c = sp.criterion
        yield [c.pass_, c.shape, c.competitor, str(len(sp.ours)),
               spread_text(sp.ours), spread_text(sp.theirs)]


def pool_runs(runs):
    """One run whose rounds are every round of `runs`, each kept apart
    (its round becomes (run's index, round)), so that a round's ratio still
    takes both sides from one round of one run."""
    return {"results": [dict(r, round=(i, r.get("round", 0)))
                        for i, run in enumerate(runs) for r in run["results"]]}


def read_run(run, anchors, ours=DEFAULT_OURS):
    results = run["results"]
    ours = check_ours(results, ours)
    return ours, [read_criterion(c, results, ours, anchors) for c in CRITERIA]


def met(value, line):
    return "-" if value is None else ("yes" if value >= line - 1e-12 else "NO")


def ratio_text(value):
    return "-" if value is None else f"{value:.3f}"


def rows(readings):
    for r in readings:
        c = r.criterion
        yield [c.pass_, c.shape, c.competitor, f">= {c.line:.2f}",
               ratio_text(r.run_median), ratio_text(r.run_lowest),
               f"{r.rounds_met} of {r.rounds}",
               met(r.run_median, c.line), met(r.run_lowest, c.line),
               ratio_text(r.anchor_ratio) +
               (f" ({r.anchor_tflops:.0f})" if r.anchor_tflops else ""),
               met(r.anchor_ratio, c.line)]


HEADER = ["pass", "shape", "against", "line", "run median", "lowest round", "rounds met",
          "met (median)", "met (every round)", "vs anchor (its TFLOP/s)", "met (anchor)"]


def print_table(readings, markdown, out=None, header=HEADER, make_rows=rows):
    out = out or sys.stdout  # looked up per call, so that a redirect is followed
    table = [header] + list(make_rows(readings))
    if markdown:
        out.write("| " + " | ".join(header) + " |\n")
        out.write("|" + "---|" * len(header) + "\n")
        for row in table[1:]:
            out.write("| " + " | ".join(row) + " |\n")
        return
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


def protocol(run):
    """How side_by_side.py timed a run, from its JSON (the fields default to
    off where older runs lack them): bursts, after a settle, paused calls
    or sustained."""
    parts = [f"sustained {run.get('sustained_s') or 0:g} s",
             f"settle {run.get('settle_s') or 0:g} s",
             f"idle {run.get('idle_ms') or 0} ms a call",
             f"spin {run.get('spin_ahead_us') or 0} us ahead"]
    if run.get("back_to_back"):
        parts.append("back to back")
    return ", ".join(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="run",
                    help="side_by_side.json of a run; several are pooled (their rounds)")
    ap.add_argument("--anchors", default=default_anchors_dir(),
                    help="folder of anchors-*.json (default: ../shared/anchors beside the repo)")
    ap.add_argument("--ours", default=DEFAULT_OURS,
                    help=f"gqattn's label in the run (default: {DEFAULT_OURS})")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    ap.add_argument("--spread", action="store_true",
                    help="instead: both sides' TFLOP/s over the rounds (which side moves)")
    args = ap.parse_args(argv)
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    for path, one in zip(args.runs, runs):
        if one.get("partial"):
            at = one.get("stopped_at") or {}
            print(f"note: {path} is partial, stopped in round {at.get('round', 0) + 1} at "
                  f"{at.get('shape')} (bench/side_by_side.py): lines it did not reach on "
                  f"both sides have no ratio from it")
    gpus = [one.get("gpu", {}).get("uuid") for one in runs]
    if any(gpus):
        # side_by_side.py records the GPU since 2026-12-04: fresh device calls
        # may land on different H200s, whose levels differ on both sides.
        print("GPU per run: " + ", ".join(f"{path}: {uuid or 'not recorded'}"
                                          for path, uuid in zip(args.runs, gpus)))
    protocols = [protocol(one) for one in runs]
    if len(set(protocols)) > 1:
        # Pooling mixes regimes: bursts, paused calls and sustained runs
        # read different levels (docs/performance.md, "Three ways of spacing
        # the calls").
        print("note: the runs were measured differently, pooled all the same: " +
              ", ".join(f"{path}: {p}" for path, p in zip(args.runs, protocols)))
    elif protocols[0] != protocol({}):
        print(f"protocol: {protocols[0]}")
    unspun = [path for path, one in zip(args.runs, runs) if not one.get("spin_ahead_us")]
    if unspun:
        # Without the spin each timed call's events held the host's queueing
        # of it, PyTorch's 0.1-1.3 ms against ours 0.01-0.07 (docs/
        # performance.md, "The spin ahead of every call").
        print("note: timed without a spin ahead of each call (side_by_side.py before 974fb9d, "
              "or --spin-ahead-us 0): the competitors' times hold PyTorch's host queueing, so "
              "the in-run ratios are upper bounds: " + ", ".join(unspun))
    run = runs[0] if len(runs) == 1 else pool_runs(runs)
    if args.spread:
        print(f"{args.ours} in {', '.join(args.runs)}"
              f"{' (rounds pooled)' if len(runs) > 1 else ''}: TFLOP/s per round")
        print_table(read_spreads(run, args.ours), args.markdown, header=SPREAD_HEADER,
                    make_rows=spread_rows)
        return
    anchors = load_anchors(args.anchors)
    ours, readings = read_run(run, anchors, args.ours)
    print(f"{ours} in {', '.join(args.runs)}"
          f"{' (rounds pooled)' if len(runs) > 1 else ''}; anchors: "
          f"{args.anchors if anchors else 'none found in ' + args.anchors}")
    print_table(readings, args.markdown)


if __name__ == "__main__":
    main()
