"""gqattn.distributed: context parallelism over torch.distributed's gloo
backend on the CPU, 2 and 4 processes: both layouts and both methods,
causal, window, softcap and GQA, forward and backward against the
single-process result of gqattn.torch.attention (f32), bitwise-equal
repeated runs, shard/unshard round trips, and the errors of bad shards.
Skipped when torch is not installed.
Run: pytest python/tests/test_distributed.py (after `pip install .`).
"""

import os
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REL_TOL = 2e-5  # f32; partial results merged by lse in f32

CASES = [
    # (name, causal, window, softcap, H, Hkv)
    ("causal_gqa", True, 0, 0.0, 4, 2),
    ("noncausal_mqa", False, 0, 0.0, 4, 1),
    ("causal_window_softcap", True, 5, 3.0, 2, 2),
    ("window_only", False, 7, 0.0, 4, 2),
]


def _rel_err(x, ref):
    scale = ref.abs().max().item()
    return (x - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def _worker(rank, world, path, results):
    try:
        import gqattn.distributed as gd
        import gqattn.torch as gt
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                                world_size=world)
        torch.manual_seed(0)  # the same full sequence on every rank
        B, T, d = 1, 8 * world, 8
        out = {}
        for name, causal, window, softcap, H, Hkv in CASES:
            q = torch.randn(B, T, H, d) + 0.5
            k = torch.randn(B, T, Hkv, d)
            v = torch.randn(B, T, Hkv, d) + 0.5
            do = torch.randn(B, T, H, d)
            ref_q, ref_k, ref_v = (x.clone().requires_grad_() for x in (q, k, v))
            ref_o = gt.attention(ref_q, ref_k, ref_v, causal=causal, window=window,
                                 softcap=softcap)
            ref_o.backward(do)
            for layout in ("contiguous", "load_balanced"):
                for method in ("all_gather", "ring"):
                    runs = []
                    for _ in range(2):
                        sq, sk, sv = (gd.shard(x, layout=layout).clone().requires_grad_()
                                      for x in (q, k, v))
                        o = gd.context_parallel_attention(sq, sk, sv, causal=causal,
                                                          window=window, softcap=softcap,
                                                          layout=layout, method=method)
                        o.backward(gd.shard(do, layout=layout))
                        runs.append((o.detach(), sq.grad, sk.grad, sv.grad))
                    key = f"{name}/{layout}/{method}"
                    got, again = runs
                    refs = [gd.shard(x, layout=layout)
                            for x in (ref_o.detach(), ref_q.grad, ref_k.grad, ref_v.grad)]
                    out[key] = {
                        "errors": [_rel_err(g, r) for g, r in zip(got, refs)],
                        "bitwise_repeat": all(torch.equal(a, b) for a, b in zip(got, again)),
                        "unshard_roundtrip": torch.equal(gd.unshard(gd.shard(q, layout=layout),
                                                                    layout=layout), q),
                    }
        # A shard of another length on one rank is refused on every rank.
        q = torch.randn(1, 4 + (2 if rank == 0 else 0), 2, 8)
        try:
            gd.context_parallel_attention(q, q[:, :, :1], q[:, :, :1])
            out["unequal_shards"] = "no error"
        except gqattn_error() as e:
            out["unequal_shards"] = str(e)
        results[rank] = out
        dist.destroy_process_group()
    except Exception:
        results[rank] = {"exception": traceback.format_exc()}


def gqattn_error():
    import gqattn
    return gqattn.Error


def _run(world):
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), results), nprocs=world)
        return dict(results)


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def world_results(request):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return request.param, _run(request.param)


def test_every_rank_matches_single_process(world_results):
    world, results = world_results
    for rank in range(world):
        out = results[rank]
        assert "exception" not in out, out.get("exception")
        for key, r in out.items():
            if key == "unequal_shards":
                continue
            for what, err in zip(("o", "dq", "dk", "dv"), r["errors"]):
                assert err < REL_TOL, f"rank {rank} {key} {what}: {err}"


def test_repeated_runs_are_bitwise_equal(world_results):
    world, results = world_results
    for rank in range(world):
        for key, r in results[rank].items():
            if key in ("unequal_shards", "exception"):
                continue
            assert r["bitwise_repeat"], f"rank {rank} {key}"
            assert r["unshard_roundtrip"], f"rank {rank} {key}"


def test_unequal_shards_are_refused(world_results):
    world, results = world_results
    for rank in range(world):
        assert "same length" in results[rank]["unequal_shards"], results[rank]["unequal_shards"]
