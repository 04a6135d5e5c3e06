"""The low-level binding on numpy arrays (the CPU backend), against the tests'
own f64 reference (reference.py): forward o and lse, backward dq/dk/dv, for
causal, window, softcap, GQA/MQA, Tq != Tk, rows with no key, strided views,
determinism; plus the f64 oracle and the introspection calls.
Run: pytest python/tests/test_numpy.py (after `pip install .`).
"""

import zlib

import numpy as np
import pytest

import gqattn
import reference as ref

F32_TOL = 1e-5  # docs/semantics.md: f32 paths, max |err| / max |ref|

# (name, problem): sizes and mask options. Each exercises one thing that
# breaks kernels (docs/semantics.md, correctness), small enough for the f64
# reference.
CASES = [
    ("plain", dict(B=2, Tq=9, Tk=9, H=4, Hkv=2, d=8)),
    ("causal", dict(B=2, Tq=9, Tk=9, H=4, Hkv=2, d=8, causal=True)),
    ("causal_window", dict(B=1, Tq=17, Tk=17, H=4, Hkv=1, d=16, causal=True, window=5)),
    ("window_not_causal", dict(B=1, Tq=11, Tk=11, H=2, Hkv=2, d=8, window=4)),
    ("window_1", dict(B=1, Tq=6, Tk=6, H=2, Hkv=1, d=4, causal=True, window=1)),
    ("window_ge_T", dict(B=1, Tq=6, Tk=6, H=2, Hkv=1, d=4, causal=True, window=100)),
    ("softcap", dict(B=1, Tq=8, Tk=8, H=4, Hkv=2, d=8, softcap=3.0)),
    ("all_three", dict(B=2, Tq=13, Tk=13, H=6, Hkv=2, d=8, causal=True, window=4, softcap=5.0)),
    ("tq_lt_tk", dict(B=1, Tq=5, Tk=12, H=4, Hkv=2, d=8, causal=True, window=3)),
    ("tq_gt_tk_empty_rows", dict(B=1, Tq=12, Tk=5, H=4, Hkv=4, d=8, causal=True)),
    ("T_1", dict(B=3, Tq=1, Tk=1, H=2, Hkv=1, d=8, causal=True)),
    ("explicit_scale", dict(B=1, Tq=7, Tk=9, H=3, Hkv=1, d=12, scale=0.3)),
]


def run_forward(q, k, v, **opts):
    B, Tq, H, d = q.shape
    o = np.full(q.shape, np.nan, dtype=q.dtype)  # poison: every element must be written
    lse = np.full((B, H, Tq), np.nan, dtype=np.float32)
    gqattn.forward(q, k, v, o, lse, backend="cpu", **opts)
    return o, lse


def run_backward(q, k, v, o, lse, do, **opts):
    dq, dk, dv = (np.full(x.shape, np.nan, dtype=x.dtype) for x in (q, k, v))
    gqattn.backward(q, k, v, o, lse, do, dq, dk, dv, backend="cpu", **opts)
    return dq, dk, dv


def split(problem):
    sizes = {n: problem[n] for n in ("B", "Tq", "Tk", "H", "Hkv", "d")}
    opts = {n: problem[n] for n in ("causal", "window", "softcap", "scale") if n in problem}
    return sizes, opts


@pytest.mark.parametrize("name,problem", CASES, ids=[c[0] for c in CASES])
def test_forward_backward_f32(name, problem):
    # A seed per case that is the same in every run: hash() of a str is
    # salted per process, which made the inputs, and a dq error of 1.16e-5
    # on window_not_causal in one CI run (no seed of 400 tried since exceeds
    # 1e-5; the largest gave 9.4e-6), irreproducible.
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    sizes, opts = split(problem)
    q, k, v, do = ref.inputs(rng, **sizes)
    o, lse = run_forward(q, k, v, **opts)
    ro, rlse = ref.forward(q, k, v, **opts)
    assert ref.rel_error(o, ro) < F32_TOL
    assert np.array_equal(np.isneginf(lse), np.isneginf(rlse)), "-inf exactly on rows with no key"
    assert ref.rel_error(lse, rlse) < F32_TOL
    dq, dk, dv = run_backward(q, k, v, o, lse, do, **opts)
    for got, want, what in zip((dq, dk, dv), ref.backward(q, k, v, do, **opts), "qkv"):
        assert ref.rel_error(got, want) < F32_TOL, f"d{what}"


def test_rows_with_no_key_are_zero_not_nan():
    # Tq > Tk with causal: queries 0..Tq-Tk-1 sit before every key.
    rng = np.random.default_rng(1)
    q, k, v, do = ref.inputs(rng, B=1, Tq=6, Tk=2, H=2, Hkv=1, d=4)
    o, lse = run_forward(q, k, v, causal=True)
    empty = ref.keep_mask(6, 2, True, 0).sum(axis=1) == 0
    assert empty.sum() == 4
    assert np.all(o[:, empty] == 0.0)
    assert np.all(np.isneginf(lse[:, :, empty]))
    dq, dk, dv = run_backward(q, k, v, o, lse, do, causal=True)
    assert np.all(dq[:, empty] == 0.0)
    assert all(np.all(np.isfinite(x)) for x in (o, dq, dk, dv))


def test_forward_without_lse():
    rng = np.random.default_rng(2)
    q, k, v, _ = ref.inputs(rng, B=1, Tq=5, Tk=5, H=2, Hkv=1, d=8)
    o = np.full(q.shape, np.nan, dtype=np.float32)
    gqattn.forward(q, k, v, o, None, causal=True)
    assert ref.rel_error(o, ref.forward(q, k, v, causal=True)[0]) < F32_TOL


def test_strided_views_zero_copy():
    # q, k, v as views into one packed projection [B, T, H + 2 Hkv, d], the
    # way models produce them; outputs as views with padding that must stay
    # untouched.
    rng = np.random.default_rng(3)
    B, T, H, Hkv, d = 2, 10, 4, 2, 8
    qkv = rng.normal(0.2, 1.0, (B, T, H + 2 * Hkv, d)).astype(np.float32)
    q, k, v = qkv[:, :, :H], qkv[:, :, H:H + Hkv], qkv[:, :, H + Hkv:]
    assert not q.flags.c_contiguous
    sentinel = np.float32(7.25)
    o_buf = np.full((B, T, H, d + 3), sentinel, dtype=np.float32)
    lse_buf = np.full((B, H, T + 2), sentinel, dtype=np.float32)
    o, lse = o_buf[..., :d], lse_buf[..., :T]
    gqattn.forward(q, k, v, o, lse, causal=True, window=3)
    ro, rlse = ref.forward(q, k, v, causal=True, window=3)
    assert ref.rel_error(o, ro) < F32_TOL and ref.rel_error(lse, rlse) < F32_TOL
    assert np.all(o_buf[..., d:] == sentinel) and np.all(lse_buf[..., T:] == sentinel)

    do = rng.normal(size=(B, T, H, d)).astype(np.float32)
    grads = np.full((B, T, H + 2 * Hkv, d + 1), sentinel, dtype=np.float32)
    dq, dk, dv = grads[:, :, :H, :d], grads[:, :, H:H + Hkv, :d], grads[:, :, H + Hkv:, :d]
    gqattn.backward(q, k, v, o, lse, do, dq, dk, dv, causal=True, window=3)
    want = ref.backward(q, k, v, do, causal=True, window=3)
    for got, w in zip((dq, dk, dv), want):
        assert ref.rel_error(got, w) < F32_TOL
    assert np.all(grads[..., d:] == sentinel)


def test_broadcast_inputs_stride_zero():
    # An input may repeat elements (stride 0), e.g. one k/v shared by the batch.
    rng = np.random.default_rng(4)
    q, k, v, _ = ref.inputs(rng, B=3, Tq=4, Tk=4, H=2, Hkv=1, d=8)
    kb = np.broadcast_to(k[:1], k.shape)
    vb = np.broadcast_to(v[:1], v.shape)
    o, _ = run_forward(q, kb, vb)
    assert ref.rel_error(o, ref.forward(q, kb, vb)[0]) < F32_TOL


def test_read_only_inputs_accepted():
    rng = np.random.default_rng(5)
    q, k, v, _ = ref.inputs(rng, B=1, Tq=4, Tk=4, H=2, Hkv=2, d=4)
    for x in (q, k, v):
        x.setflags(write=False)
    o, _ = run_forward(q, k, v)
    assert ref.rel_error(o, ref.forward(q, k, v)[0]) < F32_TOL


def test_float16_within_design_tolerance():
    # docs/semantics.md (correctness) for 16-bit I/O: error against f64 (on
    # the rounded inputs) at most 2x the f32 path's error on the same inputs,
    # plus one rounding of an output element (2^-11 for f16).
    rng = np.random.default_rng(6)
    sizes = dict(B=1, Tq=16, Tk=16, H=4, Hkv=2, d=16)
    opts = dict(causal=True, window=6, softcap=10.0)
    q, k, v, do = ref.inputs(rng, dtype=np.float16, **sizes)
    q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, do))
    o16, lse16 = run_forward(q, k, v, **opts)
    o32, lse32 = run_forward(q32, k32, v32, **opts)
    ro, rlse = ref.forward(q32, k32, v32, **opts)
    assert ref.rel_error(o16, ro) <= 2 * ref.rel_error(o32, ro) + 2.0**-11
    assert ref.rel_error(lse16, rlse) <= 2 * ref.rel_error(lse32, rlse) + 2.0**-11
    g16 = run_backward(q, k, v, o16, lse16, do, **opts)
    # The f32 yardstick's backward gets o rounded as the f16 path's is: D =
    # do . o sees that rounding in both (as src/check/check.cpp does).
    g32 = run_backward(q32, k32, v32, o16.astype(np.float32), lse32, do32, **opts)
    for a, b, w in zip(g16, g32, ref.backward(q32, k32, v32, do32, **opts)):
        assert ref.rel_error(a, w) <= 2 * ref.rel_error(b, w) + 2.0**-11


def test_deterministic_bits():
    rng = np.random.default_rng(7)
    q, k, v, do = ref.inputs(rng, B=2, Tq=33, Tk=33, H=4, Hkv=1, d=16)
    opts = dict(causal=True, window=9, softcap=20.0)
    first = run_forward(q, k, v, **opts)
    second = run_forward(q, k, v, **opts)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, second))
    g1 = run_backward(q, k, v, *first, do, **opts)
    g2 = run_backward(q, k, v, *first, do, **opts)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(g1, g2))


def test_reference_gradient_matches_finite_differences():
    # The reference's backward is written by hand; check it against central
    # differences of its own forward, so the tests stand on solid ground.
    rng = np.random.default_rng(8)
    q, k, v, do = (x.astype(np.float64) for x in ref.inputs(rng, B=1, Tq=4, Tk=5, H=2, Hkv=1,
                                                              d=3))
    opts = dict(causal=True, window=3, softcap=2.0)
    grads = ref.backward(q, k, v, do, **opts)
    h = 1e-6
    for which, x in enumerate((q, k, v)):
        for idx in [tuple(rng.integers(0, n) for n in x.shape) for _ in range(6)]:
            args = [q.copy(), k.copy(), v.copy()]
            args[which][idx] += h
            plus = (ref.forward(*args, **opts)[0] * do).sum()
            args[which][idx] -= 2 * h
            minus = (ref.forward(*args, **opts)[0] * do).sum()
            assert abs((plus - minus) / (2 * h) - grads[which][idx]) < 1e-6


@pytest.mark.parametrize("name,problem", CASES[:10:3], ids=[c[0] for c in CASES[:10:3]])
def test_oracle_matches_reference(name, problem):
    rng = np.random.default_rng(9)
    sizes, opts = split(problem)
    q, k, v, do = (x.astype(np.float64) for x in ref.inputs(rng, **sizes))
    o, lse = gqattn.oracle_forward(q, k, v, **opts)
    ro, rlse = ref.forward(q, k, v, **opts)
    assert ref.rel_error(o, ro) < 1e-12 and ref.rel_error(lse, rlse) < 1e-12
    for got, want in zip(gqattn.oracle_backward(q, k, v, do, **opts),
                         ref.backward(q, k, v, do, **opts)):
        assert ref.rel_error(got, want) < 1e-12


def test_introspection():
    info = gqattn.build_info()
    assert info["version"] == gqattn.__version__
    status = {s["backend"]: s for s in gqattn.backend_status()}
    assert status["cpu"]["available"]
    assert set(status) == {"cpu", "cpu-flash", "cuda-unfused", "cuda-flash", "cuda-hopper"}
    ok = gqattn.explain(1, 128, 128, 8, 2, 64, causal=True, dtype="float32", device="cpu")
    # Auto picks cpu-flash, the faster host backend, for host tensors.
    assert ok == {"supported": True, "chosen": "cpu-flash", "reason": "", "plan": ""}
    bad = gqattn.explain(1, 128, 128, 8, 2, 64, dtype=np.float32, device="cpu",
                         backend="cuda-flash")
    assert not bad["supported"] and "cuda-flash" in bad["reason"]
    devices = gqattn.cuda_devices()
    assert isinstance(devices["devices"], list)
    assert devices["devices"] or devices["why_none"]
