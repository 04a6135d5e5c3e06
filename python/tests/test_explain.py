"""gqattn.explain: which backend would run a problem, the plan it would run
(a fused backend's tile, score mode, splits, dQ path, workspace) or why not,
without running anything. The plans themselves are checked without a GPU by
tests/cpu/test_*_plan.cpp; here, that the binding carries them and the
determinism flag through.
Run: pytest python/tests/test_explain.py (after `pip install .`).
"""

import gqattn


def test_explain_returns_a_plan_field_for_every_backend():
    for backend in ("auto", "cpu", "cuda-unfused", "cuda-flash", "cuda-hopper"):
        for backward in (False, True):
            for deterministic in (True, False):
                r = gqattn.explain(2, 128, 128, 8, 2, 64, causal=True, dtype="bfloat16",
                                   device="cpu" if backend == "cpu" else "cuda",
                                   backend=backend, backward=backward,
                                   deterministic=deterministic)
                assert set(r) == {"supported", "chosen", "reason", "plan"}
                assert isinstance(r["plan"], str)
                # A plan only where the backend would run; a reason only where not.
                if not r["supported"]:
                    assert r["plan"] == "" and r["reason"]
                else:
                    assert r["reason"] == ""
                    if r["chosen"] in ("cuda-flash", "cuda-hopper"):  # on a GPU machine
                        assert r["plan"].startswith("backward" if backward else "forward")


def test_the_cpu_backend_has_nothing_to_plan():
    r = gqattn.explain(1, 16, 16, 4, 2, 8, dtype="float32", device="cpu", backend="cpu")
    assert r["supported"] and r["chosen"] == "cpu" and r["plan"] == ""
