"""gqattn.torch: outputs and gradients against torch's math SDPA and explicit
f64 math, gradcheck through the f64 oracle route, opcheck of the custom ops,
torch.compile(fullgraph=True), the flash_attn_func mapping, and CUDA (skipped
without a GPU; also a torch.cuda.graphs capture of the forward and backward
whose replays must give the eager bits, and torch.compile's CUDA graphs).
Skipped as a whole when torch is not installed.
Run: pytest python/tests/test_torch.py (after `pip install .`).
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI needs numpy + pytest only)")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import gqattn  # noqa: E402
import gqattn.torch as gt  # noqa: E402

F32_TOL = 1e-5
F64_TOL = 1e-10
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


def default_scale(d):
    # gqattn computes 1/sqrt(d) in float32; f64 references use the same value.
    return float(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32))


def keep_mask(Tq, Tk, causal, window, device="cpu"):
    pos = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    j = torch.arange(Tk, device=device)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= pos
    if window:
        keep &= j >= pos - window + 1
    return keep


def sdpa_reference(q, k, v, causal=False, window=0, scale=None):
    """torch's math SDPA in our layout: K/V expanded per group, boolean mask
    (True = keep). Only for problems where every row keeps a key."""
    H, Hkv = q.shape[2], k.shape[2]
    kt = k.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    mask = keep_mask(q.shape[1], k.shape[1], causal, window, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, attn_mask=mask,
                                           scale=default_scale(q.shape[-1]) if scale is None
                                           else scale)
    return o.transpose(1, 2)


def math_reference(q, k, v, causal=False, window=0, softcap=0.0, scale=None):
    """Explicit math (softcap, rows with no key -> 0 output, -inf lse)."""
    H, Hkv, d = q.shape[2], k.shape[2], q.shape[3]
    scale = default_scale(d) if scale is None else scale
    kt = k.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)
    s = scale * q.transpose(1, 2) @ kt.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = keep_mask(q.shape[1], k.shape[1], causal, window, q.device)
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(keep, torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None]), 0)
    return (p @ vt).transpose(1, 2), lse


def rel(x, ref):
    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(x), finite), "non-finite where the reference is finite"
    return ((x - ref)[finite].abs().max() / ref[finite].abs().max().clamp_min(1e-300)).item()


def make(B, Tq, Tk, H, Hkv, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, H, d, generator=g, dtype=torch.float64) + 0.3
    k = torch.randn(B, Tk, Hkv, d, generator=g, dtype=torch.float64) - 0.2
    v = torch.randn(B, Tk, Hkv, d, generator=g, dtype=torch.float64) + 0.5
    do = torch.randn(B, Tq, H, d, generator=g, dtype=torch.float64)
    q[:, 0] *= 8.0  # a large-magnitude row
    return [t.to(dtype=dtype, device=device) for t in (q, k, v, do)]


def grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    o = out[0] if isinstance(out, tuple) else out
    o.backward(do)
    return o.detach(), [t.grad for t in leaves]


SDPA_CASES = [
    dict(B=2, Tq=9, Tk=9, H=4, Hkv=2, d=8),
    dict(B=1, Tq=16, Tk=16, H=4, Hkv=1, d=16, causal=True),
    dict(B=1, Tq=17, Tk=17, H=6, Hkv=3, d=8, causal=True, window=5),
    dict(B=2, Tq=5, Tk=11, H=2, Hkv=2, d=16, causal=True, window=4),
    dict(B=1, Tq=8, Tk=8, H=2, Hkv=1, d=4, window=3),
]


def _split(case):
    sizes = {n: case[n] for n in ("B", "Tq", "Tk", "H", "Hkv", "d")}
    return sizes, {n: case[n] for n in ("causal", "window", "softcap", "scale") if n in case}


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64-oracle"])
def test_against_math_sdpa(case, dtype):
    sizes, opts = _split(case)
    q, k, v, do = make(**sizes, dtype=torch.float64)
    ref_o, ref_g = grads(lambda a, b, c: sdpa_reference(a, b, c, **opts), q, k, v, do)
    cast = [t.to(dtype) for t in (q, k, v, do)]
    o, g = grads(lambda a, b, c: gt.attention(a, b, c, **opts), *cast)
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    assert o.dtype == dtype
    assert rel(o, ref_o) < tol
    for got, want in zip(g, ref_g):
        assert got.dtype == dtype and rel(got, want) < tol


MATH_CASES = [
    dict(B=1, Tq=8, Tk=8, H=4, Hkv=2, d=8, softcap=3.0),
    dict(B=2, Tq=13, Tk=13, H=4, Hkv=2, d=8, causal=True, window=4, softcap=5.0),
    dict(B=1, Tq=12, Tk=5, H=4, Hkv=4, d=8, causal=True),  # rows with no key
    dict(B=1, Tq=7, Tk=9, H=3, Hkv=1, d=12, scale=0.25, softcap=2.0),
]


@pytest.mark.parametrize("case", MATH_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64-oracle"])
def test_against_explicit_math(case, dtype):
    sizes, opts = _split(case)
    q, k, v, do = make(**sizes, dtype=torch.float64, seed=1)
    ref_o, ref_g = grads(lambda a, b, c: math_reference(a, b, c, **opts), q, k, v, do)
    _, ref_lse = math_reference(q, k, v, **opts)
    cast = [t.to(dtype) for t in (q, k, v, do)]
    o, g = grads(lambda a, b, c: gt.attention(a, b, c, **opts), *cast)
    _, lse = gt.attention(*cast[:3], return_lse=True, **opts)
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    assert rel(o, ref_o) < tol
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert rel(lse, ref_lse) < tol
    for got, want in zip(g, ref_g):
        assert rel(got, want) < tol


def test_lazy_submodule():
    assert gqattn.torch is gt


def test_lse_dtype_and_not_differentiable():
    q, k, v, _ = make(1, 4, 4, 2, 1, 8)
    q.requires_grad_()
    o, lse = gt.attention(q, k, v, return_lse=True)
    assert lse.shape == (1, 2, 4) and lse.dtype == torch.float32
    assert o.requires_grad and not lse.requires_grad


def test_non_contiguous_inputs_and_gradients():
    # q/k/v as views of one projection; o.sum() sends an expanded gradient
    # (all strides 0) that the op must make last-dim contiguous itself.
    B, T, H, Hkv, d = 2, 6, 4, 2, 8
    qkv = torch.randn(B, T, H + 2 * Hkv, d, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.split([H, Hkv, Hkv], dim=2)
    gt.attention(q.float(), k.float(), v.float(), causal=True).sum().backward()
    got = qkv.grad.clone()
    qkv.grad = None
    q, k, v = qkv.split([H, Hkv, Hkv], dim=2)
    math_reference(q, k, v, causal=True)[0].sum().backward()
    assert rel(got, qkv.grad) < F32_TOL
    # A transposed last dimension is copied, not refused.
    qt = torch.randn(B, T, d, H).transpose(2, 3)
    assert qt.stride(-1) != 1
    kk, vv = torch.randn(B, T, Hkv, d), torch.randn(B, T, Hkv, d)
    assert rel(gt.attention(qt, kk, vv), math_reference(qt.double(), kk.double(),
                                                         vv.double())[0]) < F32_TOL


def test_bfloat16_within_design_tolerance():
    # docs/semantics.md (correctness): bf16 error against f64 at most 2x the
    # f32 path's on the same rounded inputs, plus one output rounding (2^-8).
    opts = dict(causal=True, window=5, softcap=10.0)
    q, k, v, do = make(1, 16, 16, 4, 2, 16, dtype=torch.bfloat16, seed=2)
    ref_o, ref_g = grads(lambda a, b, c: math_reference(a, b, c, **opts),
                         *(t.double() for t in (q, k, v, do)))
    o16, g16 = grads(lambda a, b, c: gt.attention(a, b, c, **opts), q, k, v, do)
    o32, g32 = grads(lambda a, b, c: gt.attention(a, b, c, **opts),
                     *(t.float() for t in (q, k, v, do)))
    assert o16.dtype == torch.bfloat16
    assert rel(o16, ref_o) <= 2 * rel(o32, ref_o) + 2.0**-8
    for a, b, w in zip(g16, g32, ref_g):
        # The f32 path's o is not rounded like bf16's (D = do . o), so allow
        # that one rounding through the backward as well.
        assert rel(a, w) <= 2 * rel(b, w) + 2 * 2.0**-8


def test_gradcheck_f64_oracle_route():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 5, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: gt.attention(a, b, c, causal=True, window=3, softcap=2.0), (q, k, v))
    # Rows with no kept key (Tq > Tk, causal): gradients exactly 0 there.
    q2 = torch.randn(1, 6, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: gt.attention(a, b, c, causal=True),
                                    (q2, k[:, :3].detach().requires_grad_(),
                                     v[:, :3].detach().requires_grad_()))


def test_opcheck_custom_ops():
    # Schema, fake-tensor implementation, autograd registration and AOT
    # dispatch, as torch.compile relies on them.
    q, k, v, do = make(1, 5, 5, 4, 2, 8)
    q.requires_grad_()
    fwd_args = (q, k, v, True, 3, 5.0, None, True, "auto")
    torch.library.opcheck(torch.ops.gqattn.attention_forward.default, fwd_args)
    o, lse = torch.ops.gqattn.attention_forward(*fwd_args)
    bwd_args = (do, q.detach(), k, v, o.detach(), lse, True, 3, 5.0, None, True, "auto")
    torch.library.opcheck(torch.ops.gqattn.attention_backward.default, bwd_args)


class TinyBlock(torch.nn.Module):
    """GQA attention between two projections, as a model would use it."""

    def __init__(self, dim=32, H=4, Hkv=2):
        super().__init__()
        self.H, self.Hkv, self.d = H, Hkv, dim // H
        self.q = torch.nn.Linear(dim, H * self.d, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * Hkv * self.d, bias=False)
        self.out = torch.nn.Linear(H * self.d, dim, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.H, self.d)
        k, v = self.kv(x).view(B, T, 2, self.Hkv, self.d).unbind(2)
        a = gt.attention(q, k, v, causal=True, window=4, softcap=20.0)
        return x + self.out(a.reshape(B, T, -1))


def _compile_matches_eager(device, backend):
    torch.manual_seed(0)
    model = TinyBlock().to(device)
    x = torch.randn(2, 12, 32, device=device)
    eager_out = model(x)
    eager_out.square().mean().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # fails on a graph break
    out = compiled(x)
    out.square().mean().backward()
    assert rel(out.detach(), eager_out.detach()) < 1e-5
    for p, g in zip(model.parameters(), eager_grads):
        assert rel(p.grad, g) < 1e-4


def test_torch_compile_fullgraph_cpu_aot_eager():
    _compile_matches_eager("cpu", "aot_eager")


def test_torch_compile_dynamic_shapes():
    # A second sequence length recompiles with symbolic sizes: the fake
    # implementations must handle SymInts.
    torch.manual_seed(0)
    model = TinyBlock()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for T in (7, 19):
        x = torch.randn(2, T, 32)
        assert rel(compiled(x).detach(), model(x).detach()) < 1e-5


def test_torch_compile_fullgraph_cpu_inductor():
    _compile_matches_eager("cpu", "inductor")


def test_errors_from_torch():
    q, k, v, _ = make(1, 4, 4, 4, 2, 8)
    with pytest.raises(gqattn.Error, match=r"q\.rank = 3: must be 4") as info:
        gt.attention(q.flatten(2), k, v)
    assert info.value.argument == "q.rank = 3"
    with pytest.raises(gqattn.Error, match=r"H = 4: must be a multiple of Hkv = 3"):
        gt.attention(q, torch.randn(1, 4, 3, 8), torch.randn(1, 4, 3, 8))
    with pytest.raises(gqattn.Error, match=r"k\.dtype = bf16: must be f32"):
        gt.attention(q, k.bfloat16(), v)
    with pytest.raises(ValueError, match=r"backend: cuda-hopper"):
        gt.attention(q, k, v, backend="cuda-hopper")


# ---- flash_attn_func ---------------------------------------------------------


@pytest.mark.parametrize("window_size,causal,expect", [
    ((-1, -1), False, dict()),
    ((-1, -1), True, dict(causal=True)),
    ((3, 0), True, dict(causal=True, window=4)),
    ((3, 0), False, dict(causal=True, window=4)),
    ((-1, 0), False, dict(causal=True)),
    ((0, 0), True, dict(causal=True, window=1)),
    ((2, -1), False, dict(window=3)),
])
def test_flash_attn_func_window_mapping(window_size, causal, expect):
    q, k, v, _ = make(1, 9, 11, 4, 2, 8)
    got = gt.flash_attn_func(q, k, v, causal=causal, window_size=window_size, softcap=4.0,
                             softmax_scale=0.25)
    want = gt.attention(q, k, v, softcap=4.0, scale=0.25, **expect)
    assert torch.equal(got, want)
    # And FlashAttention's documented rule itself: keys i+off-left ..
    # i+off+right, -1 unbounded, causal bounding the right side at 0.
    left, right = window_size
    off = 11 - 9
    i = torch.arange(9)[:, None] + off
    j = torch.arange(11)[None, :]
    fa_keep = torch.ones(9, 11, dtype=torch.bool)
    if left >= 0:
        fa_keep &= j >= i - left
    if right >= 0 or causal:
        fa_keep &= j <= i + (0 if causal else right)
    ours = keep_mask(9, 11, expect.get("causal", False), expect.get("window", 0))
    assert torch.equal(fa_keep, ours)


@pytest.mark.parametrize("kwargs,match", [
    (dict(window_size=(2, 3)), r"window_size=\(2, 3\) with causal=False is not supported"),
    (dict(window_size=(2, -1), causal=True), r"window_size=\(2, -1\) with causal=True"),
    (dict(window_size=(-2, 0)), r"not supported; supported: window_size=\(-1, -1\)"),
    (dict(window_size=5), r"must be a pair of ints"),
    (dict(dropout_p=0.1), r"dropout_p=0.1 is not supported"),
    (dict(alibi_slopes=torch.ones(4)), r"alibi_slopes is not supported"),
])
def test_flash_attn_func_unsupported(kwargs, match):
    q, k, v, _ = make(1, 4, 4, 4, 2, 8)
    with pytest.raises(ValueError, match=match):
        gt.flash_attn_func(q, k, v, **kwargs)


def test_float64_on_cuda_is_refused_clearly():
    # Checked without a GPU through the op's own guard (the meta device
    # stands in for "not the CPU").
    q = torch.empty(1, 4, 2, 8, dtype=torch.float64, device="meta")
    with pytest.raises(gqattn.Error, match=r"float64 runs only the f64 reference oracle, on the CPU"):
        gt.attention(q, q[:, :, :1], q[:, :, :1])


# ---- CUDA ----------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_against_f64(dtype):
    opts = dict(causal=True, window=37, softcap=30.0)
    q, k, v, do = make(2, 200, 200, 8, 2, 64, dtype=dtype, device="cuda", seed=4)
    ref_o, ref_g = grads(lambda a, b, c: math_reference(a, b, c, **opts),
                         *(t.double() for t in (q, k, v, do)))
    o, g = grads(lambda a, b, c: gt.attention(a, b, c, **opts), q, k, v, do)
    if dtype == torch.float32:
        assert rel(o, ref_o) < F32_TOL and all(rel(a, w) < F32_TOL for a, w in zip(g, ref_g))
    else:
        o32, g32 = grads(lambda a, b, c: gt.attention(a, b, c, backend="cpu", **opts),
                         *(t.float().cpu() for t in (q, k, v, do)))
        rounding = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
        assert rel(o, ref_o) <= 2 * rel(o32.cuda(), ref_o) + rounding
        for a, b, w in zip(g, g32, ref_g):
            assert rel(a, w) <= 2 * rel(b.cuda(), w) + 2 * rounding


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    q, k, v, _ = make(1, 128, 128, 4, 1, 64, dtype=torch.bfloat16, device="cuda", seed=5)
    want = gt.attention(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = gt.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@needs_cuda
def test_cuda_graph_replay_matches_eager():
    # torch.cuda.graphs over the forward and the backward (what
    # torch.compile(mode="reduce-overhead") does): each replay must give the
    # eager bits of the inputs the static tensors hold at replay time.
    shape = (2, 333, 333, 4, 2, 128)
    first = make(*shape, dtype=torch.bfloat16, device="cuda", seed=6)
    second = make(*shape, dtype=torch.bfloat16, device="cuda", seed=7)

    def step(q, k, v, do):
        o = gt.attention(q, k, v, causal=True)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    def eager(inputs):
        q, k, v, do = inputs
        return step(*(t.clone().requires_grad_() for t in (q, k, v)), do)

    want_first, want_second = eager(first), eager(second)
    assert not torch.equal(want_first[1], want_second[1])

    static = [t.clone().requires_grad_(i < 3) for i, t in enumerate(first)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*static)
    for inputs, want in ((first, want_first), (second, want_second)):
        with torch.no_grad():
            for s, t in zip(static, inputs):
                s.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        for got, w in zip(outputs, want):
            assert torch.equal(got, w)


@needs_cuda
def test_cuda_torch_compile_reduce_overhead():
    # torch.compile(mode="reduce-overhead"): inductor's CUDA graph trees
    # record the compiled forward and backward (gqattn's two ops) on early
    # calls and replay them after. Every call must give the eager bits of its
    # own inputs (the same kernels on the same data), and inductor must not
    # have skipped a graph (it counts every skip it logs, e.g. for a CPU
    # tensor or a mutated input); a call that synchronised or allocated
    # unsafely would fail the capture itself.
    from torch._dynamo.utils import counters

    shape = (2, 333, 333, 4, 2, 128)
    torch._dynamo.reset()
    counters.clear()

    def attention(q, k, v):
        return gt.attention(q, k, v, causal=True)

    compiled = torch.compile(attention, mode="reduce-overhead", fullgraph=True)
    for seed in range(8, 13):  # first calls record, later ones replay
        inputs = make(*shape, dtype=torch.bfloat16, device="cuda", seed=seed)
        want_o, want_grads = grads(attention, *inputs)
        # Compared before the next call: a replay reuses the graph's memory.
        got_o, got_grads = grads(compiled, *inputs)
        assert torch.equal(got_o, want_o)
        for g, w in zip(got_grads, want_grads):
            assert torch.equal(g, w)
    assert counters["inductor"]["cudagraph_skips"] == 0


@needs_cuda
def test_cuda_float64_raises():
    q = torch.zeros(1, 4, 2, 8, dtype=torch.float64, device="cuda")
    with pytest.raises(gqattn.Error, match="float64"):
        gt.attention(q, q[:, :, :1], q[:, :, :1])


@needs_cuda
def test_cuda_torch_compile_fullgraph():
    _compile_matches_eager("cuda", "inductor")


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_cuda_second_device():
    q, k, v, _ = make(1, 64, 64, 4, 2, 64, dtype=torch.bfloat16, device="cuda:1", seed=6)
    o = gt.attention(q, k, v, causal=True)
    ref = gt.attention(q.cpu().float(), k.cpu().float(), v.cpu().float(), causal=True)
    assert o.device == q.device
    assert rel(o.float().cpu(), ref) < 2.0**-7
