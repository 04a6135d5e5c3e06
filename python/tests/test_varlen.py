"""Varlen batches and q_start through gqattn.torch: flash_attn_varlen_func /
varlen_attention (the custom ops gqattn::varlen_forward / varlen_backward)
against a per-sequence float64 reference written here in torch, gradcheck
through the f64 oracle route, opcheck, torch.compile(fullgraph=True) on the
CPU, the offsets' errors, batch invariance; and q_start on the dense
attention. Skips without torch (CI needs numpy + pytest only).
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI needs numpy + pytest only)")

import gqattn  # noqa: E402
import gqattn.torch as gt  # noqa: E402

F32_TOL = 1e-5
F64_TOL = 1e-10


def default_scale(d):
    # gqattn computes 1/sqrt(d) in float32; the f64 reference uses that value.
    return float(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32))


# ---- the reference: one sequence at a time, float64 autograd ----------------


def dense_reference(q, k, v, causal=False, window=0, softcap=0.0, scale=None, q_start=None):
    """One sequence, q [Tq, H, d], k/v [Tk, Hkv, d], in float64: query i at
    key position q_start + i (default Tk - Tq); causal keeps j <= pos, the
    window j >= pos - window + 1; a row without kept keys gets o = 0 and
    lse = -inf. Returns (o [Tq, H, d], lse [H, Tq]); differentiable."""
    Tq, H, d = q.shape
    Tk, Hkv = k.shape[0], k.shape[1]
    # The library takes the scale as a float32.
    scale = default_scale(d) if scale is None else float(torch.tensor(scale, dtype=torch.float32))
    start = Tk - Tq if q_start is None else q_start
    kh = k.repeat_interleave(H // Hkv, dim=1)  # query head h reads kv head h // (H // Hkv)
    vh = v.repeat_interleave(H // Hkv, dim=1)
    s = scale * torch.einsum("ihd,jhd->hij", q, kh)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(Tq)[:, None] + start
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep &= j <= pos
    if window:
        keep &= j >= pos - window + 1
    keep = keep.expand(H, Tq, Tk)
    # The row max only shifts the exponent: detached, it leaves the
    # gradients exact.
    m = torch.where(keep, s, -math.inf).amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(keep, torch.exp(torch.where(keep, s - m, torch.zeros_like(s))),
                    torch.zeros_like(s))
    total = e.sum(dim=-1, keepdim=True)
    has = total > 0
    p = e / torch.where(has, total, torch.ones_like(total))
    o = torch.einsum("hij,jhd->ihd", p, vh)
    lse = torch.where(has, m + torch.log(torch.where(has, total, torch.ones_like(total))),
                      torch.full_like(total, -math.inf))[..., 0]
    return o, lse


def varlen_reference(q, k, v, do, cu_q, cu_k, seqused_k=None, **mask):
    """Every sequence alone through dense_reference: (o, lse [H, total_q],
    dq, dk, dv) in float64, zero gradients for key rows no query uses."""
    q, k, v, do = (t.detach().double() for t in (q, k, v, do))
    o = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        k0, k1 = int(cu_k[b]), int(cu_k[b + 1])
        if seqused_k is not None:
            k1 = k0 + int(seqused_k[b])
        if q1 == q0 or k1 == k0:
            continue  # no query or no key: o = 0, lse = -inf, zero gradients
        qb, kb, vb = (t.clone().requires_grad_() for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        ob, lseb = dense_reference(qb, kb, vb, **mask)
        o[q0:q1], lse[:, q0:q1] = ob.detach(), lseb.detach()
        gq, gk, gv = torch.autograd.grad(ob, (qb, kb, vb), do[q0:q1], allow_unused=True)
        dq[q0:q1] = gq
        if gk is not None:
            dk[k0:k1], dv[k0:k1] = gk, gv
    return o, lse, dq, dk, dv


def rel(x, ref):
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(x), finite), "non-finite where the reference is finite"
    if not finite.any():
        return 0.0
    # An all-zero reference (e.g. gradients of a row whose only key is v
    # itself) has no scale: the error is then absolute.
    scale = ref[finite].abs().max()
    scale = scale if scale > 0 else torch.ones_like(scale)
    return ((x - ref)[finite].abs().max() / scale).item()


def offsets(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def make(q_lens, k_lens, H, Hkv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(q_lens), sum(k_lens)
    q = torch.randn(tq, H, d, generator=g, dtype=torch.float64) + 0.3
    k = torch.randn(tk, Hkv, d, generator=g, dtype=torch.float64) - 0.2
    v = torch.randn(tk, Hkv, d, generator=g, dtype=torch.float64) + 0.5
    do = torch.randn(tq, H, d, generator=g, dtype=torch.float64)
    if tq:
        q[0] *= 8.0  # a large-magnitude row
    return [t.to(dtype) for t in (q, k, v, do)]


def run(q, k, v, do, cu_q, cu_k, max_q, max_k, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o, lse, _ = gt.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k,
                                          return_attn_probs=True, **kw)
    o.backward(do)
    return o.detach(), lse, [t.grad for t in leaves]


# (q lengths, k lengths, H, Hkv, d, flash_attn_varlen_func keywords, reference mask)
CASES = {
    "plain": ([3, 5, 1], [4, 5, 2], 2, 2, 8, {}, {}),
    "zero-and-one": ([0, 1, 4, 0, 2], [3, 1, 0, 2, 2], 4, 2, 8, {}, {}),
    "causal": ([5, 1, 7, 0], [5, 6, 9, 3], 4, 1, 16, dict(causal=True), dict(causal=True)),
    "tq-gt-tk-causal": ([6, 3, 2], [2, 3, 0], 2, 1, 8, dict(causal=True), dict(causal=True)),
    "window": ([8, 4, 1], [8, 9, 3], 6, 3, 8, dict(causal=True, window_size=(2, 0)),
               dict(causal=True, window=3)),
    "window-no-right-bound": ([5, 6], [7, 6], 2, 2, 4, dict(window_size=(1, -1)),
                              dict(window=2)),
    "softcap-gqa": ([4, 7, 3], [6, 7, 5], 8, 2, 8, dict(causal=True, softcap=3.0),
                    dict(causal=True, softcap=3.0)),
    "scale": ([3, 4], [5, 4], 2, 1, 8, dict(softmax_scale=0.3), dict(scale=0.3)),
    "q_start-0": ([4, 6, 2], [7, 6, 5], 4, 2, 8, dict(causal=True, q_start=0),
                  dict(causal=True, q_start=0)),
    "q_start-2-window": ([4, 6, 2], [7, 9, 5], 2, 2, 8,
                         dict(causal=True, window_size=(3, 0), q_start=2),
                         dict(causal=True, window=4, q_start=2)),
    "q_start-negative": ([3, 2], [4, 3], 2, 1, 8, dict(causal=True, q_start=-1),
                         dict(causal=True, q_start=-1)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64-oracle"])
def test_against_f64_reference(name, dtype):
    q_lens, k_lens, H, Hkv, d, kw, mask = CASES[name]
    q, k, v, do = make(q_lens, k_lens, H, Hkv, d, dtype=dtype)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    o, lse, (dq, dk, dv) = run(q, k, v, do, cu_q, cu_k, max(q_lens), max(k_lens), **kw)
    assert o.shape == q.shape and o.dtype == dtype
    assert lse.shape == (H, q.shape[0])
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    ro, rlse, rdq, rdk, rdv = varlen_reference(q, k, v, do, cu_q, cu_k, **mask)
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    for got, want, what in ((o, ro, "o"), (lse, rlse, "lse"), (dq, rdq, "dq"), (dk, rdk, "dk"),
                            (dv, rdv, "dv")):
        assert rel(got, want) < (tol if what in ("o", "lse") else 10 * tol), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64-oracle"])
def test_seqused_k(dtype):
    q_lens, k_lens, used = [3, 4, 2, 1], [6, 4, 5, 3], [2, 4, 0, 3]
    q, k, v, do = make(q_lens, k_lens, 4, 2, 8, dtype=dtype, seed=5)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    seqused_k = torch.tensor(used, dtype=torch.int32)
    o, lse, (dq, dk, dv) = run(q, k, v, do, cu_q, cu_k, 4, 6, causal=True, seqused_k=seqused_k)
    ro, rlse, rdq, rdk, rdv = varlen_reference(q, k, v, do, cu_q, cu_k, seqused_k, causal=True)
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    assert rel(o, ro) < tol and rel(lse, rlse) < tol
    assert rel(dq, rdq) < 10 * tol and rel(dk, rdk) < 10 * tol and rel(dv, rdv) < 10 * tol
    # Key rows past seqused_k: exactly zero gradients.
    for b in range(len(used)):
        tail = slice(int(cu_k[b]) + used[b], int(cu_k[b + 1]))
        assert not dk[tail].any() and not dv[tail].any()


def test_empty_rows_are_zero_and_minus_inf():
    # Tq_b > Tk_b under causal: the first rows see no key.
    q, k, v, do = make([4], [1], 2, 1, 8)
    cu_q, cu_k = offsets([4]), offsets([1])
    o, lse, (dq, _, _) = run(q, k, v, do, cu_q, cu_k, 4, 1, causal=True)
    assert not o[:3].any() and not dq[:3].any()
    assert torch.isneginf(lse[:, :3]).all() and torch.isfinite(lse[:, 3]).all()


def test_batch_invariance():
    # A sequence alone and the same sequence inside a batch: the same bits.
    q_lens, k_lens = [5, 9, 3], [7, 9, 6]
    q, k, v, do = make(q_lens, k_lens, 4, 2, 16, seed=2)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    kw = dict(causal=True, softcap=5.0)
    o, lse, grads = run(q, k, v, do, cu_q, cu_k, 9, 9, **kw)
    for b in range(3):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o1, lse1, (dq1, dk1, dv1) = run(q[qs], k[ks], v[ks], do[qs], offsets([q_lens[b]]),
                                        offsets([k_lens[b]]), q_lens[b], k_lens[b], **kw)
        assert torch.equal(o1, o[qs]) and torch.equal(lse1, lse[:, qs])
        assert torch.equal(dq1, grads[0][qs])
        assert torch.equal(dk1, grads[1][ks]) and torch.equal(dv1, grads[2][ks])


def test_gradcheck_f64_oracle_route():
    g = torch.Generator().manual_seed(3)
    cu_q, cu_k = offsets([2, 0, 3]), offsets([3, 2, 2])
    q = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(7, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(7, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: gt.flash_attn_varlen_func(a, b, c, cu_q, cu_k, 3, 3, causal=True,
                                                  window_size=(1, 0), softcap=2.0), (q, k, v))
    used = torch.tensor([2, 1, 2], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda a, b, c: gt.varlen_attention(a, b, c, cu_q, cu_k, 3, 3, causal=True,
                                            seqused_k=used, q_start=0), (q, k, v))


def _op_args(dtype=torch.float32):
    q_lens, k_lens = [3, 0, 4], [4, 2, 5]
    q, k, v, do = make(q_lens, k_lens, 4, 2, 8, dtype=dtype)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    return q, k, v, do, cu_q, cu_k


@pytest.mark.parametrize("seqused", [False, True], ids=["cu", "seqused_k"])
def test_opcheck_custom_ops(seqused):
    # Schema, fake implementation, autograd registration and AOT dispatch.
    q, k, v, do, cu_q, cu_k = _op_args()
    q.requires_grad_()
    used = torch.tensor([3, 1, 5], dtype=torch.int32) if seqused else None
    fwd_args = (q, k, v, cu_q, cu_k, used, 4, 5, True, 3, 5.0, None, None, True, "auto", True)
    torch.library.opcheck(torch.ops.gqattn.varlen_forward.default, fwd_args)
    o, lse = torch.ops.gqattn.varlen_forward(*fwd_args)
    bwd_args = (do, q.detach(), k, v, o.detach(), lse, cu_q, cu_k, used, 4, 5, True, 3, 5.0, None,
                1, True, "auto", True)
    torch.library.opcheck(torch.ops.gqattn.varlen_backward.default, bwd_args)


def test_opcheck_dense_with_q_start():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 4, 8, generator=g, requires_grad=True)
    k, v = torch.randn(1, 7, 2, 8, generator=g), torch.randn(1, 7, 2, 8, generator=g)
    fwd_args = (q, k, v, True, 3, 0.0, None, True, "auto", 1)
    torch.library.opcheck(torch.ops.gqattn.attention_forward.default, fwd_args)


def _varlen_loss(q, k, v, cu_q, cu_k):
    o = gt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, causal=True, softcap=10.0)
    return o.square().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    q, k, v, _, cu_q, cu_k = _op_args()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = _varlen_loss(*leaves, cu_q, cu_k)
    eager.backward()
    eager_grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(_varlen_loss, fullgraph=True, backend=backend)
    loss = compiled(*leaves, cu_q, cu_k)
    loss.backward()
    assert rel(loss.detach(), eager.detach()) < 1e-6
    for t, g in zip(leaves, eager_grads):
        assert rel(t.grad, g) < 1e-5


def test_torch_compile_dynamic_shapes():
    # Other batch sizes, totals and max_seqlen recompile with symbolic sizes:
    # the fake implementations must not bake any of them in.
    def loss(q, k, v, cu, max_len):
        return gt.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len,
                                         causal=True).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager", dynamic=True)
    for lens in ([3, 4], [5, 1, 7], [2, 9, 4, 6]):
        q, k, v, _ = make(lens, lens, 4, 2, 8, seed=len(lens))
        cu = offsets(lens)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        got = compiled(*leaves, cu, max(lens))
        got_grads = torch.autograd.grad(got, leaves)
        want = loss(*leaves, cu, max(lens))
        want_grads = torch.autograd.grad(want, leaves)
        assert torch.equal(got, want)
        for a, b in zip(got_grads, want_grads):
            assert torch.equal(a, b)


def test_offsets_checked_only_outside_compile(monkeypatch):
    # The wrapper passes check_offsets=True in eager mode, False when traced.
    seen = []
    real = gt._varlen_forward

    def spy(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(gt, "_varlen_forward", spy)
    q, k, v, _, cu_q, cu_k = _op_args()
    gt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5)
    assert seen == [True]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert gt._may_check_offsets(q) is False


# ---- the offsets' errors -----------------------------------------------------


def _call(q, k, v, cu_q, cu_k, max_q=4, max_k=5, **kw):
    return gt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def test_bad_offsets_raise_naming_the_argument():
    q, k, v, _, cu_q, cu_k = _op_args()
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q\.dtype = int64.*int32"):
        _call(q, k, v, cu_q.long(), cu_k)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\.dtype = int64"):
        _call(q, k, v, cu_q, cu_k.long())
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q\.dim\(\) = 2"):
        _call(q, k, v, cu_q[None], cu_k)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\.shape = \[3\]"):
        _call(q, k, v, cu_q, cu_k[:3])
    with pytest.raises(gqattn.Error, match=r"seqused_k\.shape = \[4\]"):
        _call(q, k, v, cu_q, cu_k, seqused_k=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(gqattn.Error, match=r"seqused_k\.dtype = int64"):
        _call(q, k, v, cu_q, cu_k, seqused_k=torch.zeros(3, dtype=torch.int64))
    # Values: the library's checks, naming the offset.
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q"):
        _call(q, k, v, torch.tensor([0, 4, 3, 7], dtype=torch.int32), cu_k)  # decreasing
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\[B\] = 10"):
        _call(q, k, v, cu_q, torch.tensor([0, 4, 6, 10], dtype=torch.int32))  # last != total
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q"):
        _call(q, k, v, cu_q, cu_k, max_q=3)  # a sequence longer than max_seqlen_q
    with pytest.raises(gqattn.Error, match=r"seqused_k\[2\] = 6"):
        _call(q, k, v, cu_q, cu_k, seqused_k=torch.tensor([1, 1, 6], dtype=torch.int32))


def test_bad_offsets_raise_in_the_f64_route_too():
    q, k, v, _, cu_q, cu_k = _op_args(torch.float64)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q"):
        _call(q, k, v, torch.tensor([0, 4, 3, 7], dtype=torch.int32), cu_k)
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\[B\] = 10"):
        _call(q, k, v, cu_q, torch.tensor([0, 4, 6, 10], dtype=torch.int32))


@pytest.mark.parametrize("kwargs, match", [
    (dict(dropout_p=0.1), "dropout_p=0.1 is not supported"),
    (dict(alibi_slopes=torch.zeros(4)), "alibi_slopes is not supported"),
    (dict(window_size=(2, 1)), r"window_size=\(2, 1\).*not supported"),
    (dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "block_table is not supported"),
])
def test_flash_attn_varlen_func_unsupported(kwargs, match):
    q, k, v, _, cu_q, cu_k = _op_args()
    with pytest.raises(ValueError, match=match):
        _call(q, k, v, cu_q, cu_k, **kwargs)


def test_fa3_interface_varlen():
    from gqattn.flash_attn_interface import flash_attn_varlen_func as fa3
    q, k, v, _, cu_q, cu_k = _op_args()
    want = _call(q, k, v, cu_q, cu_k, causal=True, softmax_scale=0.2)
    out = fa3(q, k, v, cu_q, cu_k, 4, 5, softmax_scale=0.2, causal=True)
    assert torch.equal(out, want)
    out, lse = fa3(q, k, v, cu_q, cu_k, 4, 5, causal=True, return_attn_probs=True)
    assert lse.shape == (4, q.shape[0])
    with pytest.raises(ValueError, match="seqused_q is not supported"):
        fa3(q, k, v, cu_q, cu_k, 4, 5, seqused_q=torch.zeros(3, dtype=torch.int32))


# ---- q_start on the dense attention -----------------------------------------


@pytest.mark.parametrize("q_start", [None, 0, 2, -3, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64-oracle"])
def test_dense_q_start(q_start, dtype):
    g = torch.Generator().manual_seed(7)
    B, Tq, Tk, H, Hkv, d = 2, 5, 8, 4, 2, 8
    q = torch.randn(B, Tq, H, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, Tk, Hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, Tk, Hkv, d, generator=g, dtype=torch.float64)
    do = torch.randn(B, Tq, H, d, generator=g, dtype=torch.float64)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    o, lse = gt.attention(*leaves, causal=True, window=3, q_start=q_start, return_lse=True)
    o.backward(do.to(dtype))
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    for b in range(B):
        ref = [t[b].clone().requires_grad_() for t in (q, k, v)]
        ro, rlse = dense_reference(*ref, causal=True, window=3, q_start=q_start)
        rgrads = torch.autograd.grad(ro, ref, do[b], allow_unused=True)
        assert rel(o[b].detach(), ro.detach()) < tol
        assert rel(lse[b], rlse.detach()) < tol
        for got, want in zip(leaves, rgrads):
            want = torch.zeros_like(got[b], dtype=torch.float64) if want is None else want
            assert rel(got.grad[b], want) < 10 * tol


def test_dense_q_start_default_is_bottom_right():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, T, 2, 8, generator=g) for T in (4, 9, 9))
    assert torch.equal(gt.attention(q, k, v, causal=True),
                       gt.attention(q, k, v, causal=True, q_start=5))


def test_dense_q_start_gradcheck():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 6, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 6, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: gt.attention(a, b, c, causal=True, window=2, q_start=1), (q, k, v))


# ---- CUDA (skipped without a GPU) ------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", ["zero-and-one", "causal", "tq-gt-tk-causal", "window",
                                  "softcap-gqa", "q_start-2-window"])
def test_cuda_against_f64(name, dtype):
    q_lens, k_lens, H, Hkv, d, kw, mask = CASES[name]
    d = 64  # the CUDA backends' head dimensions
    q, k, v, do = make(q_lens, k_lens, H, Hkv, d, dtype=torch.float64, seed=3)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    ro, rlse, rdq, rdk, rdv = varlen_reference(q, k, v, do, cu_q, cu_k, **mask)
    dev = [t.to(dtype=dtype, device="cuda") for t in (q, k, v, do)]
    o, lse, (dq, dk, dv) = run(*dev, cu_q.cuda(), cu_k.cuda(), max(q_lens), max(k_lens), **kw)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert rel(o.cpu(), ro) < tol and rel(lse.cpu(), rlse) < tol
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        assert rel(got.cpu(), want) < 4 * tol


@needs_cuda
def test_cuda_graph_capture_skips_the_offsets_check():
    # Under capture the wrapper passes check_offsets=False (checking copies
    # the offsets to the host, which capture forbids); replays give the eager
    # bits.
    q_lens, k_lens = [37, 0, 128, 5], [64, 3, 200, 5]
    q, k, v, do = (t.to(torch.bfloat16).cuda() for t in make(q_lens, k_lens, 8, 2, 64, seed=4))
    cu_q, cu_k = offsets(q_lens).cuda(), offsets(k_lens).cuda()

    def step(q, k, v, do):
        o = gt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 128, 200, causal=True)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    want = step(*(t.clone().requires_grad_() for t in (q, k, v)), do)
    static = [t.clone().requires_grad_(i < 3) for i, t in enumerate((q, k, v, do))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*static)
    graph.replay()
    torch.cuda.synchronize()
    for got, w in zip(outputs, want):
        assert torch.equal(got, w)


@needs_cuda
def test_cuda_bad_offsets_raise_in_eager_mode():
    q, k, v, _, cu_q, cu_k = _op_args()
    q, k, v = (t.cuda() for t in (q, k, v))
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_k\[B\] = 10"):
        _call(q, k, v, cu_q.cuda(), torch.tensor([0, 4, 6, 10], dtype=torch.int32).cuda())
    with pytest.raises(gqattn.Error, match=r"cu_seqlens_q\.device = cpu"):
        _call(q, k, v, cu_q, cu_k.cuda())
