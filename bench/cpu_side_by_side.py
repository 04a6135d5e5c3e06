#!/usr/bin/env python3
"""cpu-flash against PyTorch SDPA on the CPU, same threads, in one run.

For each shape (f32 and bf16, d 64 and 128, T 1k-4k, causal and not) it
times gqattn's forward and forward + backward on host tensors through the
public C++ API (bench/cpu_flash_bench.cpp, built here against a library
build; the Python package is not used so that the library just built is the
one measured) and torch.nn.functional.scaled_dot_product_attention on the
same shape and threads, plus the machine's torch f32 and bf16 GEMM rate
(4096^3) as the ceiling. With --masks, causal rows with a window of T / 4
(SDPA given the equivalent boolean mask) and with a softcap of 30 (SDPA has
none: its causal time), each with the time its kept pairs predict from the
plain causal row of the same run. Prints a table and writes JSON (--out).

  cmake --preset cpu && cmake --build --preset cpu
  python3 bench/cpu_side_by_side.py --build build/cpu --masks --out docs/bench/x.json
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTLE_S = 0.5
MIN_TIMED_S = 1.0  # the driver's rule too (cpu_flash_bench.cpp)


def build_driver(build):
    exe = os.path.join(tempfile.mkdtemp(), "cpu_flash_bench")
    lib = os.path.join(build, "libgqattn.a")
    subprocess.run(["c++", "-O2", "-std=c++17", "-I" + os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "bench", "cpu_flash_bench.cpp"), lib, "-lpthread",
                    "-o", exe], check=True)
    return exe


def settle(seconds):
    """Idle before a timing, so neither side runs while the other's threads
    still spin from its last call (torch's OpenMP workers wait busily)."""
    time.sleep(seconds)


def median_ms(fn, reps):
    settle(SETTLE_S)
    fn()
    times = []
    # At least `reps` calls and, for short ones, at least MIN_TIMED_S of them.
    while len(times) < reps or (sum(times) < MIN_TIMED_S * 1e3 and len(times) < 100):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def gemm_gflops(dtype, reps):
    a = torch.randn(4096, 4096, dtype=dtype)
    b = torch.randn(4096, 4096, dtype=dtype)
    ms = median_ms(lambda: a @ b, reps)
    return 2 * 4096**3 / ms / 1e6


def sdpa(B, T, H, Hkv, d, causal, dtype, reps, window=0):
    q = torch.randn(B, H, T, d, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, T, d, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, T, d, dtype=dtype, requires_grad=True)
    do = torch.randn(B, H, T, d, dtype=dtype)
    mask = None
    if window > 0:  # keep key j for query i where i - window < j <= i
        i = torch.arange(T).unsqueeze(1)
        j = torch.arange(T).unsqueeze(0)
        mask = (j <= i) & (j > i - window)
    kw = {"attn_mask": mask} if mask is not None else {"is_causal": causal}

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        o.backward(do)

    return median_ms(fwd, reps), median_ms(fwd_bwd, reps)


def kept_pairs(T, causal, window=0):
    if window > 0:  # causal band: query i keeps min(i + 1, window) keys
        return window * (window + 1) // 2 + (T - window) * window
    return T * (T + 1) // 2 if causal else T * T


def flops(B, T, H, d, causal):
    return 4 * B * H * kept_pairs(T, causal) * d  # forward: Q K^T and P V


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "cpu"))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--causal", type=int, nargs="+", default=[1, 0])
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--Hkv", type=int, default=2)
    ap.add_argument("--backend", default="cpu-flash")
    ap.add_argument("--masks", action="store_true",
                    help="add window and softcap rows (causal) to each dtype, T and d")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    exe = build_driver(args.build)
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}
    result = {"threads": args.threads, "torch": torch.__version__, "backend": args.backend,
              "gemm_gflops": {k: gemm_gflops(v, args.reps) for k, v in tdt.items()},
              "rows": []}
    print(f"threads {args.threads}; torch GEMM 4096^3: "
          + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in result["gemm_gflops"].items()))
    print(f"{'dtype':5} {'T':>5} {'d':>4} {'causal':>6} | {'fwd ms':>9} {'sdpa':>9} {'x':>5}"
          f" | {'fwd+bwd ms':>10} {'sdpa':>9} {'x':>5} | fwd GFLOP/s")
    for dt, T, d, causal in itertools.product(args.dtype, args.T, args.d, args.causal):
        settle(SETTLE_S)
        out = subprocess.run([exe, "1", str(T), str(args.H), str(args.Hkv), str(d), str(causal),
                              dt, args.backend, str(args.threads), str(args.reps)],
                             check=True, capture_output=True, text=True).stdout
        g = json.loads(out)
        s_f, s_fb = sdpa(1, T, args.H, args.Hkv, d, bool(causal), tdt[dt], args.reps)
        rate = flops(1, T, args.H, d, causal) / g["forward_ms"] / 1e6
        row = {"dtype": dt, "B": 1, "T": T, "H": args.H, "Hkv": args.Hkv, "d": d,
               "causal": bool(causal), "gqattn_forward_ms": g["forward_ms"],
               "gqattn_forward_backward_ms": g["forward_backward_ms"],
               "sdpa_forward_ms": s_f, "sdpa_forward_backward_ms": s_fb,
               "window": 0, "softcap": 0.0, "gqattn_forward_gflops": rate}
        result["rows"].append(row)
        print(f"{dt:5} {T:5} {d:4} {causal:6} | {g['forward_ms']:9.1f} {s_f:9.1f}"
              f" {s_f / g['forward_ms']:5.2f} | {g['forward_backward_ms']:10.1f} {s_fb:9.1f}"
              f" {s_fb / g['forward_backward_ms']:5.2f} | {rate:.0f}", flush=True)
        if args.masks and causal:
            for window, softcap in ((T // 4, 0.0), (0, 30.0)):
                settle(SETTLE_S)
                out = subprocess.run([exe, "1", str(T), str(args.H), str(args.Hkv), str(d), "1",
                                      dt, args.backend, str(args.threads), str(args.reps),
                                      str(window), str(softcap)],
                                     check=True, capture_output=True, text=True).stdout
                m = json.loads(out)
                share = kept_pairs(T, True, window) / kept_pairs(T, True)
                if window > 0:
                    m_f, m_fb = sdpa(1, T, args.H, args.Hkv, d, True, tdt[dt], args.reps, window)
                else:
                    m_f, m_fb = s_f, s_fb
                mrow = dict(row, window=window, softcap=softcap,
                            gqattn_forward_ms=m["forward_ms"],
                            gqattn_forward_backward_ms=m["forward_backward_ms"],
                            sdpa_forward_ms=m_f, sdpa_forward_backward_ms=m_fb,
                            kept_pair_share=share,
                            predicted_forward_ms=g["forward_ms"] * share,
                            predicted_forward_backward_ms=g["forward_backward_ms"] * share)
                del mrow["gqattn_forward_gflops"]
                result["rows"].append(mrow)
                label = f"w{window}" if window else f"cap{softcap:g}"
                print(f"{label:>24} | {m['forward_ms']:9.1f} {m_f:9.1f} {m_f / m['forward_ms']:5.2f}"
                      f" | {m['forward_backward_ms']:10.1f} {m_fb:9.1f}"
                      f" {m_fb / m['forward_backward_ms']:5.2f} | cost / kept-pair prediction:"
                      f" fwd {m['forward_ms'] / mrow['predicted_forward_ms']:.2f},"
                      f" fwd+bwd {m['forward_backward_ms'] / mrow['predicted_forward_backward_ms']:.2f}",
                      flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
