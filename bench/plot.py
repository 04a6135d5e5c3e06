"""Bar chart of a side_by_side.json (bench/side_by_side.py): forward and
backward TFLOP/s per shape, one bar per backend.

usage: python bench/plot.py RESULTS.json OUT.png [--title TEXT]

Each bar is the backend's median over the JSON's rounds ("results", each
record with its "round"); with several rounds an error bar spans the
rounds' minimum to maximum, with one round there is none. Above each of
gqattn's bars (backends named cuda-..., "gqattn:cuda-hopper" in the JSON)
stands its ratio to the strongest other backend on that shape, median over
median. The x labels name only the fields in which a shape differs from
the most common value of each field ("B16 T1k", "w1024", "cap30"; the
shape with none of its own is labelled by its length, head dim and mask,
"T4k d128 causal"); the axis caption gives the common values. Labels are
wrapped onto short lines and the figure grows with the number of shapes
so that they never overlap.

The data preparation (shape_fields, shape_labels, bar_stats, ratios,
prepare) needs no matplotlib; bench/tests/test_plot.py checks it and, where
matplotlib is installed, the drawing. The pictures next to the JSONs in
docs/bench/ are its output.
"""
import argparse
import collections
import json
import re
import statistics
import textwrap

FIELDS = ("B", "T", "H", "Hkv", "d", "causal", "window", "softcap")
METRICS = (("fwd_tflops", "forward"), ("bwd_tflops", "backward"))
# side_by_side.shape_key: "B16 T1024 H32/8 d128 c1 w0 cap0"
SHAPE_KEY = re.compile(r"^B(\d+) T(\d+) H(\d+)/(\d+) d(\d+) c([01]) w(\d+) cap(\S+)$")
OURS_PREFIX = "cuda-"
LABEL_LINE = 12  # characters per line of an x label


def is_ours(backend):
    """gqattn's backends: cuda-..., written "gqattn:cuda-flash[:nondet]" by
    side_by_side.py."""
    name = backend[len("gqattn:"):] if backend.startswith("gqattn:") else backend
    return name.startswith(OURS_PREFIX)


def _typed(fields):
    return dict(B=int(fields["B"]), T=int(fields["T"]), H=int(fields["H"]),
                Hkv=int(fields["Hkv"]), d=int(fields["d"]), causal=bool(int(fields["causal"])),
                window=int(fields["window"]), softcap=float(fields["softcap"]))


def shape_fields(shape, records=()):
    """The fields B, T, H, Hkv, d, causal, window, softcap of one shape:
    from the first of its records that has them all (gqattn_bench writes
    Tq and Tk, PyTorch's side T), else parsed from the shape key; None if
    neither works."""
    for rec in records:
        got = dict(rec)
        if "T" not in got and "Tq" in got:
            got["T"] = got["Tq"]
        if all(f in got for f in FIELDS):
            try:
                return _typed(got)
            except (TypeError, ValueError):
                pass
    m = SHAPE_KEY.match(shape.strip())
    if m:
        try:
            return _typed(dict(zip(FIELDS, m.groups())))
        except ValueError:
            pass
    return None


def _tokens(t):
    return f"{t // 1024}k" if t >= 1024 and t % 1024 == 0 else str(t)


def _part(field, f):
    """One field of shape fields f, as the labels write it ("" for H's
    partner Hkv, which is written with H)."""
    return {"B": lambda: f"B{f['B']}",
            "T": lambda: f"T{_tokens(f['T'])}",
            "H": lambda: f"H{f['H']}/{f['Hkv']}",
            "Hkv": lambda: "",
            "d": lambda: f"d{f['d']}",
            "causal": lambda: "causal" if f["causal"] else "noncausal",
            "window": lambda: f"w{f['window']}",
            "softcap": lambda: f"cap{f['softcap']:g}"}[field]()


def common_fields(all_fields):
    """The most common value of each field over the shapes (ties: the
    first seen)."""
    known = [f for f in all_fields if f is not None]
    if not known:
        return None
    return {k: collections.Counter(f[k] for f in known).most_common(1)[0][0] for k in FIELDS}


def describe(f):
    """All of shape fields f, short: "B4 T4k H32/8 d128 causal" (+ window
    and softcap where set)."""
    parts = [_part(k, f) for k in ("B", "T", "H", "d", "causal")]
    parts += [_part(k, f) for k in ("window", "softcap") if f[k]]
    return " ".join(parts)


def shape_labels(shapes, all_fields):
    """Short, unique labels of the shapes (in order): the fields in which
    each differs from common_fields (H and Hkv together, as "H16/8"); a
    shape that differs in none is labelled by its T, d and mask. A shape
    whose fields are unknown keeps its key."""
    common = common_fields(all_fields)
    labels = []
    for shape, f in zip(shapes, all_fields):
        if f is None:
            labels.append(shape)
            continue
        differs = [k for k in FIELDS if f[k] != common[k]]
        if "Hkv" in differs and "H" not in differs:
            differs.insert(differs.index("Hkv"), "H")
        parts = [p for p in (_part(k, f) for k in differs) if p]
        if not parts:
            parts = [_part(k, f) for k in ("T", "d", "causal")]
            parts += [_part(k, f) for k in ("window", "softcap") if f[k]]
        labels.append(" ".join(parts))
    seen = collections.Counter()
    for i, label in enumerate(labels):  # a safeguard: equal fields, different keys
        seen[label] += 1
        if labels.count(label) > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def wrap_label(label, width=LABEL_LINE):
    """A label on lines of at most `width` characters (longer words whole)."""
    return "\n".join(textwrap.wrap(label, width, break_long_words=False)) or label


Stat = collections.namedtuple("Stat", "median lo hi")  # lo, hi: None without a spread


def _records(data):
    """Every round's records; a JSON with none ("results" empty) falls back
    to its "medians"."""
    return data.get("results") or data.get("medians") or []


def order_of(records):
    """(shapes, backends) in the order they first appear."""
    shapes, backends = [], []
    for r in records:
        if r.get("shape") is not None and r["shape"] not in shapes:
            shapes.append(r["shape"])
        if r.get("backend") is not None and r["backend"] not in backends:
            backends.append(r["backend"])
    return shapes, backends


def rounds_of(data):
    """How many rounds the JSON's records come from (1 for a JSON written
    before rounds existed, whose records carry no "round")."""
    return max(1, len({r.get("round") for r in _records(data)}))


def bar_stats(records):
    """{(shape, backend, metric): Stat} over the records: the median of
    the metric's values (one per round) and, where there are two or more,
    their minimum and maximum; lo and hi are None with one value."""
    values = collections.defaultdict(list)
    for r in records:
        for metric, _ in METRICS:
            v = r.get(metric)
            if isinstance(v, (int, float)) and v == v:
                values[(r["shape"], r["backend"], metric)].append(float(v))
    return {key: Stat(statistics.median(v), min(v), max(v)) if len(v) > 1
            else Stat(v[0], None, None)
            for key, v in values.items()}


def ratios(stats, shapes, backends, metric):
    """{(shape, backend): ratio} for each of gqattn's backends (is_ours) on
    each shape: its median over the strongest other backend's median;
    absent where either side has no number."""
    out = {}
    others = [b for b in backends if not is_ours(b)]
    for shape in shapes:
        best = max((stats[(shape, b, metric)].median for b in others
                    if (shape, b, metric) in stats), default=None)
        if not best:
            continue
        for b in backends:
            if is_ours(b) and (shape, b, metric) in stats:
                out[(shape, b)] = stats[(shape, b, metric)].median / best
    return out


def prepare(data):
    """Everything the chart draws, from a loaded side_by_side.json:
    shapes, labels (shape_labels), common (describe of the common fields,
    or ""), backends, rounds, stats (bar_stats) and ratios ({metric:
    ratios(...)})."""
    records = _records(data)
    shapes, backends = order_of(records)
    all_fields = [shape_fields(s, [r for r in records if r.get("shape") == s]) for s in shapes]
    common = common_fields(all_fields)
    stats = bar_stats(records)
    return dict(shapes=shapes, labels=shape_labels(shapes, all_fields),
                common=describe(common) if common else "", backends=backends,
                rounds=rounds_of(data), stats=stats,
                ratios={m: ratios(stats, shapes, backends, m) for m, _ in METRICS})


def figure_width(labels, n_backends):
    """Inches: a slot per shape wide enough for its bars and for the
    longest line of its wrapped label at 8 pt, plus the margins."""
    longest = max((len(line) for label in labels for line in wrap_label(label).splitlines()),
                  default=1)
    slot = max(0.34 * n_backends + 0.3, 0.085 * longest + 0.3, 1.0)
    return max(7.0, 1.8 + slot * len(labels))


def draw(data, title=""):
    """The chart of a loaded side_by_side.json, as a matplotlib figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = prepare(data)
    shapes, backends, stats = p["shapes"], p["backends"], p["stats"]
    fig_width = figure_width(p["labels"], len(backends))
    fig, axes = plt.subplots(2, 1, figsize=(fig_width, 9), sharex=True)
    width = 0.8 / max(1, len(backends))
    # The ratios stand upright over bars too narrow for them (about 0.25 in
    # at 7 pt).
    bar_in = (fig_width - 1.8) / max(1, len(shapes)) * width
    ratio_rotation = 0 if bar_in >= 0.27 else 90
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (metric, what) in zip(axes, METRICS):
        top = 0.0
        for b_index, backend in enumerate(backends):
            xs, heights, err_x, err_y, err = [], [], [], [], [[], []]
            for s_index, shape in enumerate(shapes):
                st = stats.get((shape, backend, metric))
                if st is None:
                    continue
                x = s_index + (b_index - (len(backends) - 1) / 2) * width
                xs.append(x)
                heights.append(st.median)
                top = max(top, st.hi if st.hi is not None else st.median)
                if st.lo is not None:
                    err_x.append(x)
                    err_y.append(st.median)
                    err[0].append(st.median - st.lo)
                    err[1].append(st.hi - st.median)
            ax.bar(xs, heights, width, label=backend, color=colors[b_index % len(colors)])
            if err_x:
                ax.errorbar(err_x, err_y, yerr=err, fmt="none", ecolor="black", elinewidth=0.8,
                            capsize=2)
        for (shape, backend), ratio in p["ratios"][metric].items():
            st = stats[(shape, backend, metric)]
            x = (shapes.index(shape)
                 + (backends.index(backend) - (len(backends) - 1) / 2) * width)
            y = st.hi if st.hi is not None else st.median
            ax.annotate(f"{ratio:.2f}", (x, y), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=ratio_rotation)
        ax.set_ylim(0, top * 1.15 if top > 0 else 1)
        ax.set_ylabel(f"{what} TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(ncol=len(backends), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0),
                   frameon=False)
    axes[1].set_xticks(range(len(shapes)))
    axes[1].set_xticklabels([wrap_label(label) for label in p["labels"]], fontsize=8)
    axes[1].set_xlim(-0.5, len(shapes) - 0.5)
    caption = []
    if p["common"]:
        caption.append(f"shapes: where not named, {p['common']}")
    caption.append((f"bars: median of {p['rounds']} rounds, error bars: min to max over them"
                    if p["rounds"] > 1 else "bars: one round")
                   + f"; numbers: {OURS_PREFIX}... over the strongest other backend")
    axes[1].set_xlabel("\n".join(caption), fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    with open(args.results) as fh:
        data = json.load(fh)
    fig = draw(data, args.title)
    fig.savefig(args.out, dpi=90)


if __name__ == "__main__":
    main()
