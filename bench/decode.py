"""Decoding over a KV cache on one GPU, side by side: achieved memory bandwidth (TB/s).

A decoding step reads every cached key and value once and does little
arithmetic on them, so it is timed as bytes moved over time: the K and V
rows the queries keep (sum over the sequences of LENS[b] * Hkv * d * 2
tensors * 2 bytes) plus q and o, over the median time of a call. The same
byte count is every backend's numerator, so a peer that reads padding pays
for it.

What it times, bf16, H = 32 query heads (the grid, cases()):
- decoding (Tq 1, no mask) with GQA 32/8, d128, over a dense cache and
  paged caches of 1, 16 and 256 keys a page, lengths mixed from 512 to
  32768 (seeded uniform) or all 8k or all 32k, B 1, 8, 32, 128;
- d64 and d256 (GQA 32/8), and MQA 32/1 at d64, d128, d256, over a dense
  cache and pages of 1 and 16;
- chunks of Tq 16 and 64 queries, causal (bottom-right: the chunk's last
  query sees every cached key).
Shapes whose dense cache exceeds MAX_CACHE_BYTES are skipped and named in
the JSON ("skipped_shapes").

Ours: gqattn_bench --kv-cache (its caches and timing: bench/gqattn_bench.cpp;
seqlens and the block table on the device, check_offsets = false), one
process per backend for the layouts of a group (a shape without its cache
layout). Peers, in the same run, on the group's sequences:
- PyTorch SDPA with the cuDNN and the flash backends, on a dense cache
  [B, T, Hkv, d] (every paged shape of the group is compared with the same
  dense record: SDPA has no paged cache). Mixed lengths are padded to the
  longest with an additive mask, which the flash backend does not take: it
  is skipped there and the record says why ("skipped"); the cuDNN backend
  gets the mask, and where this torch's cuDNN path refuses it the record
  says so. Causal chunks: the cuDNN backend gets the bottom-right mask,
  the flash backend torch's causal_lower_right bias.
- FlashInfer's paged decode (BatchDecodeWithPagedKVCacheWrapper) on the
  paged decoding shapes, with the same shuffled page pool, where
  `import flashinfer` works; otherwise the JSON says "flashinfer": "not
  installed".
Each peer's output is spot-checked against an f32 reference on the first
and last sequence before it is timed. Peers are timed with
side_by_side.py's method (rotated copies beyond the L2, warm-up, each call
alone behind a GPU spin, median).

The project's goal: at least GOAL_TBPS on every decoding shape (Tq 1) with
at least GOAL_MIN_KEYS keys in every sequence and a dense cache or pages of
at least GOAL_MIN_PAGE keys, on the H200; one-key pages at least
ONE_KEY_PAGE_SHARE of that. The table says for each such shape whether
each of ours meets it (on another GPU the verdict is against the H200's
goal all the same).

usage: python bench/decode.py [--bench PATH] [--out DIR] [--repeats N]
                              [--spin-ahead-us N] [--ours cuda-hopper,cuda-flash]
                              [--ours-only] [--batch-invariant] [--quick] [--match WORDS]

--match keeps the shapes whose label (as printed, e.g. "Tq1 B8 32k H32/8
d128 p16") holds every word of WORDS as one of its words: "p1" is the
one-key pages, not p16. --quick times a handful of shapes. Stopped early
(SIGTERM, as `timeout` sends), it writes what it measured with
"partial": true and exits 3, as side_by_side.py does.
The whole grid, cuda-flash and the SDPA peers, ran in about 1.5 minutes
on an H100 (2026-12-05; FlashInfer not installed there).
Writes DIR/decode.json. Its host-side logic is checked by
bench/tests/test_bench_decode.py; the timing by running it on the GPU
machine (scripts/h200-cycle decode).
"""
import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402

H = 32
ELEM_BYTES = 2  # bf16
MIN_LEN, MAX_LEN = 512, 32768  # the mixed lengths' range
MIXED_SEED = 20261205
EQUAL = {"8k": 8192, "32k": 32768}
LENGTHS = ("mixed", "8k", "32k")
PAGES = (0, 1, 16, 256)  # 0: a dense cache
BATCHES = (1, 8, 32, 128)
MAX_CACHE_BYTES = 40e9
# As gqattn_bench's kDenseCacheRound and kMaxKvSets.
DENSE_CACHE_ROUND = 256
MAX_KV_SETS = 256
PEER_PAD = 8  # mixed lengths padded to the longest rounded up to this (mask rows aligned)
DEFAULT_REPEATS = 30

GOAL_TBPS = 3.8
ONE_KEY_PAGE_SHARE = 0.7
GOAL_MIN_KEYS = 8192
GOAL_MIN_PAGE = 16

FLASHINFER_WORKSPACE_BYTES = 256 << 20

Case = namedtuple("Case", "tq B lengths hkv d page")


def causal(case):
    """Decoding steps have no mask (for Tq 1 causal is the same); chunks are causal."""
    return case.tq > 1


def lens_of(lengths, B):
    """The cached keys of B sequences: "mixed" seeded uniform in [MIN_LEN,
    MAX_LEN] (the same for every shape of that B), else all equal."""
    if lengths == "mixed":
        rng = random.Random(MIXED_SEED + B)
        return [rng.randint(MIN_LEN, MAX_LEN) for _ in range(B)]
    return [EQUAL[lengths]] * B


def group(case):
    """The shape without its cache layout: what the SDPA peers run."""
    c = " c1" if causal(case) else ""
    return f"Tq{case.tq} B{case.B} {case.lengths} H{H}/{case.hkv} d{case.d}{c}"


def label(case):
    return group(case) + (f" p{case.page}" if case.page else " dense")


def round_up(n, m):
    return -(-n // m) * m


def cache_bytes(case):
    """K and V of the dense cache of the shape (the largest layout of its
    group: the paged pool and the peers' padded cache are no larger)."""
    capacity = round_up(max(lens_of(case.lengths, case.B)), DENSE_CACHE_ROUND)
    return case.B * capacity * case.hkv * case.d * 2 * ELEM_BYTES


def keys_read(n, tq, window=0):
    """Cached keys some query of a sequence of n keys keeps (gqattn_bench's
    kv_keys_read): all but those left of the first query's window."""
    if window <= 0 or window >= n:  # Problem::effective_window()
        return n
    return n - max(0, n - tq - window + 1)


def bytes_moved(lens, tq, hkv, d, window=0):
    """What a call must move: the K and V rows kept, q and o (gqattn_bench's
    "bytes")."""
    kv = sum(keys_read(n, tq, window) for n in lens) * hkv * d * 2 * ELEM_BYTES
    return kv + 2 * len(lens) * tq * H * d * ELEM_BYTES


def all_cases():
    """Every shape of the grid, in run order (shapes of a group together),
    before the cache-size filter."""
    out = []

    def add(tqs, pages, lengths, batches, hkvs, ds):
        for tq in tqs:
            for hkv in hkvs:
                for d in ds:
                    for kind in lengths:
                        for B in batches:
                            for page in pages:
                                case = Case(tq, B, kind, hkv, d, page)
                                if case not in out:
                                    out.append(case)
    # Decoding, GQA 32/8 d128: every layout, length mix and batch.
    add([1], PAGES, LENGTHS, BATCHES, [8], [128])
    # The other head dims, and MQA at every head dim: dense, one-key and
    # 16-key pages (the layouts the goal names), mixed and long lengths.
    add([1], (0, 1, 16), ("mixed", "32k"), (8, 128), [8], [64, 256])
    add([1], (0, 1, 16), ("mixed", "32k"), (32, 128), [1], [64, 128, 256])
    # Chunks of queries, causal.
    add([16, 64], (0, 1, 16), ("mixed", "8k"), (8, 32), [8], [128])
    return out


QUICK = [Case(1, 8, "8k", 8, 128, 0), Case(1, 8, "8k", 8, 128, 1), Case(1, 8, "8k", 8, 128, 16),
         Case(1, 8, "8k", 8, 128, 256), Case(1, 128, "mixed", 8, 128, 16),
         Case(1, 32, "32k", 1, 128, 16), Case(16, 8, "8k", 8, 128, 16)]


def matches(case, words):
    """Whether every word of `words` is one of the label's words."""
    have = set(label(case).split())
    return all(w in have for w in words.split())


def cases(quick=False, match=""):
    """(the shapes to time, the skipped ones as (label, cache bytes))."""
    chosen = [c for c in (QUICK if quick else all_cases()) if matches(c, match)]
    kept = [c for c in chosen if cache_bytes(c) <= MAX_CACHE_BYTES]
    skipped = [(label(c), cache_bytes(c)) for c in chosen if cache_bytes(c) > MAX_CACHE_BYTES]
    return kept, skipped


def groups(shapes):
    """The shapes by group, in order of first appearance."""
    out = {}
    for c in shapes:
        out.setdefault(group(c), []).append(c)
    return list(out.values())


def kv_spec(case):
    """gqattn_bench's --kv-cache LENS,Tq,H,Hkv,d,page,causal,window,softcap."""
    lens = "/".join(map(str, lens_of(case.lengths, case.B)))
    return f"{lens},{case.tq},{H},{case.hkv},{case.d},{case.page},{int(causal(case))},0,0"


def ours_command(bench, shapes, backend, repeats, spin_ahead_us, batch_invariant=False):
    cmd = [bench]
    for c in shapes:
        cmd += ["--kv-cache", kv_spec(c)]
    cmd += ["--backend", backend, "--no-backward", "--repeats", str(repeats), "--warmup",
            str(sbs.WARMUP)]
    if spin_ahead_us > 0:
        cmd += ["--spin-ahead-us", str(spin_ahead_us)]
    if batch_invariant:
        cmd.append("--batch-invariant")
    return cmd


def run_ours(bench, shapes, backend, repeats, spin_ahead_us, batch_invariant=False):
    """gqattn_bench on `shapes` in one process: one record per shape, its
    JSON line (printed in the order of the shapes), or {"error": ...} for
    a shape it printed none for (the process failed before it)."""
    cmd = ours_command(bench, shapes, backend, repeats, spin_ahead_us, batch_invariant)
    lines, failure = [], "no line from gqattn_bench"
    try:
        run = subprocess.run(cmd, capture_output=True, text=True)
        for text in run.stdout.splitlines():
            if text.startswith("{"):
                lines.append(json.loads(text))
        if run.returncode != 0:
            failure = f"exit {run.returncode}: {run.stderr.strip()[-200:]}"
    except Exception as e:  # report, keep going
        failure = f"{type(e).__name__}: {e}"[:200]
    out = []
    for i, c in enumerate(shapes):
        rec = lines[i] if i < len(lines) else {"error": failure}
        rec.update(backend=backend, shape=label(c), group=group(c))
        out.append(rec)
    return out


def goal_tbps(case):
    """The goal's TB/s for a shape, None where the goal says nothing."""
    if case.tq != 1 or min(lens_of(case.lengths, case.B)) < GOAL_MIN_KEYS:
        return None
    if case.page == 1:
        return ONE_KEY_PAGE_SHARE * GOAL_TBPS
    if case.page == 0 or case.page >= GOAL_MIN_PAGE:
        return GOAL_TBPS
    return None


def peer_tbps(rows, case, ours):
    """backend -> TB/s of the peers that measured the shape: SDPA's
    records of its group, FlashInfer's of the shape itself."""
    out = {}
    for r in rows:
        if r["backend"] in ours or "tbps" not in r:
            continue
        if r.get("shape") == label(case) or (r.get("shape") is None
                                             and r.get("group") == group(case)):
            out[r["backend"]] = r["tbps"]
    return out


def summarise(shapes, results, ours):
    """One row per shape: each backend's TB/s, each of ours over the
    strongest peer, and against the goal where it applies."""
    table = []
    for c in shapes:
        mine = {r["backend"]: r["tbps"] for r in results
                if r["backend"] in ours and r.get("shape") == label(c) and "tbps" in r}
        peers = peer_tbps(results, c, ours)
        best = max(peers.values(), default=None)
        target = goal_tbps(c)
        table.append(dict(
            shape=label(c), bytes=bytes_moved(lens_of(c.lengths, c.B), c.tq, c.hkv, c.d),
            tbps={**mine, **peers},
            ratio={b: mine[b] / best for b in mine} if best else {},
            best_peer=max(peers, key=peers.get) if peers else None,
            goal_tbps=target,
            meets={b: mine[b] >= target for b in mine} if target is not None else {}))
    return table


def goal_lines(table, ours):
    """Per backend of ours: the applicable shapes it meets the goal on, and
    those it misses (no number counts as a miss)."""
    lines = []
    applicable = [row for row in table if row["goal_tbps"] is not None]
    for b in ours:
        missed = [row["shape"] for row in applicable if not row["meets"].get(b, False)]
        lines.append(f"goal {b}: {len(applicable) - len(missed)} of {len(applicable)} "
                     f"applicable shapes meet it" +
                     (f"; misses: {', '.join(missed[:12])}" + (" ..." if len(missed) > 12 else "")
                      if missed else ""))
    return lines


def print_table(table, results, ours):
    names = list(ours) + [n for n in dict.fromkeys(r["backend"] for r in results)
                          if n not in ours]
    print(f"\nTB/s (bytes moved over the median time; goal {GOAL_TBPS} TB/s on decoding with "
          f">= {GOAL_MIN_KEYS} keys, dense or pages >= {GOAL_MIN_PAGE}; one-key pages "
          f"{ONE_KEY_PAGE_SHARE:.0%} of it; stated for the H200)")
    print(f"{'shape':36s} {'MB':>8s}" + "".join(f"{n:>13s}" for n in names) +
          "  ours/peer  goal: " + " ".join(ours))
    for row in table:
        cells = "".join(f"{row['tbps'][n]:13.2f}" if n in row["tbps"] else f"{'-':>13s}"
                        for n in names)
        best_ours = max((row["tbps"][b] for b in ours if b in row["tbps"]), default=None)
        best_peer = row["tbps"].get(row["best_peer"]) if row["best_peer"] else None
        ratio = f"{best_ours / best_peer:9.2f}" if best_ours and best_peer else f"{'-':>9s}"
        goal = ""
        if row["goal_tbps"] is not None:
            goal = f">={row['goal_tbps']:.2f} " + " ".join(
                ("ok" if row["meets"][b] else "MISS") if b in row["meets"] else "-"
                for b in ours)
        print(f"{row['shape']:36s} {row['bytes'] / 1e6:8.1f}{cells}  {ratio}  {goal}")
    reasons = {}
    for r in results:
        why = r.get("skipped") or r.get("error")
        if why and r["backend"] not in ours:
            reasons.setdefault((r["backend"], why), []).append(r.get("shape") or r.get("group"))
    for (backend, why), where in reasons.items():
        print(f"note: {backend} not timed on {len(where)} ({where[0]}, ...): {why}")


def flashinfer_status():
    """(what the JSON says, the module or None)."""
    try:
        import flashinfer
    except ImportError:
        return "not installed", None
    except Exception as e:  # an install that fails to load
        return f"import failed: {type(e).__name__}: {e}"[:200], None
    return f"flashinfer {getattr(flashinfer, '__version__', '?')}", flashinfer


def rotation_sets(set_bytes):
    """Copies of a peer's inputs, as gqattn_bench's rule: together beyond
    sbs.ROTATE_BYTES, at most MAX_KV_SETS."""
    return max(1, min(MAX_KV_SETS, -(-sbs.ROTATE_BYTES // set_bytes)))


def rel_err(o, q, k, v, is_causal):
    """Relative error of one sequence's output o [Tq, H, d] against an f32
    reference over its keys k, v [n, Hkv, d] (the queries at the end)."""
    import torch
    tq, n = q.shape[0], k.shape[0]
    rep = q.shape[1] // k.shape[1]
    qs, ks, vs = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = torch.einsum("ihd,jhd->hij", qs, ks) / math.sqrt(q.shape[2])
    if is_causal:
        i = torch.arange(tq, device=s.device)[:, None]
        j = torch.arange(n, device=s.device)[None, :]
        s = s.masked_fill(j > n - tq + i, -math.inf)
    ref = torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), vs)
    return ((o.float() - ref).norm() / ref.norm()).item()


def rand(*shape):
    """bf16 N(INPUT_MEAN, 1), without a second full-size temporary."""
    import torch
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).add_(sbs.INPUT_MEAN)


def time_peer(rec, fn, sets, check, repeats, spin_ahead_us):
    """Spot-checks fn on sets[0] (check(o, inputs) -> relative error), then
    times it: rec gets rel_err, fwd_ms, tbps and the queueing."""
    import torch
    with torch.no_grad():
        rec["rel_err"] = check(fn(sets[0]), sets[0])
    if not rec["rel_err"] < sbs.REF_MAX_REL_ERR:
        raise RuntimeError(f"wrong result: relative error {rec['rel_err']:.2e}")
    queueing = {}
    with torch.no_grad():
        ms = sbs.median_ms(fn, sets, repeats, 0, spin_ahead_us, queueing)
    rec.update(fwd_ms=ms, tbps=rec["bytes"] / ms / 1e9,
               **{"fwd_" + k: v for k, v in queueing.items()})


def sdpa_records(case, repeats, spin_ahead_us):
    """SDPA's cuDNN and flash backends on the group of `case`, over a dense
    cache [B, T, Hkv, d]: T the length (equal lengths) or the longest
    rounded up to PEER_PAD with an additive mask (mixed)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    lens = lens_of(case.lengths, case.B)
    mixed, is_causal = len(set(lens)) > 1, causal(case)
    T = round_up(max(lens), PEER_PAD) if mixed else lens[0]
    base = dict(group=group(case), shape=None, tq=case.tq, B=case.B, hkv=case.hkv, d=case.d,
                causal=is_causal, padded_to=T, layout="dense" + (" padded" if mixed else ""),
                bytes=bytes_moved(lens, case.tq, case.hkv, case.d), spin_ahead_us=spin_ahead_us)
    set_bytes = 2 * (2 * case.B * case.tq * H * case.d + 2 * case.B * T * case.hkv * case.d)
    out = []
    sets, mask = [], None
    try:
        for _ in range(rotation_sets(set_bytes)):
            sets.append((rand(case.B, case.tq, H, case.d), rand(case.B, T, case.hkv, case.d),
                         rand(case.B, T, case.hkv, case.d)))
        if mixed or is_causal:
            # keep[b, i, j]: key j is one of sequence b's and (causal) at or
            # left of query i's position, len_b - Tq + i.
            n = torch.tensor(lens, device="cuda")[:, None, None, None]
            i = torch.arange(case.tq, device="cuda")[None, None, :, None]
            j = torch.arange(T, device="cuda")[None, None, None, :]
            keep = (j < n) & ((j <= n - case.tq + i) if is_causal else True)
            mask = torch.zeros(keep.shape, device="cuda", dtype=torch.bfloat16)
            mask.masked_fill_(~keep, -math.inf)
            del keep
    except Exception as e:
        return [dict(base, backend=b, error=f"{type(e).__name__}: {e}"[:200])
                for b in ("sdpa-cudnn", "sdpa-flash")]

    def with_mask(backend, attn_mask):
        def f(q, k, v):
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask,
                                                   enable_gqa=kt.shape[1] != qt.shape[1])
            return o.transpose(1, 2)
        return f

    def check(o, x):
        return max(rel_err(o[b], x[0][b], x[1][b, :lens[b]], x[2][b, :lens[b]], is_causal)
                   for b in sorted({0, case.B - 1}))

    for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        rec = dict(base, backend=name)
        if name == "sdpa-flash" and mixed:
            rec["skipped"] = ("SDPA's flash backend takes no attn_mask: mixed lengths padded to "
                              "the longest need one")
        elif name == "sdpa-cudnn" and mask is not None:
            rec["mask"] = "additive [B, 1, Tq, T]"
            f = with_mask(backend, mask)
        elif mask is not None:  # flash, equal lengths, causal
            rec["mask"] = "causal_lower_right"
            f = with_mask(backend, causal_lower_right(case.tq, T))
        else:
            f = sbs.sdpa(backend, False)
        if "skipped" not in rec:
            try:
                time_peer(rec, lambda x: f(*x), sets, check, repeats, spin_ahead_us)
            except Exception as e:  # report, keep going
                why = f"{type(e).__name__}: {e}"[:200]
                if "mask" in rec and "wrong result" not in why:
                    rec["skipped"] = f"refused the {rec['mask']} mask: {why}"
                else:
                    rec["error"] = why
        out.append(rec)
        torch.cuda.synchronize()
    del sets, mask
    torch.cuda.empty_cache()
    return out


def flashinfer_records(flashinfer, shapes, repeats, spin_ahead_us):
    """FlashInfer's paged decode on the paged decoding shapes of a group:
    the pool of exactly the pages used, shuffled, as gqattn_bench's."""
    import torch
    out = []
    for case in shapes:
        if case.page == 0 or case.tq != 1:
            continue
        lens = lens_of(case.lengths, case.B)
        rec = dict(backend="flashinfer", group=group(case), shape=label(case), tq=case.tq,
                   B=case.B, hkv=case.hkv, d=case.d, page=case.page,
                   bytes=bytes_moved(lens, case.tq, case.hkv, case.d),
                   spin_ahead_us=spin_ahead_us)
        try:
            counts = [-(-n // case.page) for n in lens]
            num_pages = sum(counts)
            order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(MIXED_SEED))
            indices = order.to(device="cuda", dtype=torch.int32)
            indptr = torch.tensor([0] + [sum(counts[:b + 1]) for b in range(case.B)],
                                  device="cuda", dtype=torch.int32)
            last = torch.tensor([(n - 1) % case.page + 1 for n in lens], device="cuda",
                                dtype=torch.int32)
            pool = (num_pages, case.page, case.hkv, case.d)
            set_bytes = 2 * (2 * case.B * H * case.d + 2 * math.prod(pool))
            sets = [(rand(case.B, H, case.d), rand(*pool), rand(*pool))
                    for _ in range(rotation_sets(set_bytes))]
            workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
            # Its CUDA-core decode takes groups up to 8; larger ones need
            # the tensor-core path.
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=H // case.hkv > 8)
            plan = getattr(wrapper, "plan", None) or wrapper.begin_forward
            args = (indptr, indices, last, H, case.hkv, case.d, case.page)
            try:
                plan(*args, pos_encoding_mode="NONE", q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16)
            except TypeError:  # releases before q_data_type
                plan(*args, pos_encoding_mode="NONE", data_type=torch.bfloat16)
            run = getattr(wrapper, "run", None) or wrapper.forward

            def pages_of(tensor, b):
                ids = indices[indptr[b]:indptr[b + 1]].long()
                return tensor[ids].reshape(-1, case.hkv, case.d)[:lens[b]]

            def check(o, x):
                return max(rel_err(o[b][None], x[0][b][None], pages_of(x[1], b),
                                   pages_of(x[2], b), False)
                           for b in sorted({0, case.B - 1}))
            time_peer(rec, lambda x: run(x[0], (x[1], x[2])), sets, check, repeats,
                      spin_ahead_us)
            del sets, workspace
        except Exception as e:  # report, keep going
            rec["error"] = f"{type(e).__name__}: {e}"[:200]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        out.append(rec)
    return out


def progress_line(rec):
    tbps = rec.get("tbps")
    what = f"{tbps:6.2f} TB/s" if tbps is not None else (rec.get("skipped") or
                                                          rec.get("error", ""))[:90]
    return f"  {rec['backend']:12s} {rec.get('shape') or rec['group']:38s} {what}"


def document(args, ours, shapes, skipped, results, table, summary, extra):
    """decode.json's content."""
    return dict(when=time.strftime("%Y-%m-%d %H:%M:%S"), repeats=args.repeats,
                spin_ahead_us=args.spin_ahead_us, ours=ours,
                batch_invariant=args.batch_invariant, quick=args.quick, match=args.match,
                goal=dict(tbps=GOAL_TBPS, one_key_page_share=ONE_KEY_PAGE_SHARE,
                          min_keys=GOAL_MIN_KEYS, min_page=GOAL_MIN_PAGE, gpu="H200"),
                max_cache_bytes=MAX_CACHE_BYTES, shapes=[label(c) for c in shapes],
                skipped_shapes=[dict(shape=s, cache_bytes=b) for s, b in skipped],
                results=results, table=table, summary=summary, **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="path of gqattn_bench (default: newest build/*/bench/)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--spin-ahead-us", type=int, default=sbs.DEFAULT_SPIN_AHEAD_US, metavar="N",
                    help="GPU spin queued ahead of every timed call (0: none)")
    ap.add_argument("--ours", default="cuda-hopper,cuda-flash")
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="time ours with Options::batch_invariant = true")
    ap.add_argument("--quick", action="store_true", help="a handful of shapes")
    ap.add_argument("--match", default="",
                    help="only the shapes whose label holds every one of these words")
    args = ap.parse_args()
    if args.spin_ahead_us < 0:
        ap.error("--spin-ahead-us must not be negative")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    ours = [b.strip() for b in args.ours.split(",") if b.strip()]
    shapes, skipped = cases(args.quick, args.match)
    if not shapes:
        ap.error(f"--match {args.match!r}: no shape's label holds those words")
    bench = sbs.find_bench(args.bench)
    if bench is None:
        raise SystemExit("no gqattn_bench found: build first or pass --bench")
    extra = dict(gpu=sbs.gpu_identity(), flashinfer=None, torch=None)
    flashinfer = None
    if not args.ours_only:
        import torch
        extra["torch"] = torch.__version__
        extra["flashinfer"], flashinfer = flashinfer_status()
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, "
              f"{extra['flashinfer']}", flush=True)
    for name, size in skipped:
        print(f"skipped {name}: its cache takes {size / 1e9:.1f} GB", flush=True)
    results, stopped, at = [], False, None
    previous_term = signal.signal(signal.SIGTERM, sbs.stop_early)
    try:
        for members in groups(shapes):
            at = group(members[0])
            for backend in ours:
                for rec in run_ours(bench, members, backend, args.repeats, args.spin_ahead_us,
                                    args.batch_invariant):
                    results.append(rec)
                    print(progress_line(rec), flush=True)
            if args.ours_only:
                continue
            peers = sdpa_records(members[0], args.repeats, args.spin_ahead_us)
            if flashinfer is not None:
                peers += flashinfer_records(flashinfer, members, args.repeats,
                                            args.spin_ahead_us)
            for rec in peers:
                results.append(rec)
                print(progress_line(rec), flush=True)
    except (sbs.StoppedEarly, KeyboardInterrupt):
        stopped = True
        print(f"\nstopped early at {at}: the table and the JSON hold what was measured",
              file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    table = summarise(shapes, results, ours)
    print_table(table, results, ours)
    summary = goal_lines(table, ours)
    print("\n".join(summary))
    sbs.print_spin_short([dict(r, shape=r.get("shape") or r["group"]) for r in results])
    extra.update(partial=stopped, stopped_at=at if stopped else None)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode.json")
    with open(path, "w") as f:
        json.dump(document(args, ours, shapes, skipped, results, table, summary, extra), f,
                  indent=1)
    print(f"\nwrote {path}" + (" (partial)" if stopped else ""))
    if stopped:
        sys.exit(sbs.EXIT_STOPPED_EARLY)


if __name__ == "__main__":
    main()
