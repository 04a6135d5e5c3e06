"""Input safety through the Python binding: the oracle checks k's B and d, a
read-only output is refused in gqattn's words, outputs may not alias inputs,
sys.maxsize as a window means no window, and num_threads reaches the CPU
backend. Outputs start as NaN; inputs are fresh random values.
"""

import sys

import numpy as np
import pytest

import gqattn

B, T, H, HKV, D = 2, 6, 4, 2, 8


def arrays(seed=0, Tq=T, Tk=T):
    rng = np.random.default_rng(seed)
    q = rng.normal(0.3, 1.0, (B, Tq, H, D)).astype(np.float32)
    k = rng.normal(0.3, 1.0, (B, Tk, HKV, D)).astype(np.float32)
    v = rng.normal(0.3, 1.0, (B, Tk, HKV, D)).astype(np.float32)
    return q, k, v


def nan_like(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


# Item 3: a k of the same element count but another B and d was reinterpreted.
def test_oracle_checks_k_batch_and_head_dim():
    q, v = np.ones((2, 3, 1, 4)), np.ones((2, 3, 1, 4))
    with pytest.raises(gqattn.Error, match=r"k\.shape = \[4, 3, 1, 2\]: must be \[B, Tk, Hkv, d\]"):
        gqattn.oracle_forward(q, np.ones((4, 3, 1, 2)), v)
    with pytest.raises(gqattn.Error, match=r"k\.shape"):
        gqattn.oracle_backward(q, np.ones((4, 3, 1, 2)), v, np.ones((2, 3, 1, 4)))


def test_read_only_output_is_named():
    q, k, v = arrays(1)
    o = nan_like(q.shape)
    o.flags.writeable = False
    with pytest.raises(gqattn.Error, match=r"o: is read-only: an output must be a writable array"):
        gqattn.forward(q, k, v, o, None)
    o2 = nan_like(q.shape)
    lse = nan_like((B, H, T))
    lse.flags.writeable = False
    with pytest.raises(gqattn.Error, match=r"lse: is read-only"):
        gqattn.forward(q, k, v, o2, lse)
    assert np.isnan(o2).all()
    with pytest.raises(TypeError, match=r"o: must be an array"):
        gqattn.forward(q, k, v, "not an array", None)


def test_output_aliasing_an_input_is_refused():
    q, k, v = arrays(2)
    o, lse = nan_like(q.shape), nan_like((B, H, T))
    gqattn.forward(q, k, v, o, lse)
    do = np.random.default_rng(3).normal(size=q.shape).astype(np.float32)
    dk, dv = nan_like(k.shape), nan_like(v.shape)
    q_before = q.copy()
    with pytest.raises(gqattn.Error, match=r"dq: must not overlap q"):
        gqattn.backward(q, k, v, o, lse, do, q, dk, dv)
    with pytest.raises(gqattn.Error, match=r"dq: must not overlap do"):
        gqattn.backward(q, k, v, o, lse, do, do, dk, dv)
    assert np.array_equal(q, q_before) and np.isnan(dk).all() and np.isnan(dv).all()
    o_bad = nan_like((B, T, H, D))
    o_view = np.lib.stride_tricks.as_strided(o_bad, strides=(T * H * D * 4, H * D * 4, 4, 4))
    with pytest.raises(gqattn.Error, match=r"must not overlap each other"):
        gqattn.forward(q, k, v, o_view, None)


# Item 1: Python's sys.maxsize is a natural "no window".
@pytest.mark.parametrize("causal", [False, True])
def test_sys_maxsize_window_is_no_window(causal):
    q, k, v = arrays(4, Tq=8, Tk=4)
    outs = []
    for window in (0, sys.maxsize):
        o, lse = nan_like(q.shape), nan_like((B, H, 8))
        gqattn.forward(q, k, v, o, lse, causal=causal, window=window, backend="cpu")
        outs.append((o, lse))
        ro, rlse = gqattn.oracle_forward(q, k, v, causal=causal, window=window)
        assert np.array_equal(np.isinf(rlse), np.isinf(lse))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    if not causal:
        assert np.isfinite(outs[1][1]).all()


def test_num_threads_changes_no_bit():
    q, k, v = arrays(5)
    results = []
    for threads in (1, 2, 3, 0):
        o, lse = nan_like(q.shape), nan_like((B, H, T))
        gqattn.forward(q, k, v, o, lse, causal=True, window=3, num_threads=threads)
        results.append(o)
    for o in results[1:]:
        assert np.array_equal(o, results[0])
