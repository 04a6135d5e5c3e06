#!/usr/bin/env python3
"""cpu-flash against PyTorch SDPA on the CPU, same threads, in one run.

For each shape (f32 and bf16, d 64 and 128, T 1k-4k, causal and not) it
times gqattn's forward and forward + backward on host tensors through the
public C++ API (bench/cpu_flash_bench.cpp, built here against a library
build; the Python package is not used so that the library just built is the
one measured) and torch.nn.functional.scaled_dot_product_attention on the
same shape and threads, plus the machine's torch f32 and bf16 GEMM rate
(4096^3) as the ceiling. Prints a table and writes JSON (--out).

  python3 bench/cpu_side_by_side.py --build build/h-cpuflash --out docs/bench/x.json
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


def build_driver(build):
    exe = os.path.join(tempfile.mkdtemp(), "cpu_flash_bench")
    lib = os.path.join(build, "libgqattn.a")
    subprocess.run(["c++", "-O2", "-std=c++17", "-I" + os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "bench", "cpu_flash_bench.cpp"), lib, "-lpthread",
                    "-o", exe], check=True)
    return exe


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def gemm_gflops(dtype, reps):
    a = torch.randn(4096, 4096, dtype=dtype)
    b = torch.randn(4096, 4096, dtype=dtype)
    ms = median_ms(lambda: a @ b, reps)
    return 2 * 4096**3 / ms / 1e6


def sdpa(B, T, H, Hkv, d, causal, dtype, reps):
    q = torch.randn(B, H, T, d, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, T, d, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, T, d, dtype=dtype, requires_grad=True)
    do = torch.randn(B, H, T, d, dtype=dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        o.backward(do)

    return median_ms(fwd, reps), median_ms(fwd_bwd, reps)


def flops(B, T, H, d, causal):
    pairs = T * (T + 1) // 2 if causal else T * T
    return 4 * B * H * pairs * d  # forward: Q K^T and P V


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "h-cpuflash"))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--causal", type=int, nargs="+", default=[1, 0])
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--Hkv", type=int, default=2)
    ap.add_argument("--backend", default="cpu-flash")
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
               "gqattn_forward_gflops": rate}
        result["rows"].append(row)
        print(f"{dt:5} {T:5} {d:4} {causal:6} | {g['forward_ms']:9.1f} {s_f:9.1f}"
              f" {s_f / g['forward_ms']:5.2f} | {g['forward_backward_ms']:10.1f} {s_fb:9.1f}"
              f" {s_fb / g['forward_backward_ms']:5.2f} | {rate:.0f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
