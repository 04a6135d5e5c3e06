"""Packed variable-length batches on one GPU, side by side (docs/performance.md).

What it times, d128 GQA 32/8 bf16, forward and backward:
- "equal": 16 sequences of 4096 tokens packed (64k tokens), against our own
  dense kernel on B16 T4096 in the same run: packing should cost almost
  nothing (the goal is >= 0.97x of the dense TFLOP/s).
- "mixed": 16 documents of 128 to 8192 tokens (64k in all), and "short":
  128 documents of 64 to 1000 tokens, causal and not, against
  FlexAttention with a document mask over the packed tokens, the same
  documents padded to one dense batch in SDPA's cuDNN and flash backends
  (pad and unpad copies not timed: the peers' best case), and PyTorch's
  own varlen attention where this torch has it.

TFLOP/s count the kept (query, key) pairs of the documents alone
(4 * d * H * pairs forward, 2.5x that backward), so padding is wasted
work of the padded peers, not extra credit. Ours runs through
gqattn_bench --varlen (offsets on the device, unchecked per call, as
under torch.compile); PyTorch's side times with side_by_side.py's method
(rotated copies, warm-up, a GPU spin ahead of every call, median).
Each peer is spot-checked against an f32 reference on one document
before it is timed.

usage: python bench/varlen.py [--bench PATH] [--out DIR] [--repeats N]
                              [--ours cuda-hopper,cuda-flash] [--ours-only]
Writes DIR/varlen.json. Its host-side logic is checked by
bench/tests/test_bench_varlen.py; the timing by running it on the GPU machine.
"""
import argparse
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402

H, HKV, D = 32, 8, 128
TOTAL_TOKENS = 65536


def mixed_lengths(n=16, lo=128, hi=8192, total=TOTAL_TOKENS, seed=7):
    """n lengths in [lo, hi], log-uniform, scaled to sum to `total`
    exactly; deterministic for a seed. Not multiples of a tile, so that
    every document ends inside a tile."""
    rng = random.Random(seed)
    raw = [math.exp(rng.uniform(math.log(lo), math.log(hi))) for _ in range(n)]
    scale = total / sum(raw)
    lens = [min(hi, max(lo, int(x * scale))) for x in raw]
    i = 0
    while sum(lens) != total:  # spread the rounding over the documents
        step = 1 if sum(lens) < total else -1
        if lo <= lens[i % n] + step <= hi:
            lens[i % n] += step
        i += 1
    return lens


# 16 documents from 128 to 8192 tokens, 64k in all, in a packing order
# that puts long ones after short ones (none a multiple of a tile but the
# longest, so most documents end inside a tile).
MIXED = [1500, 8192, 333, 4999, 7777, 128, 3941, 6400, 1000, 8192, 2222, 5555, 700, 7001,
         3500, 4096]


def cases():
    """(name, lengths, causal) of every packed batch timed."""
    short = mixed_lengths(n=128, lo=64, hi=1000, total=128 * 500, seed=11)
    return [("equal", [4096] * 16, True),
            ("mixed", MIXED, True),
            ("mixed", MIXED, False),
            ("short", short, True)]


def kept_pairs(lens, causal):
    return sum(n * (n + 1) // 2 if causal else n * n for n in lens)


def label(name, lens, causal):
    return f"{name} {len(lens)}x[{min(lens)}..{max(lens)}] {sum(lens)} tok c{int(causal)}"


def run_ours(bench, lens, causal, backend, repeats, spin_ahead_us, dense_batch=False):
    """gqattn_bench on the packed batch (or, dense_batch, on B = len(lens)
    dense sequences of lens[0], the equal batch's reference)."""
    mask = f"{H},{HKV},{D},{int(causal)},0,0"
    if dense_batch:
        spec = ["--shape", f"{len(lens)},{lens[0]},{lens[0]},{mask}"]
    else:
        spec = ["--varlen", "/".join(map(str, lens)) + "," + mask]
    cmd = [bench, *spec, "--backend", backend, "--repeats", str(repeats),
           "--warmup", str(sbs.WARMUP)]
    if spin_ahead_us > 0:
        cmd += ["--spin-ahead-us", str(spin_ahead_us)]
    return sbs.bench_record(cmd)


def peers(lens, causal):
    """(name, make) of PyTorch's ways to run the batch; make() returns
    (inputs(), fn(inputs) -> o, first_doc(o) -> o of document 0 as
    [len0, H, d])."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev, bf16 = "cuda", torch.bfloat16
    total, B, T = sum(lens), len(lens), max(lens)
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)

    def rand(*shape):
        return (torch.randn(*shape, device=dev, dtype=bf16) + sbs.INPUT_MEAN).requires_grad_(True)

    def padded(backend):
        def make():
            def inputs():
                return [rand(B, H, T, D), rand(B, HKV, T, D), rand(B, HKV, T, D)]

            def fn(x):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(*x[:3], is_causal=causal,
                                                          enable_gqa=True)
            return inputs, fn, lambda o, x: (o[0, :, :lens[0]].transpose(0, 1),
                                             [t[0, :, :lens[0]].transpose(0, 1) for t in x[:3]])
        return make

    def flex_document():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.repeat_interleave(torch.arange(B, device=dev),
                                      torch.tensor(lens, device=dev))

        def mask_mod(b, h, qi, kj):
            same = doc[qi] == doc[kj]
            return same & (qi >= kj) if causal else same
        block_mask = create_block_mask(mask_mod, None, None, total, total, device=dev)
        fa = torch.compile(flex_attention, dynamic=False)

        def make():
            def inputs():
                return [rand(1, H, total, D), rand(1, HKV, total, D), rand(1, HKV, total, D)]

            def fn(x):
                return fa(*x[:3], block_mask=block_mask, enable_gqa=True)
            return inputs, fn, lambda o, x: (o[0, :, :lens[0]].transpose(0, 1),
                                             [t[0, :, :lens[0]].transpose(0, 1) for t in x[:3]])
        return make

    def torch_varlen():
        import inspect
        from torch.nn.attention.varlen import varlen_attn  # torch 2.10 and later
        cu = torch.tensor(starts, device=dev, dtype=torch.int32)
        params = inspect.signature(varlen_attn).parameters
        # Its keywords moved between releases: is_causal (2.10), then a
        # window_size whose (-1, 0) is causal, and enable_gqa (2.12).
        mask = ({"is_causal": causal} if "is_causal" in params
                else {"window_size": (-1, 0) if causal else (-1, -1)})
        if "enable_gqa" in params:
            mask["enable_gqa"] = True

        def make():
            def inputs():
                return [rand(total, H, D), rand(total, HKV, D), rand(total, HKV, D)]

            def fn(x):
                return varlen_attn(x[0], x[1], x[2], cu, cu, T, T, **mask)
            return inputs, fn, lambda o, x: (o[:lens[0]], [t[:lens[0]] for t in x[:3]])
        return make

    out = [("sdpa-cudnn-padded", padded(SDPBackend.CUDNN_ATTENTION)),
           ("sdpa-flash-padded", padded(SDPBackend.FLASH_ATTENTION)),
           ("flex-document", None), ("torch-varlen", None)]
    for i, (name, make) in enumerate(out):
        if make is None:
            try:
                out[i] = (name, flex_document() if name == "flex-document" else torch_varlen())
            except Exception as e:
                out[i] = (name, e)
    return out


def reference_error(o0, q0, k0, v0, causal):
    """Relative error of document 0's output (o0, q0: [n, H, d]; k0, v0:
    [n, Hkv, d]) against f32 softmax attention."""
    import torch
    q, k, v = (t.float() for t in (q0, k0, v0))
    k, v = (t.repeat_interleave(H // HKV, dim=1) for t in (k, v))
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
    if causal:
        n = q.shape[0]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    ref = torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), v)
    return ((o0.float() - ref).norm() / ref.norm()).item()


def torch_side(lens, causal, repeats, spin_ahead_us, results, tag):
    import torch
    fl = 4.0 * D * H * kept_pairs(lens, causal)
    for name, make in peers(lens, causal):
        rec = dict(backend=name, case=tag, causal=causal, seqlens=lens)
        try:
            if isinstance(make, Exception):
                raise make
            inputs, fn, first_doc = make()
            sets = [inputs() for _ in range(2)]
            with torch.no_grad():
                o0, x0 = first_doc(fn(sets[0]), sets[0])
                rec["rel_err"] = reference_error(o0, *x0, causal)
            if not rec["rel_err"] < sbs.REF_MAX_REL_ERR:
                raise RuntimeError(f"wrong result: relative error {rec['rel_err']:.2e}")
            queueing = {}
            fwd_ms = sbs.median_ms(fn, sets, repeats, 0, spin_ahead_us, queueing)
            rec.update(fwd_ms=fwd_ms, fwd_tflops=fl / fwd_ms / 1e9,
                       **{"fwd_" + k: v for k, v in queueing.items()})
            grads = []
            for x in sets:
                o = fn(x)
                grads.append((x, o, torch.randn_like(o) + sbs.INPUT_MEAN))

            def bwd(g):
                for t in g[0][:3]:
                    t.grad = None
                g[1].backward(g[2], retain_graph=True)
            queueing = {}
            bwd_ms = sbs.median_ms(bwd, grads, repeats, 0, spin_ahead_us, queueing)
            rec.update(bwd_ms=bwd_ms, bwd_tflops=sbs.BWD_FACTOR * fl / bwd_ms / 1e9,
                       **{"bwd_" + k: v for k, v in queueing.items()})
            del sets, grads
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        results.append(rec)
        print(f"  {name:18s} {tag:45s} fwd {rec.get('fwd_tflops', float('nan')):7.1f} "
              f"bwd {rec.get('bwd_tflops', float('nan')):7.1f} {rec.get('error', '')}",
              flush=True)


def summarise(results, ours):
    """One line per case: each backend's fwd / bwd TFLOP/s, and ours over
    the strongest peer (the equal case: over our own dense kernel too)."""
    lines = []
    for tag in dict.fromkeys(r["case"] for r in results):
        rows = [r for r in results if r["case"] == tag and "error" not in r]
        peers_ = [r for r in rows if r["backend"] not in ours and not r.get("dense")]
        for pass_ in ("fwd", "bwd"):
            key = pass_ + "_tflops"
            best_peer = max((r[key] for r in peers_ if key in r), default=None)
            parts = [f"{r['backend']}{' dense' if r.get('dense') else ''} {r[key]:.1f}"
                     for r in rows if key in r]
            ratios = []
            for r in rows:
                if r["backend"] in ours and not r.get("dense") and key in r:
                    if best_peer:
                        ratios.append(f"{r['backend']}/peer {r[key] / best_peer:.2f}")
                    dense = [x for x in rows if x.get("dense") and x["backend"] == r["backend"]
                             and key in x]
                    if dense:
                        ratios.append(f"{r['backend']}/dense {r[key] / dense[0][key]:.3f}")
            lines.append(f"{tag} {pass_}: " + ", ".join(parts + ratios))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", help="path of gqattn_bench (default: newest build/*/bench/)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--spin-ahead-us", type=int, default=sbs.DEFAULT_SPIN_AHEAD_US)
    ap.add_argument("--ours", default="cuda-hopper,cuda-flash")
    ap.add_argument("--ours-only", action="store_true")
    args = ap.parse_args()
    bench = sbs.find_bench(args.bench)
    ours = [b.strip() for b in args.ours.split(",") if b.strip()]
    results = []
    for name, lens, causal in cases():
        tag = label(name, lens, causal)
        for backend in ours:
            rec = run_ours(bench, lens, causal, backend, args.repeats, args.spin_ahead_us)
            rec.update(backend=backend, case=tag)
            results.append(rec)
            if name == "equal":
                dense = run_ours(bench, lens, causal, backend, args.repeats, args.spin_ahead_us,
                                 dense_batch=True)
                dense.update(backend=backend, case=tag, dense=True)
                results.append(dense)
        if not args.ours_only:
            torch_side(lens, causal, args.repeats, args.spin_ahead_us, results, tag)
    summary = summarise(results, ours)
    print("\n".join(summary))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "varlen.json"), "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "spin_ahead_us": args.spin_ahead_us,
                   "repeats": args.repeats, "gpu": sbs.gpu_identity(), "summary": summary,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
