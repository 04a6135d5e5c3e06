#!/usr/bin/env python3
"""Context parallelism (gqattn.distributed): one sequence's attention on one
device against the same sequence sharded over W ranks, forward and
forward + backward, for both methods (all_gather, ring) and the
load_balanced layout. Reports tokens per second on one rank and on W, the
scaling factor (W-rank tokens/s over one rank's), and the time of the
method's K/V traffic alone; the share of it hidden under compute is
1 - (t_W - t_1 / W) / t_comm when positive (an estimate: t_1 / W is the
compute of a perfectly balanced rank).

GPU (NCCL, one process per GPU):
  python3 bench/context_parallel.py --world 2 --T 131072 --dtype bf16 --json out.json
CPU toy size (gloo; what CI runs):
  python3 bench/context_parallel.py --world 2 --T 256 --H 4 --Hkv 2 --d 16 --device cpu

Timing: the median of synchronised wall-clock calls (the whole distributed
step, host included, as a training step sees it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="ranks (processes); one GPU each on CUDA")
    ap.add_argument("--T", type=int, default=131072, help="tokens of the sequence")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--Hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", default="all_gather,ring")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args(argv)


def _time(fn, repeats, device):
    import torch
    fn()  # warm-up (and compile/plan caches)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def _worker(rank, args, path, results):
    import torch
    import torch.distributed as dist

    import gqattn.distributed as gd
    import gqattn.torch as gt

    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank,
                            world_size=args.world)
    dev = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) + 0.5).to(dev, dtype)

    q = rand(args.B, args.T, args.H, args.d)
    k = rand(args.B, args.T, args.Hkv, args.d)
    v = rand(args.B, args.T, args.Hkv, args.d)
    out = {"rank": rank}
    if rank == 0:  # one device, the whole sequence
        def one_fwd():
            gt.attention(q, k, v, causal=True)

        def one_fwd_bwd():
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            gt.attention(qq, kk, vv, causal=True).sum().backward()
        out["single_fwd_s"] = _time(one_fwd, args.repeats, args.device)
        out["single_fwd_bwd_s"] = _time(one_fwd_bwd, args.repeats, args.device)
    dist.barrier()
    sq, sk, sv = (gd.shard(x, layout="load_balanced") for x in (q, k, v))
    for method in args.methods.split(","):
        def cp_fwd():
            gd.context_parallel_attention(sq, sk, sv, causal=True, method=method)

        def cp_fwd_bwd():
            qq, kk, vv = (x.detach().requires_grad_() for x in (sq, sk, sv))
            gd.context_parallel_attention(qq, kk, vv, causal=True, method=method).sum().backward()
        out[f"{method}_fwd_s"] = _time(cp_fwd, args.repeats, args.device)
        out[f"{method}_fwd_bwd_s"] = _time(cp_fwd_bwd, args.repeats, args.device)

        def comm_only():  # the K/V traffic of the method, no compute
            parts = [torch.empty_like(sk) for _ in range(args.world)]
            if method == "all_gather":
                dist.all_gather(parts, sk.contiguous())
                dist.all_gather(parts, sv.contiguous())
            else:
                for _ in range(args.world - 1):
                    dist.all_gather(parts, sk.contiguous())  # same bytes per rank as a ring step
        out[f"{method}_comm_s"] = _time(comm_only, args.repeats, args.device)
    results[rank] = out
    dist.destroy_process_group()


def main(argv=None):
    import torch.multiprocessing as mp
    args = _parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(_worker, args=(args, os.path.join(tmp, "store"), results), nprocs=args.world)
        ranks = [results[r] for r in range(args.world)]
    summary = {"config": vars(args), "ranks": ranks, "timing": "synchronised wall clock, median"}
    r0 = ranks[0]
    for method in args.methods.split(","):
        for pass_ in ("fwd", "fwd_bwd"):
            t_w = max(r[f"{method}_{pass_}_s"] for r in ranks)
            t_1 = r0[f"single_{pass_}_s"]
            summary[f"{method}_{pass_}"] = {
                "tokens_per_s_single": args.B * args.T / t_1,
                "tokens_per_s_world": args.B * args.T / t_w,
                "scaling": t_1 / t_w,
                "comm_alone_s": max(r[f"{method}_comm_s"] for r in ranks),
            }
            entry = summary[f"{method}_{pass_}"]
            exposed = max(0.0, t_w - t_1 / args.world)
            entry["hidden_share_estimate"] = max(0.0, 1.0 - exposed / entry["comm_alone_s"]) \
                if entry["comm_alone_s"] > 0 else None
    for key, val in summary.items():
        if isinstance(val, dict) and "scaling" in val:
            print(f"{key:22s} 1 rank {val['tokens_per_s_single']:12.0f} tok/s   "
                  f"{args.world} ranks {val['tokens_per_s_world']:12.0f} tok/s   "
                  f"scaling {val['scaling']:.2f}   comm alone {val['comm_alone_s'] * 1e3:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
