"""The host-side logic of bench/varlen.py, without a GPU: the batches it
times, its FLOP count, the command it gives gqattn_bench and its summary's
ratios. The timing is checked by running the script on the GPU machine."""
import json
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import side_by_side as sbs  # noqa: E402
import varlen  # noqa: E402


def test_batches_hold_the_tokens_they_claim():
    for name, lens, causal in varlen.cases():
        assert all(n > 0 for n in lens)
        if name in ("equal", "mixed"):
            assert sum(lens) == varlen.TOTAL_TOKENS and len(lens) == 16
    assert min(varlen.MIXED) == 128 and max(varlen.MIXED) == 8192
    short = varlen.mixed_lengths(n=128, lo=64, hi=1000, total=64000, seed=11)
    assert sum(short) == 64000 and 64 <= min(short) and max(short) <= 1000
    assert short == varlen.mixed_lengths(n=128, lo=64, hi=1000, total=64000, seed=11)


def test_pairs_are_the_documents_own():
    lens = [1, 7, 130]
    for causal in (True, False):
        assert varlen.kept_pairs(lens, causal) == sum(sbs.kept_pairs(n, n, causal, 0)
                                                      for n in lens)


def test_gqattn_bench_gets_the_packed_lengths(monkeypatch):
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout=json.dumps({"fwd_ms": 1.0}) + "\n")
    monkeypatch.setattr(sbs.subprocess, "run", fake_run)
    assert varlen.run_ours("b", [5, 9], True, "cuda-hopper", 10, 2000) == {"fwd_ms": 1.0}
    assert seen[-1][1:3] == ["--varlen", "5/9,32,8,128,1,0,0"]
    assert seen[-1][-2:] == ["--spin-ahead-us", "2000"]
    varlen.run_ours("b", [64, 64], False, "cuda-flash", 10, 0, dense_batch=True)
    assert seen[-1][1:3] == ["--shape", "2,64,64,32,8,128,0,0,0"]
    assert "--spin-ahead-us" not in seen[-1]


def test_summary_ratios_to_the_best_peer_and_to_dense():
    results = [
        {"case": "c", "backend": "cuda-hopper", "fwd_tflops": 500.0},
        {"case": "c", "backend": "cuda-hopper", "dense": True, "fwd_tflops": 520.0},
        {"case": "c", "backend": "flex-document", "fwd_tflops": 250.0},
        {"case": "c", "backend": "sdpa-cudnn-padded", "fwd_tflops": 400.0},
        {"case": "c", "backend": "torch-varlen", "error": "absent"},
    ]
    lines = varlen.summarise(results, ["cuda-hopper"])
    fwd = next(x for x in lines if x.startswith("c fwd"))
    assert "cuda-hopper/peer 1.25" in fwd and "cuda-hopper/dense 0.962" in fwd
    assert "torch-varlen" not in fwd
