"""The low-level varlen binding (gqattn.forward_varlen / backward_varlen) on
numpy arrays (the CPU backend), against the tests' own f64 reference
(reference.py) run sequence by sequence; and the offsets' errors. Needs only
numpy (the torch-level tests are in test_varlen.py).
Run: pytest python/tests/test_numpy_varlen.py (after `pip install .`).
"""

import numpy as np
import pytest

import gqattn
import reference as ref

F32_TOL = 1e-5


def err(x, want):
    # rel_error, or the absolute error where the reference is all zeros (a
    # row whose one key is its whole softmax has dq = 0 exactly).
    if not np.abs(want).max() > 0:
        return float(np.abs(x).max())
    return ref.rel_error(x, want)


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def packed(rng, q_lens, k_lens, H, Hkv, d):
    tq, tk = sum(q_lens), sum(k_lens)
    q = rng.normal(0.3, 1.0, (tq, H, d)).astype(np.float32)
    k = rng.normal(-0.2, 1.0, (tk, Hkv, d)).astype(np.float32)
    v = rng.normal(0.5, 1.0, (tk, Hkv, d)).astype(np.float32)
    do = rng.normal(0.1, 1.0, (tq, H, d)).astype(np.float32)
    return q, k, v, do


@pytest.mark.parametrize("opts", [{}, dict(causal=True), dict(causal=True, window=3, softcap=4.0)],
                         ids=["plain", "causal", "window-softcap"])
def test_forward_backward_per_sequence(opts):
    rng = np.random.default_rng(0)
    q_lens, k_lens, H, Hkv, d = [3, 0, 6, 1, 4], [5, 2, 4, 1, 0], 4, 2, 8
    q, k, v, do = packed(rng, q_lens, k_lens, H, Hkv, d)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    sizes = dict(max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens))
    o = np.full(q.shape, np.nan, dtype=np.float32)  # poison: every element must be written
    lse = np.full((H, q.shape[0]), np.nan, dtype=np.float32)
    gqattn.forward_varlen(q, k, v, o, lse, cu_q, cu_k, **sizes, **opts)
    dq, dk, dv = (np.full(t.shape, np.nan, dtype=np.float32) for t in (q, k, v))
    gqattn.backward_varlen(q, k, v, o, lse, do, dq, dk, dv, cu_q, cu_k, **sizes, **opts)
    for b in range(len(q_lens)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if q_lens[b] == 0:
            continue
        if k_lens[b] == 0:  # no key: o = 0, lse = -inf, zero gradients
            assert not o[qs].any() and np.isneginf(lse[:, qs]).all() and not dq[qs].any()
            continue
        ro, rlse = ref.forward(q[None, qs], k[None, ks], v[None, ks], **opts)
        rdq, rdk, rdv = ref.backward(q[None, qs], k[None, ks], v[None, ks], do[None, qs], **opts)
        assert err(o[qs], ro[0]) < F32_TOL
        assert err(lse[:, qs], rlse[0]) < F32_TOL
        assert err(dq[qs], rdq[0]) < 10 * F32_TOL
        assert err(dk[ks], rdk[0]) < 10 * F32_TOL
        assert err(dv[ks], rdv[0]) < 10 * F32_TOL
    assert not np.isnan(dk).any() and not np.isnan(dv).any()


def test_offsets_errors_name_the_argument():
    rng = np.random.default_rng(1)
    q, k, v, _ = packed(rng, [2, 3], [3, 3], 2, 1, 8)
    o = np.empty_like(q)
    cu = offsets([2, 3])
    cu_k = offsets([3, 3])
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q\.dtype = int64.*int32"):
        gqattn.forward_varlen(q, k, v, o, None, cu.astype(np.int64), cu_k, max_seqlen_q=3,
                              max_seqlen_k=3)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\[B\] = 7"):
        gqattn.forward_varlen(q, k, v, o, None, cu, np.array([0, 3, 7], np.int32),
                              max_seqlen_q=3, max_seqlen_k=4)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q"):
        gqattn.forward_varlen(q, k, v, o, None, np.array([0, 3, 2], np.int32), cu_k,
                              max_seqlen_q=3, max_seqlen_k=3)
    with pytest.raises(gqattn.Error, match=r"q\.rank = 4"):
        gqattn.forward_varlen(q[None], k, v, o, None, cu, cu_k, max_seqlen_q=3, max_seqlen_k=3)
