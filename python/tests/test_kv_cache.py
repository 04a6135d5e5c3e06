"""gqattn.torch.flash_attn_with_kvcache and merge_attention_states on the CPU.

The KV-cache results are checked against a float64 reference written here
from docs/semantics.md ("KV cache"): gather each sequence's keys from the
cache, then dense attention with query i at position Tk_b - Tq + i. The
cases: dense caches with and without cache_batch_idx, paged caches of page
sizes 1, 3, 16 and 256 (pages shuffled, spare pages nobody uses), new keys
appended in place (the whole cache compared element by element with the
expected one, so untouched elements are checked too), cache_seqlens as an int
and as a tensor, the lse, the arguments refused, opcheck of both custom ops
and torch.compile(fullgraph=True) of a decode step. merge_attention_states:
attention over two halves of the keys merges to attention over all of them,
and rows without keys on both sides give o = 0, lse = -inf. The CUDA tests
(skipped without a GPU; skipped too while the library answers that no CUDA
backend has a KV-cache path) check bf16 against the reference, a decode step
captured in a CUDA graph and replayed, and the merge on CUDA and in a graph.
"""

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI needs numpy + pytest only)")

import gqattn  # noqa: E402
import gqattn.torch as gt  # noqa: E402


def default_scale(d):
    # The library computes 1/sqrt(d) in float32.
    return float(torch.tensor(1.0, dtype=torch.float32) / math.sqrt(d))


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def gather_keys(cache, b, n, block_table, cache_batch_idx):
    """The first n key rows of sequence b: [n, Hkv, d]."""
    if block_table is None:
        row = b if cache_batch_idx is None else int(cache_batch_idx[b])
        return cache[row, :n]
    page = cache.shape[1]
    rows = [cache[int(block_table[b, p // page]), p % page] for p in range(n)]
    return torch.stack(rows) if rows else cache.new_zeros((0, *cache.shape[2:]))


def reference(q, k_cache, v_cache, lengths, block_table=None, cache_batch_idx=None, causal=False,
              window=0, softcap=0.0, scale=None):
    """f64 (o [B, Tq, H, d], lse [B, H, Tq]) over the cache as it is now;
    sequence b uses its first lengths[b] keys."""
    B, Tq, H, d = q.shape
    Hkv = k_cache.shape[2]
    scale = default_scale(d) if scale is None else scale
    o = torch.zeros(B, Tq, H, d, dtype=torch.float64)
    lse = torch.full((B, H, Tq), -math.inf, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b])
        k = gather_keys(k_cache, b, n, block_table, cache_batch_idx).double()
        v = gather_keys(v_cache, b, n, block_table, cache_batch_idx).double()
        k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))  # [n, H, d]
        s = scale * torch.einsum("ihd,jhd->hij", q[b].double(), k)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(Tq)[:, None] + (n - Tq)
        j = torch.arange(n)[None, :]
        keep = torch.ones(Tq, n, dtype=torch.bool)
        if causal:
            keep &= j <= pos
        if window:
            keep &= j >= pos - window + 1
        s = torch.where(keep, s, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf for rows without keys
        p = torch.where(keep, torch.exp(s - row_lse[..., None].clamp_min(-1e300)), 0.0)
        o[b] = torch.einsum("hij,jhd->ihd", p, v)
        lse[b] = row_lse
    return o, lse


class Case:
    """A cache of B sequences: `cached[b]` keys already in it, t_new new ones;
    paged in pages of `page` (shuffled, two spare) or dense (rows in a
    shuffled order when batch_idx)."""

    def __init__(self, page=0, batch_idx=False, cached=(5, 0, 12), t_new=3, Tq=2, H=4, Hkv=2,
                 d=16, capacity=20, seed=0):
        g = torch.Generator().manual_seed(seed)
        B = len(cached)
        self.cached, self.t_new = list(cached), t_new
        self.q = torch.randn(B, Tq, H, d, generator=g)
        self.k = torch.randn(B, t_new, Hkv, d, generator=g) if t_new else None
        self.v = torch.randn(B, t_new, Hkv, d, generator=g) if t_new else None
        self.block_table = self.cache_batch_idx = None
        if page:
            pages_per_seq = -(-capacity // page)
            num_pages = B * pages_per_seq + 2
            order = torch.randperm(num_pages, generator=g)[:B * pages_per_seq]
            self.block_table = order.reshape(B, pages_per_seq).to(torch.int32)
            shape = (num_pages, page, Hkv, d)
        else:
            rows = B + 2
            if batch_idx:
                self.cache_batch_idx = torch.randperm(rows, generator=g)[:B].to(torch.int32)
            shape = (rows, capacity, Hkv, d)
        self.k_cache = torch.randn(shape, generator=g)
        self.v_cache = torch.randn(shape, generator=g)

    def seqlens(self):
        return torch.tensor(self.cached, dtype=torch.int32)

    def expected_caches(self):
        """The caches with the new keys where they belong, all else as now."""
        k_cache, v_cache = self.k_cache.clone(), self.v_cache.clone()
        for b, n in enumerate(self.cached):
            for t in range(self.t_new):
                p = n + t
                if self.block_table is None:
                    row = b if self.cache_batch_idx is None else int(self.cache_batch_idx[b])
                    k_cache[row, p], v_cache[row, p] = self.k[b, t], self.v[b, t]
                else:
                    page = self.k_cache.shape[1]
                    row = int(self.block_table[b, p // page])
                    k_cache[row, p % page] = self.k[b, t]
                    v_cache[row, p % page] = self.v[b, t]
        return k_cache, v_cache

    def run(self, cache_seqlens=None, **kwargs):
        return gt.flash_attn_with_kvcache(
            self.q, self.k_cache, self.v_cache, self.k, self.v,
            cache_seqlens=self.seqlens() if cache_seqlens is None else cache_seqlens,
            cache_batch_idx=self.cache_batch_idx, block_table=self.block_table, **kwargs)


LAYOUTS = [dict(page=0), dict(page=0, batch_idx=True), dict(page=1), dict(page=3),
           dict(page=16), dict(page=256)]
MASKS = [dict(causal=False), dict(causal=True),
         dict(causal=True, window_size=(3, 0), softcap=5.0)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: str(x))
@pytest.mark.parametrize("mask", MASKS, ids=lambda x: str(x))
def test_against_f64_reference_with_append(layout, mask):
    c = Case(**layout)
    want_k, want_v = c.expected_caches()
    o, lse = c.run(return_softmax_lse=True, **mask)
    # The append: the whole cache, element by element (untouched ones too).
    assert torch.equal(c.k_cache, want_k)
    assert torch.equal(c.v_cache, want_v)
    window = mask.get("window_size", (-1, 0))[0] + 1
    ref_o, ref_lse = reference(c.q, want_k, want_v, [n + c.t_new for n in c.cached],
                               c.block_table, c.cache_batch_idx, causal=mask["causal"],
                               window=window, softcap=mask.get("softcap", 0.0))
    assert o.shape == c.q.shape and o.dtype == c.q.dtype
    assert lse.shape == (3, 4, 2) and lse.dtype == torch.float32
    assert rel(o, ref_o) < 1e-5
    assert rel(lse, ref_lse) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: str(x))
def test_without_new_keys_nothing_is_written(layout):
    c = Case(t_new=0, cached=(7, 1, 20), Tq=1, **layout)
    before_k, before_v = c.k_cache.clone(), c.v_cache.clone()
    o = c.run(causal=True)
    assert torch.equal(c.k_cache, before_k) and torch.equal(c.v_cache, before_v)
    ref_o, _ = reference(c.q, c.k_cache, c.v_cache, c.cached, c.block_table, c.cache_batch_idx,
                         causal=True)
    assert rel(o, ref_o) < 1e-5


def test_cache_seqlens_int_equals_tensor():
    a, b = Case(cached=(6, 6, 6)), Case(cached=(6, 6, 6))
    got_int = a.run(cache_seqlens=6, causal=True)
    got_tensor = b.run(cache_seqlens=torch.full((3,), 6, dtype=torch.int32), causal=True)
    assert torch.equal(got_int, got_tensor)
    assert torch.equal(a.k_cache, b.k_cache)


def test_cache_seqlens_none_uses_the_whole_cache():
    c = Case(t_new=0, page=4, capacity=12, Tq=1)
    o = gt.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, block_table=c.block_table)
    ref_o, _ = reference(c.q, c.k_cache, c.v_cache, [12] * 3, c.block_table)
    assert rel(o, ref_o) < 1e-5


def test_empty_sequence_gives_zero_and_minus_inf():
    c = Case(t_new=0, cached=(0, 4, 0), Tq=1)
    o, lse = c.run(return_softmax_lse=True)
    assert torch.equal(o[0], torch.zeros_like(o[0])) and torch.equal(o[2], torch.zeros_like(o[2]))
    assert torch.isneginf(lse[0]).all() and torch.isneginf(lse[2]).all()
    assert torch.isfinite(lse[1]).all()


def test_bfloat16_cache():
    c = Case(page=16)
    for name in ("q", "k", "v", "k_cache", "v_cache"):
        setattr(c, name, getattr(c, name).to(torch.bfloat16))
    want_k, want_v = c.expected_caches()
    o = c.run(causal=True)
    assert o.dtype == torch.bfloat16
    assert torch.equal(c.k_cache, want_k) and torch.equal(c.v_cache, want_v)
    ref_o, _ = reference(c.q, want_k, want_v, [n + 3 for n in c.cached], c.block_table,
                         causal=True)
    assert rel(o, ref_o) < 2e-2


@pytest.mark.parametrize("kwargs, match", [
    (dict(rotary_cos=torch.ones(1), rotary_sin=torch.ones(1)), "rotary"),
    (dict(cache_leftpad=torch.zeros(3, dtype=torch.int32)), "cache_leftpad"),
    (dict(alibi_slopes=torch.ones(4)), "alibi_slopes"),
])
def test_unsupported_arguments_raise(kwargs, match):
    c = Case()
    before = c.k_cache.clone()
    with pytest.raises(gqattn.Error, match=f"{match}.*not supported"):
        c.run(**kwargs)
    assert torch.equal(c.k_cache, before)


def test_num_splits_is_a_hint():
    a, b = Case(), Case()
    assert torch.equal(a.run(num_splits=0), b.run(num_splits=7))


def test_batch_invariant_keyword_reaches_the_library(monkeypatch):
    seen = []
    real = gqattn._ext.forward_with_kv_cache

    def spy(*args, **kwargs):
        seen.append(kwargs["batch_invariant"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gqattn._ext, "forward_with_kv_cache", spy)
    c = Case(page=3)
    want = Case(page=3).run()
    assert torch.equal(c.run(batch_invariant=True), want)  # the CPU never splits by the batch
    assert seen == [False, True]


def test_bad_block_table_raises_naming_it():
    c = Case(page=3)
    before_k, before_v = c.k_cache.clone(), c.v_cache.clone()
    c.block_table[2, 1] = c.k_cache.shape[0]  # one page past the cache
    with pytest.raises(gqattn.Error, match=r"block_table\[2, 1\]") as e:
        c.run()
    assert "block_table" in e.value.argument
    assert torch.equal(c.k_cache, before_k) and torch.equal(c.v_cache, before_v)
    c.block_table[2, 1] = -1
    with pytest.raises(gqattn.Error, match=r"block_table\[2, 1\] = -1"):
        c.run()


def test_other_bad_arguments_raise():
    c = Case()
    with pytest.raises(gqattn.Error, match=r"cache_seqlens\[2\] = 18"):
        c.run(cache_seqlens=torch.tensor([0, 0, 18], dtype=torch.int32))  # 18 + 3 > 20
    with pytest.raises(gqattn.Error, match="int32"):
        c.run(cache_seqlens=torch.tensor([0, 0, 1]))  # int64
    c.cache_batch_idx = torch.tensor([0, 1, 9], dtype=torch.int32)  # 5 cache rows
    with pytest.raises(gqattn.Error, match=r"cache_batch_idx\[2\] = 9"):
        c.run()
    c.cache_batch_idx = None
    with pytest.raises(gqattn.Error, match="cache_seqlens"):
        gt.flash_attn_with_kvcache(c.q, c.k_cache, c.v_cache, c.k, c.v)
    with pytest.raises(ValueError, match="window_size"):
        c.run(window_size=(2, 2))


def test_opcheck_custom_ops():
    c = Case(page=3)
    args = (c.q, c.k_cache, c.v_cache, c.k, c.v, c.seqlens(), None, c.block_table, True, 0, 0.0,
            None, "auto", True, False)
    torch.library.opcheck(torch.ops.gqattn.kv_cache_forward.default, args)
    d = Case(batch_idx=True, t_new=0)
    args = (d.q, d.k_cache, d.v_cache, None, None, d.seqlens(), d.cache_batch_idx, None, False, 4,
            0.0, 0.5, "auto", False, True)
    torch.library.opcheck(torch.ops.gqattn.kv_cache_forward.default, args)
    o_a, o_b = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    lse_a, lse_b = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    torch.library.opcheck(torch.ops.gqattn.merge_attention_states.default,
                          (o_a, lse_a, o_b, lse_b))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_decode_step(backend):
    # A decode step: append one key per sequence to a paged cache, attend.
    # Compiled without a graph break, it gives the eager outputs and caches.
    torch._dynamo.reset()

    def step(q, k_cache, v_cache, k, v, seqlens, table):
        return gt.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                          block_table=table, causal=True,
                                          return_softmax_lse=True)

    eager = Case(page=16, t_new=1, Tq=1, capacity=48, cached=(30, 3, 16))
    compiled_case = Case(page=16, t_new=1, Tq=1, capacity=48, cached=(30, 3, 16))
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for t in range(3):  # three steps: the cache grows in place
        lengths = [n + t for n in eager.cached]
        seqlens = torch.tensor(lengths, dtype=torch.int32)
        want = step(eager.q, eager.k_cache, eager.v_cache, eager.k, eager.v, seqlens,
                    eager.block_table)
        got = compiled(compiled_case.q, compiled_case.k_cache, compiled_case.v_cache,
                       compiled_case.k, compiled_case.v, seqlens, compiled_case.block_table)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert torch.equal(compiled_case.k_cache, eager.k_cache)
        assert torch.equal(compiled_case.v_cache, eager.v_cache)
        eager.k, eager.v = eager.k + 1, eager.v - 1
        compiled_case.k, compiled_case.v = eager.k.clone(), eager.v.clone()


def test_check_offsets_on_in_eager_off_under_compile(monkeypatch):
    # Eager calls let the library check the int32 vectors (a host copy for
    # CUDA ones); compiled ones must not (no host sync inside a graph).
    seen = []
    real = gqattn._ext.forward_with_kv_cache

    def spy(*args, **kwargs):
        seen.append(kwargs["check_offsets"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gqattn._ext, "forward_with_kv_cache", spy)
    c = Case(page=16, t_new=1, Tq=1)
    c.run(causal=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda: c.run(causal=True), fullgraph=True, backend="aot_eager")
    compiled()
    assert seen == [True, False]


def test_strided_inputs():
    # q and the new keys as transposed views; a cache with strided rows
    # (written in place through its strides).
    c = Case()
    q = c.q.transpose(1, 2).contiguous().transpose(1, 2)
    k_cache = c.k_cache.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q.is_contiguous() and not k_cache.is_contiguous()
    want_k, want_v = c.expected_caches()
    o = gt.flash_attn_with_kvcache(q, k_cache, c.v_cache, c.k, c.v, cache_seqlens=c.seqlens(),
                                   causal=True)
    assert torch.equal(k_cache, want_k) and torch.equal(c.v_cache, want_v)
    ref_o, _ = reference(c.q, want_k, want_v, [n + 3 for n in c.cached], causal=True)
    assert rel(o, ref_o) < 1e-5


def test_merge_two_halves_of_the_keys_is_the_whole():
    g = torch.Generator().manual_seed(3)
    B, Tq, Tk, H, Hkv, d, split = 2, 6, 20, 4, 2, 16, 15
    q = torch.randn(B, Tq, H, d, generator=g)
    k, v = torch.randn(B, Tk, Hkv, d, generator=g), torch.randn(B, Tk, Hkv, d, generator=g)
    # Each half at the queries' positions in the whole (q_start); causal:
    # the early queries keep none of the second half (lse = -inf there).
    o_a, lse_a = gt.attention(q, k[:, :split], v[:, :split], causal=True, q_start=Tk - Tq,
                              return_lse=True)
    o_b, lse_b = gt.attention(q, k[:, split:], v[:, split:], causal=True,
                              q_start=Tk - Tq - split, return_lse=True)
    assert torch.isneginf(lse_b).any()
    o, lse = gt.merge_attention_states(o_a, lse_a, o_b, lse_b)
    want_o, want_lse = gt.attention(q, k, v, causal=True, return_lse=True)
    assert rel(o, want_o) < 1e-5
    assert rel(lse, want_lse) < 1e-5
    # The merge is symmetric.
    o2, lse2 = gt.merge_attention_states(o_b, lse_b, o_a, lse_a)
    assert rel(o2, want_o) < 1e-5


def test_merge_rows_without_keys_on_both_sides():
    o_a, o_b = torch.ones(1, 2, 1, 4), torch.full((1, 2, 1, 4), 3.0)
    lse_a = torch.tensor([[[-math.inf, 0.0]]])
    lse_b = torch.tensor([[[-math.inf, -math.inf]]])
    o, lse = gt.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert torch.equal(o[0, 0], torch.zeros(1, 4))
    assert torch.isneginf(lse[0, 0, 0])
    assert torch.equal(o[0, 1], o_a[0, 1]) and lse[0, 0, 1].item() == 0.0


def test_merge_bad_arguments_raise():
    o = torch.randn(1, 2, 3, 4)
    with pytest.raises(gqattn.Error, match="lse_a"):
        gt.merge_attention_states(o, torch.randn(1, 2, 3), o, torch.randn(1, 3, 2))


def test_merge_compiles():
    torch._dynamo.reset()
    o_a, o_b = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    lse_a, lse_b = torch.randn(1, 2, 3), torch.randn(1, 2, 3)
    compiled = torch.compile(gt.merge_attention_states, fullgraph=True, backend="aot_eager")
    for g, w in zip(compiled(o_a, lse_a, o_b, lse_b),
                    gt.merge_attention_states(o_a, lse_a, o_b, lse_b)):
        assert torch.equal(g, w)


def test_flash_attn_interface_fa3_argument_order():
    from gqattn.flash_attn_interface import flash_attn_with_kvcache as fa3
    a, b = Case(page=3), Case(page=3)
    want = a.run(causal=True, softmax_scale=0.3, return_softmax_lse=True)
    # FA3's positional order: q, k_cache, v_cache, k, v, qv, rotary_cos,
    # rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, page_table.
    got = fa3(b.q, b.k_cache, b.v_cache, b.k, b.v, None, None, None, b.seqlens(), None, None,
              b.block_table, softmax_scale=0.3, causal=True, num_splits=3, pack_gqa=True,
              return_softmax_lse=True)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(a.k_cache, b.k_cache)
    for kwargs in (dict(qv=b.q), dict(q_descale=torch.ones(1)), dict(attention_chunk=4),
                   dict(cu_seqlens_q=torch.zeros(4, dtype=torch.int32))):
        with pytest.raises(gqattn.Error, match="not supported"):
            fa3(b.q, b.k_cache, b.v_cache, cache_seqlens=b.seqlens(), page_table=b.block_table,
                **kwargs)


# ---- CUDA (skipped without a GPU) ----------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (torch.cuda.is_available() is False)")


def _to(case, device, dtype=None):
    for name in ("q", "k", "v", "k_cache", "v_cache", "block_table", "cache_batch_idx"):
        t = getattr(case, name)
        if t is not None:
            floating = t.is_floating_point()
            setattr(case, name, t.to(device, dtype=dtype if floating and dtype else t.dtype))
    return case


@needs_cuda
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: str(x))
def test_cuda_against_f64_reference(layout):
    c = _to(Case(**layout), "cuda", torch.bfloat16)
    want_k, want_v = c.expected_caches()
    o, lse = c.run(causal=True, return_softmax_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(c.k_cache, want_k) and torch.equal(c.v_cache, want_v)
    lengths = [n + c.t_new for n in c.cached]
    ref_o, ref_lse = reference(c.q.cpu(), want_k.cpu(), want_v.cpu(), lengths,
                               None if c.block_table is None else c.block_table.cpu(),
                               None if c.cache_batch_idx is None else c.cache_batch_idx.cpu(),
                               causal=True)
    assert rel(o.cpu(), ref_o) < 2e-2
    assert rel(lse.cpu(), ref_lse) < 1e-3


@needs_cuda
def test_cuda_bad_block_table_raises_in_eager():
    c = _to(Case(page=3), "cuda", torch.bfloat16)
    c.block_table[1, 0] = 10**6
    with pytest.raises(gqattn.Error, match=r"block_table\[1, 0\]"):
        c.run()


@needs_cuda
def test_cuda_graph_decode_step_replays_eagerly():
    # A decode step captured in a CUDA graph (check_offsets off there) and
    # replayed over new keys and lengths gives the eager outputs and caches.
    def make():
        return _to(Case(page=16, t_new=1, Tq=1, capacity=64, cached=(40, 3, 17)), "cuda",
                   torch.bfloat16)

    eager, static = make(), make()
    eager.run(causal=True)
    eager, static = make(), make()
    seqlens = static.seqlens().cuda()

    def step():
        return gt.flash_attn_with_kvcache(static.q, static.k_cache, static.v_cache, static.k,
                                          static.v, cache_seqlens=seqlens,
                                          block_table=static.block_table, causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    eager.k_cache.copy_(static.k_cache)  # the warm-up appended once; start equal
    eager.v_cache.copy_(static.v_cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for t in range(1, 4):
        lengths = torch.tensor([n + t for n in eager.cached], dtype=torch.int32, device="cuda")
        k, v = torch.randn_like(eager.k), torch.randn_like(eager.v)
        want = gt.flash_attn_with_kvcache(eager.q, eager.k_cache, eager.v_cache, k, v,
                                          cache_seqlens=lengths, block_table=eager.block_table,
                                          causal=True)
        seqlens.copy_(lengths)
        static.k.copy_(k)
        static.v.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(static.k_cache, eager.k_cache)
        assert torch.equal(static.v_cache, eager.v_cache)


@needs_cuda
def test_cuda_merge_matches_cpu_and_captures():
    g = torch.Generator().manual_seed(5)
    o_a, o_b = (torch.randn(2, 5, 4, 64, generator=g) for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 4, 5, generator=g) for _ in range(2))
    lse_b[0, 0] = -math.inf
    want_o, want_lse = gt.merge_attention_states(o_a, lse_a, o_b, lse_b)
    inputs = [t.cuda() for t in (o_a, lse_a, o_b, lse_b)]
    o, lse = gt.merge_attention_states(*inputs)
    assert rel(o.cpu(), want_o) < 1e-6 and rel(lse.cpu(), want_lse) < 1e-6
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gt.merge_attention_states(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        got = gt.merge_attention_states(*inputs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], o) and torch.equal(got[1], lse)
