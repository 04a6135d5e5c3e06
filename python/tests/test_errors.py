"""Bad input through the binding: gqattn.Error (a ValueError) whose message
names the argument and the rule, with .argument set, and nothing written.
Run: pytest python/tests/test_errors.py (after `pip install .`).
"""

import numpy as np
import pytest

import gqattn

B, T, H, HKV, D = 1, 4, 4, 2, 8
SENTINEL = np.float32(3.5)


def arrays(dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, T, H, D)).astype(dtype)
    k = rng.normal(size=(B, T, HKV, D)).astype(dtype)
    v = rng.normal(size=(B, T, HKV, D)).astype(dtype)
    o = np.full((B, T, H, D), SENTINEL, dtype=dtype)
    lse = np.full((B, H, T), SENTINEL, dtype=np.float32)
    return q, k, v, o, lse


def forward_error(match, **changes):
    q, k, v, o, lse = arrays()
    args = dict(q=q, k=k, v=v, o=o, lse=lse)
    opts = {n: changes.pop(n) for n in list(changes) if n not in args}
    args.update(changes)
    with pytest.raises(gqattn.Error, match=match) as info:
        gqattn.forward(args["q"], args["k"], args["v"], args["o"], args["lse"], **opts)
    # Validation runs before anything is written.
    assert np.all(o == SENTINEL) and np.all(lse == SENTINEL)
    return info.value


def test_error_is_a_value_error():
    assert issubclass(gqattn.Error, ValueError)


def test_heads_not_a_multiple():
    e = forward_error(r"H = 4: must be a multiple of Hkv = 3",
                      k=np.zeros((B, T, 3, D), np.float32), v=np.zeros((B, T, 3, D), np.float32))
    assert e.argument == "H = 4"
    assert e.rule.startswith("must be a multiple of Hkv = 3")
    assert str(e) == f"gqattn: {e.argument}: {e.rule}"


def test_v_shape_named():
    e = forward_error(r"v\.shape = \[1, 5, 2, 8\]: must be \[B, Tk, Hkv, d\] = \[1, 4, 2, 8\]",
                      v=np.zeros((B, T + 1, HKV, D), np.float32))
    assert e.argument.startswith("v.shape")


def test_o_shape_named():
    forward_error(r"o\.shape", o=np.zeros((B, T, H, D + 1), np.float32))


def test_lse_shape_and_dtype_named():
    forward_error(r"lse\.shape", lse=np.zeros((B, H, T + 1), np.float32))
    forward_error(r"lse\.dtype = float64: must be float32 \(lse is always f32\)",
                  lse=np.zeros((B, H, T), np.float64))


def test_rank_named():
    forward_error(r"q\.rank = 3: must be 4 \(shape \[B, Tq, H, d\]\)",
                  q=np.zeros((B, T, H * D), np.float32))
    forward_error(r"k\.rank = 5", k=np.zeros((B, T, HKV, D, 1), np.float32))
    forward_error(r"o\.rank = 5", o=np.zeros((B, T, H, D, 1), np.float32))


def test_dtype_named():
    forward_error(r"q\.dtype = int32: must be float32, bfloat16 or float16",
                  q=np.zeros((B, T, H, D), np.int32))
    forward_error(r"q\.dtype = float64: .*oracle", q=np.zeros((B, T, H, D), np.float64))
    # Dtypes the library knows are named as it names them (f16, bf16, f32).
    forward_error(r"k\.dtype = f16: must be f32 \(the dtype of q\)",
                  k=np.zeros((B, T, HKV, D), np.float16))


def test_last_dim_must_be_contiguous():
    q = np.zeros((B, T, H, D * 2), np.float32)[..., ::2]
    forward_error(r"q\.stride\[3\] = 2: the last dimension must be contiguous", q=q)


def test_output_may_not_repeat_elements():
    o = np.broadcast_to(np.zeros((1, 1, H, D), np.float32), (B, T, H, D))
    with pytest.raises((gqattn.Error, TypeError)):
        # numpy marks broadcast views read-only: nanobind may refuse it as an
        # output before the library's stride rule does; either way, refused.
        gqattn.forward(*arrays()[:3], o, None)


def test_problem_options_named():
    forward_error(r"window = -1: must be >= 0", window=-1)
    forward_error(r"softcap = -1.0+: must be finite and >= 0", softcap=-1.0)
    forward_error(r"scale = 0.0+: must be finite and > 0", scale=0.0)


def test_backend_named():
    e = forward_error(r"backend = 'nope': must be one of auto, cpu", backend="nope")
    assert e.argument == "backend = 'nope'"
    forward_error(r"backend: cuda-hopper: ", backend="cuda-hopper")


def test_backward_errors_name_the_gradient():
    q, k, v, o, lse = arrays()
    gqattn.forward(q, k, v, o, lse)
    do = np.ones_like(q)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    with pytest.raises(gqattn.Error, match=r"dk\.shape"):
        gqattn.backward(q, k, v, o, lse, do, dq, np.zeros_like(q), dv)
    with pytest.raises(gqattn.Error, match=r"do\.dtype = f16"):
        gqattn.backward(q, k, v, o, lse, do.astype(np.float16), dq, dk, dv)


def test_oracle_errors():
    q, k, v, _, _ = arrays(np.float64)
    with pytest.raises(gqattn.Error, match=r"v\.shape"):
        gqattn.oracle_forward(q, k, v[:, :2])
    with pytest.raises(gqattn.Error, match=r"H = 4: must be a multiple of Hkv = 3"):
        gqattn.oracle_forward(q, np.zeros((B, T, 3, D)), np.zeros((B, T, 3, D)))
    with pytest.raises(gqattn.Error, match=r"k\.dtype = float32: must be float64"):
        gqattn._ext.oracle_forward(q, k.astype(np.float32), v, np.zeros_like(q),
                                   np.zeros((B, H, T)))


def test_explain_bad_names():
    with pytest.raises(gqattn.Error, match=r"dtype = 'int8'"):
        gqattn.explain(1, 4, 4, 2, 1, 8, dtype="int8")
    with pytest.raises(gqattn.Error, match=r"device = 'tpu'"):
        gqattn.explain(1, 4, 4, 2, 1, 8, device="tpu")
    r = gqattn.explain(1, 4, 4, 3, 2, 8, device="cpu", dtype="float32")
    assert not r["supported"] and "H = 3" in r["reason"]


def test_explain_per_pass():
    # The cpu backend runs both passes; the answer names the pass it was asked about.
    for backward in (False, True):
        r = gqattn.explain(1, 4, 4, 2, 1, 8, device="cpu", dtype="float32", backend="cpu",
                           backward=backward)
        assert r["supported"] and r["chosen"] == "cpu" and r["reason"] == ""
    # A fused backend refuses an unsupported head dim for backward too, saying why.
    r = gqattn.explain(1, 4, 4, 2, 1, 80, device="cuda", backend="cuda-flash", backward=True)
    assert not r["supported"] and "cuda-flash" in r["reason"]
