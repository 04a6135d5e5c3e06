"""Short-query forward benchmark: decoding and chunked prefill, side by side.

Forward only, Tq much shorter than Tk (Tq = 1 is a decoding step), bf16,
GQA: gqattn_bench (--no-backward) against PyTorch SDPA's flash and cuDNN
backends on the same shapes in the same run, with side_by_side.py's method
(rotated input sets beyond L2, warm-up, each call timed alone behind a GPU
spin that keeps the host's queueing out of its time, median) and its FLOP
count (4 d H B times the kept (i, j) pairs). The mask is none: SDPA's
is_causal aligns Tq != Tk at the top left where gqattn aligns at the bottom
right (docs/semantics.md), and for Tq = 1 the two are the same as none. The
torch backends are spot-checked against an f32 reference first, as in
side_by_side.py. These shapes are where cuda-hopper packs the query heads of
a kv head into one tile (src/cuda/hopper/pack_gqa.hpp) and splits each
tile's keys over several CTAs (src/cuda/hopper/split_kv.hpp). Writes
$OUT/short_query.json (or --out DIR) and prints one table. Checked by
running it on the GPU machine.

--spin-ahead-us N: the spin's length, as side_by_side.py's (default
2000 us; 0: none, the method before 974fb9d, whose PyTorch times held PyTorch's
queueing of each call: tens of microseconds or more, the whole of a
decoding step's kernel time). Each record gives the median queueing time
("fwd_enqueue_us") and, with a spin, the calls queued slower than it
lasted ("fwd_spin_short").

usage: python bench/short_query.py [--bench PATH] [--out DIR] [--repeats N]
                                   [--ours BACKEND] [--ours-only] [--spin-ahead-us N]
"""
import argparse
import json
import math
import os
import subprocess

from side_by_side import DEFAULT_SPIN_AHEAD_US, INPUT_MEAN, MAX_SETS, REF_MAX_REL_ERR, \
    ROTATE_BYTES, WARMUP, find_bench, kept_pairs, median_ms, print_spin_short, sdpa

# (B, Tq, Tk, H, Hkv, d): decoding steps (Tq 1) at two batch sizes and
# group sizes, and chunks of 16 and 64 queries, all bf16, no mask.
SHAPES = [
    (8, 1, 8192, 32, 8, 128),
    (64, 1, 8192, 32, 8, 128),
    (8, 1, 8192, 32, 1, 128),
    (8, 16, 8192, 32, 8, 128),
    (8, 64, 8192, 32, 8, 128),
    (8, 1, 8192, 32, 8, 64),
    (8, 1, 8192, 16, 2, 256),
]


def label(s):
    B, Tq, Tk, H, Hkv, d = s
    return f"B{B} Tq{Tq} Tk{Tk} H{H}/{Hkv} d{d}"


def flops(s):
    B, Tq, Tk, H, Hkv, d = s
    return 4.0 * d * H * B * kept_pairs(Tq, Tk, False, 0)


def run_ours(bench, s, repeats, backend, spin_ahead_us=0):
    B, Tq, Tk, H, Hkv, d = s
    cmd = [bench, "--shape", f"{B},{Tq},{Tk},{H},{Hkv},{d},0,0,0", "--no-backward",
           "--repeats", str(repeats), "--warmup", str(WARMUP), "--backend", backend]
    if spin_ahead_us > 0:
        cmd += ["--spin-ahead-us", str(spin_ahead_us)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": f"exit {run.returncode}: {run.stderr.strip()[-200:]}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def rel_err(f, q, k, v):
    """Relative error of f's output against an f32 reference (batch 0)."""
    import torch
    with torch.no_grad():
        o = f(q, k, v)[:1].float()
        rep = q.shape[2] // k.shape[2]
        qs, ks, vs = q[:1].float(), k[:1].float(), v[:1].float()
        ks, vs = ks.repeat_interleave(rep, dim=2), vs.repeat_interleave(rep, dim=2)
        p = torch.softmax(torch.einsum("bihd,bjhd->bhij", qs, ks) / math.sqrt(q.shape[3]), -1)
        ref = torch.einsum("bhij,bjhd->bihd", p, vs)
        return ((o - ref).norm() / ref.norm()).item()


def torch_records(s, repeats, spin_ahead_us=0):
    import torch
    from torch.nn.attention import SDPBackend
    B, Tq, Tk, H, Hkv, d = s
    set_bytes = 2 * (2 * B * Tq * H * d + 2 * B * Tk * Hkv * d)
    nsets = max(1, min(MAX_SETS, -(-ROTATE_BYTES // set_bytes)))
    sets = []
    for _ in range(nsets):
        def t(T, heads):
            return torch.randn(B, T, heads, d, device="cuda", dtype=torch.bfloat16) + INPUT_MEAN
        sets.append((t(Tq, H), t(Tk, Hkv), t(Tk, Hkv)))
    out = []
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        rec = {"backend": name, "shape": label(s)}
        try:
            f = sdpa(backend, False)
            err = rel_err(f, *sets[0])
            rec["rel_err"] = err
            if not err < REF_MAX_REL_ERR:
                raise RuntimeError(f"wrong result: relative error {err:.2e}")
            queueing = {}
            ms = median_ms(lambda x: f(*x), sets, repeats, spin_ahead_us=spin_ahead_us,
                           queueing=queueing)
            rec["fwd_ms"], rec["fwd_tflops"] = ms, flops(s) / ms / 1e9
            rec.update({"fwd_" + k: v for k, v in queueing.items()})
        except Exception as e:  # report, keep going
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        out.append(rec)
    del sets
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="path of gqattn_bench (default: newest build/*/bench/)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--ours", default="cuda-hopper")
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--spin-ahead-us", type=int, default=DEFAULT_SPIN_AHEAD_US, metavar="N",
                    help="GPU spin queued ahead of every timed call (0: none)")
    a = ap.parse_args()
    if a.spin_ahead_us < 0:
        ap.error("--spin-ahead-us must not be negative")
    bench = find_bench(a.bench)
    if not bench:
        raise SystemExit("no gqattn_bench found: build first or pass --bench")
    records = []
    for s in SHAPES:
        ours = run_ours(bench, s, a.repeats, a.ours, a.spin_ahead_us)
        rec = {"backend": a.ours, "shape": label(s)}
        rec.update({k: ours[k] for k in ("fwd_ms", "fwd_tflops", "error", "fwd_enqueue_us",
                                         "fwd_spin_short") if k in ours})
        records.append(rec)
        if not a.ours_only:
            records += torch_records(s, a.repeats, a.spin_ahead_us)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "short_query.json"), "w") as f:
        json.dump({"shapes": [label(s) for s in SHAPES], "spin_ahead_us": a.spin_ahead_us,
                   "results": records}, f, indent=1)
    names = [a.ours] + ([] if a.ours_only else ["sdpa-flash", "sdpa-cudnn"])
    print(f"{'fwd TFLOP/s (us per call)':34s}" + "".join(f"{n:>22s}" for n in names)
          + ("   ours / best" if not a.ours_only else ""))
    for s in SHAPES:
        row = {r["backend"]: r for r in records if r["shape"] == label(s)}
        cells = []
        for n in names:
            r = row.get(n, {})
            cells.append(f"{r['fwd_tflops']:9.1f} ({1000 * r['fwd_ms']:7.1f})" if "fwd_tflops" in r
                         else f"{r.get('error', 'n/a')[:20]:>20s}")
        line = f"{label(s):34s}" + "".join(f"{c:>22s}" for c in cells)
        others = [row[n]["fwd_tflops"] for n in names[1:] if "fwd_tflops" in row.get(n, {})]
        if others and "fwd_tflops" in row.get(a.ours, {}):
            line += f"   {row[a.ours]['fwd_tflops'] / max(others):.3f}"
        print(line)
    print_spin_short(records)


if __name__ == "__main__":
    main()
