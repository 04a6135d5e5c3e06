"""Bar chart of a side_by_side.json (bench/side_by_side.py): forward and
backward TFLOP/s per standard shape, one bar per backend.

usage: python bench/plot.py RESULTS.json OUT.png [--title TEXT]
Checked by looking at the picture it writes next to the JSON in docs/bench/.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    with open(args.results) as fh:
        data = json.load(fh)
    # With several rounds (side_by_side.py --rounds) the medians; a JSON
    # written before rounds existed has only "results", one record each.
    results = data.get("medians") or data["results"]
    shapes, backends = [], []
    for r in results:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
        if r["backend"] not in backends:
            backends.append(r["backend"])
    fig, axes = plt.subplots(2, 1, figsize=(14, 9), sharex=True)
    width = 0.8 / len(backends)
    for ax, key, label in ((axes[0], "fwd_tflops", "forward"), (axes[1], "bwd_tflops", "backward")):
        for b_index, backend in enumerate(backends):
            values = []
            for shape in shapes:
                rec = next((r for r in results if r["shape"] == shape and r["backend"] == backend),
                           None)
                values.append(rec.get(key, 0.0) if rec else 0.0)
            xs = [s + (b_index - (len(backends) - 1) / 2) * width for s in range(len(shapes))]
            ax.bar(xs, values, width, label=backend)
        ax.set_ylabel(f"{label} TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(ncol=len(backends), fontsize=8)
    axes[1].set_xticks(range(len(shapes)))
    axes[1].set_xticklabels([s.replace(" ", "\n", 2) for s in shapes], fontsize=7)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)


if __name__ == "__main__":
    main()
