"""Call-by-call speed of gqattn and its competitor on one shape (SDPA's cuDNN
backend, or FlexAttention under a window or softcap).

side_by_side.py reports the median of 30 back-to-back calls after 5 warm-up
calls. On the H200 a long kernel runs faster at first and slows once the
power management reacts (docs/performance.md; 2026-12-02, H200: the
d128 causal B1 T16k forward reads about 700 TFLOP/s for its
first 10-20 calls and 620-635 afterwards), so that median lands on either side
of the change from run to run. This script times N calls of each backend
back to back, queued at once behind a GPU spin with an event between each
two (side_by_side.py's --back-to-back; timing each call alone after a
synchronisation without the spin would count PyTorch's queueing of the
call in its time), and prints TFLOP/s per window of calls: the
early burst, the median of the calls side_by_side would time, and the
steady state (the last half).

usage: python bench/call_series.py --shape B,T,H,Hkv,d,causal[,window,softcap] [--calls N]
           [--backend cuda-hopper] [--bench PATH] [--out FILE.jsonl]

Checked by running it on the GPU; it verifies no result (the tests do).
"""
import argparse
import json
import statistics
import subprocess
import sys

import side_by_side as sbs

WINDOW = 10  # calls per printed window


def summary(name, pass_name, tflops):
    """One record: per-window medians, side_by_side's median, the steady state."""
    bench_calls = tflops[:30]
    steady = tflops[len(tflops) // 2:]
    return dict(backend=name, pass_=pass_name, calls=len(tflops),
                windows=[round(statistics.median(tflops[i:i + WINDOW]), 1)
                         for i in range(0, len(tflops), WINDOW)],
                first30_median=round(statistics.median(bench_calls), 1),
                steady_median=round(statistics.median(steady), 1))


def ours(bench, backend, cfg, calls, do_backward):
    B, T, H, Hkv, d, causal, window, softcap = cfg
    shape = f"{B},{T},{T},{H},{Hkv},{d},{int(causal)},{window},{softcap:g}"
    cmd = [bench, "--backend", backend, "--shape", shape, "--repeats", str(calls),
           "--warmup", str(sbs.WARMUP), "--call-times", "--back-to-back",
           "--spin-ahead-us", str(sbs.DEFAULT_SPIN_AHEAD_US)]
    if not do_backward:
        cmd.append("--no-backward")
    line = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    out = []
    for p in ("fwd", "bwd") if do_backward else ("fwd",):
        flops = line[f"{p}_tflops"] * line[f"{p}_ms"]  # TFLOP/s x ms: the call's work
        out.append(summary(f"gqattn:{backend}", p, [flops / ms for ms in line[f"{p}_call_ms"]]))
    return out


def theirs(cfg, calls, do_backward):
    """The competitor of the criteria's line for cfg (criteria.py): SDPA's
    cuDNN backend on the plain shapes, FlexAttention under a window or
    softcap, as side_by_side.py builds and times them (its [B, T, H, d]
    layout: cuDNN is faster on contiguous [B, H, T, d], 585 against 537
    TFLOP/s at d128 causal B4 T4k, 2026-12-02, H200)."""
    import torch
    from torch.nn.attention import SDPBackend

    B, T, H, Hkv, d, causal, window, softcap = cfg
    fl = 4.0 * d * H * B * sbs.kept_pairs(T, T, causal, window)
    if window == 0 and softcap == 0:
        name, attend = "sdpa-cudnn", sbs.sdpa(SDPBackend.CUDNN_ATTENTION, causal)
    else:
        name, attend = "flex", sbs.flex(T, causal, window, softcap)

    def t(heads):
        x = torch.randn(B, T, heads, d, device="cuda", dtype=torch.bfloat16) + sbs.INPUT_MEAN
        return x.requires_grad_(True)
    q, k, v = t(H), t(Hkv), t(Hkv)
    do = torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16) + sbs.INPUT_MEAN
    o = attend(q, k, v)

    def bwd(_):
        q.grad = k.grad = v.grad = None
        o.backward(do, retain_graph=True)

    def series(fn, flops):
        times = sbs.call_times_ms(fn, [None], calls, spin_ahead_us=sbs.DEFAULT_SPIN_AHEAD_US,
                                  back_to_back=True)
        return [flops / ms / 1e9 for ms in times]
    out = [summary(name, "fwd", series(lambda _: attend(q, k, v), fl))]
    if do_backward:
        out.append(summary(name, "bwd", series(bwd, sbs.BWD_FACTOR * fl)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="B,T,H,Hkv,d,causal[,window,softcap]")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--backend", default="cuda-hopper")
    ap.add_argument("--bench", help="path of gqattn_bench (default: newest build/*/bench/)")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--out", help="append the records here as JSON lines")
    a = ap.parse_args()
    fields = a.shape.split(",")
    if len(fields) not in (6, 8):
        ap.error("--shape: B,T,H,Hkv,d,causal or B,T,H,Hkv,d,causal,window,softcap")
    B, T, H, Hkv, d, causal = (int(x) for x in fields[:6])
    window, softcap = (int(fields[6]), float(fields[7])) if len(fields) == 8 else (0, 0.0)
    cfg = (B, T, H, Hkv, d, bool(causal), window, softcap)
    bench = sbs.find_bench(a.bench)
    records = ours(bench, a.backend, cfg, a.calls, not a.no_backward)
    records += theirs(cfg, a.calls, not a.no_backward)
    for r in records:
        r["shape"] = a.shape
        print(f"{r['backend']:20s} {r['pass_']} {a.shape}: first 30 {r['first30_median']:6.1f}"
              f"  steady {r['steady_median']:6.1f}  windows {r['windows']}", flush=True)
    if a.out:
        with open(a.out, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
