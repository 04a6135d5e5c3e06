"""The drop-ins: FlashAttention-2's
return_attn_probs, FlashAttention-3's flash_attn_func
(gqattn.flash_attn_interface), SDPA's layout
(gqattn.torch.scaled_dot_product_attention) and Hugging Face's attention
interface (gqattn.hf). On the CPU; torch tests skip without torch, Hugging
Face tests without transformers.
"""

import math
import sys

import pytest

import gqattn

# gqattn.release_workspace_memory needs no torch: python/tests/test_workspace.py.

torch = pytest.importorskip("torch", reason="the drop-ins are PyTorch functions; torch is "
                            "not installed")
F = torch.nn.functional

import gqattn.torch as gt  # noqa: E402
from gqattn.flash_attn_interface import flash_attn_func as fa3  # noqa: E402


def make(B, Tq, Tk, H, Hkv, d, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, h, d, generator=g, requires_grad=grad)
               for T, h in ((Tq, H), (Tk, Hkv), (Tk, Hkv)))
    return q, k, v


def ref(q, k, v, causal=False, window=0, scale=None, softcap=0.0):
    """Explicit f64 math in gqattn's layout; returns (o, lse)."""
    B, Tq, H, d = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    qd, kd, vd = (t.detach().double() for t in (q, k, v))
    kd = kd.repeat_interleave(H // Hkv, dim=2)
    vd = vd.repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * (1 / math.sqrt(d) if scale is None else scale)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window > 0:
        keep &= j >= i - window + 1
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vd), lse


def close(a, b, tol=2e-5):
    assert torch.allclose(a.double(), b.double(), atol=tol, rtol=tol), (a.double() - b).abs().max()


# ---- FlashAttention-2: return_attn_probs --------------------------------------


def test_fa2_return_attn_probs_returns_out_lse_none():
    q, k, v = make(2, 7, 9, 4, 2, 16)
    out, lse, probs = gt.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32
    o_ref, lse_ref = ref(q, k, v, causal=True)
    close(out, o_ref)
    close(lse, lse_ref)
    assert torch.equal(out, gt.flash_attn_func(q, k, v, causal=True))


def test_fa2_positional_dropout_still_refused():
    q, k, v = make(1, 4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match=r"dropout_p=0.125 is not supported"):
        gt.flash_attn_func(q, k, v, 0.125, True)


# ---- FlashAttention-3 ------------------------------------------------------------


def test_fa3_positional_order_is_scale_then_causal():
    # FA3 has no dropout_p: flash_attn_func(q, k, v, 0.125, True) is scale 0.125, causal.
    q, k, v = make(2, 6, 10, 4, 1, 16)
    out = fa3(q, k, v, 0.125, True)
    close(out, ref(q, k, v, causal=True, scale=0.125)[0])


def test_fa3_returns_out_or_out_lse():
    q, k, v = make(1, 5, 5, 2, 2, 8)
    out = fa3(q, k, v)
    assert isinstance(out, torch.Tensor)
    out2, lse = fa3(q, k, v, return_attn_probs=True)
    assert torch.equal(out, out2)
    close(lse, ref(q, k, v)[1])


@pytest.mark.parametrize("window_size,causal,expect", [
    ((-1, -1), False, dict()),
    ((-1, -1), True, dict(causal=True)),
    ((3, 0), False, dict(causal=True, window=4)),
    ((3, 0), True, dict(causal=True, window=4)),
    ((2, -1), False, dict(window=3)),
])
def test_fa3_window_size(window_size, causal, expect):
    q, k, v = make(2, 9, 11, 4, 2, 8)
    out = fa3(q, k, v, causal=causal, window_size=window_size, softcap=5.0)
    close(out, ref(q, k, v, softcap=5.0, **expect)[0])


def test_fa3_ignores_performance_knobs_and_has_gradients():
    q, k, v = make(1, 6, 6, 4, 2, 8, grad=True)
    out = fa3(q, k, v, causal=True, num_splits=3, pack_gqa=True, sm_margin=4,
              deterministic=True)
    out.square().sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    gt.attention(q2, k2, v2, causal=True).square().sum().backward()
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    (dict(qv=torch.ones(1)), r"qv is not supported"),
    (dict(q_descale=torch.ones(1)), r"q_descale is not supported"),
    (dict(v_descale=torch.ones(1)), r"v_descale is not supported"),
    (dict(attention_chunk=64), r"attention_chunk=64 is not supported"),
    (dict(window_size=(2, 3)), r"flash_attn_interface.flash_attn_func: window_size=\(2, 3\) "
                               r"with causal=False is not supported"),
    (dict(window_size=(2, -1), causal=True), r"window_size=\(2, -1\) with causal=True"),
])
def test_fa3_unsupported(kwargs, match):
    q, k, v = make(1, 4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match=match):
        fa3(q, k, v, **kwargs)


def test_fa3_module_via_package_attribute():
    assert gqattn.flash_attn_interface.flash_attn_func is fa3


# ---- SDPA layout -------------------------------------------------------------------


@pytest.mark.parametrize("Tq,Tk,H,Hkv,causal,scale", [
    (8, 8, 4, 4, True, None),
    (8, 8, 4, 2, True, 0.3),
    (5, 9, 4, 1, False, None),
    (9, 5, 2, 2, False, 0.5),
])
def test_sdpa_matches_torch(Tq, Tk, H, Hkv, causal, scale):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, Tq, 16, generator=g, requires_grad=True)
    k = torch.randn(2, Hkv, Tk, 16, generator=g, requires_grad=True)
    v = torch.randn(2, Hkv, Tk, 16, generator=g, requires_grad=True)
    gqa = H != Hkv
    out = gt.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=gqa)
    expect = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                            enable_gqa=gqa)
    assert out.shape == expect.shape
    close(out, expect, 1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expect_grads = torch.autograd.grad(expect.square().sum(), (q, k, v))
    for a, b in zip(grads, expect_grads):
        close(a, b, 1e-4)


def test_sdpa_passes_views_without_copies(monkeypatch):
    # [B, H, T, d] contiguous tensors reach gqattn as transpose(1, 2) views.
    seen = []
    real = gt.attention

    def spy(q, k, v, **kw):
        seen.extend((q, k, v))
        return real(q, k, v, **kw)

    monkeypatch.setattr(gt, "attention", spy)
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    out = gt.scaled_dot_product_attention(q, k, v)
    for src, passed in zip((q, k, v), seen):
        assert passed.data_ptr() == src.data_ptr()
        assert passed.shape == (1, 6, 2, 8)
    assert out.shape == (1, 2, 6, 8)


@pytest.mark.parametrize("kwargs,shapes,match", [
    (dict(attn_mask=torch.ones(4, 4, dtype=torch.bool)), None, r"attn_mask is not supported"),
    (dict(dropout_p=0.1), None, r"dropout_p=0.1 is not supported"),
    (dict(is_causal=True), (4, 6), r"not supported: SDPA's is_causal is top-left aligned; "
                                   r"gqattn aligns bottom-right \(equal for Tq == Tk\)"),
    (dict(), "gqa", r"enable_gqa=True"),
])
def test_sdpa_unsupported(kwargs, shapes, match):
    Tq, Tk = shapes if isinstance(shapes, tuple) else (4, 4)
    Hkv = 1 if shapes == "gqa" else 2
    q = torch.randn(1, 2, Tq, 8)
    k = torch.randn(1, Hkv, Tk, 8)
    with pytest.raises(ValueError, match=match):
        gt.scaled_dot_product_attention(q, k, k, **kwargs)


# ---- Hugging Face ------------------------------------------------------------------


def test_hf_register_without_transformers_raises_import_error(monkeypatch):
    import gqattn.hf as hf

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match="needs Hugging Face transformers"):
        hf.register()


class _Module(torch.nn.Module):
    def __init__(self, is_causal=True):
        super().__init__()
        self.is_causal = is_causal


def _hf_inputs(B=2, H=4, Hkv=2, Tq=7, Tk=7, d=16):
    g = torch.Generator().manual_seed(2)
    return (torch.randn(B, H, Tq, d, generator=g), torch.randn(B, Hkv, Tk, d, generator=g),
            torch.randn(B, Hkv, Tk, d, generator=g))


def _hf_keep(Tq, Tk, window=0):
    i = torch.arange(Tq)[:, None] + Tk - Tq
    j = torch.arange(Tk)[None, :]
    keep = j <= i
    if window:
        keep &= j > i - window
    return keep


@pytest.mark.parametrize("Tq,Tk", [(7, 7), (3, 9), (1, 9)])
def test_hf_forward_matches_sdpa(Tq, Tk):
    from gqattn.hf import gqattn_attention_forward

    q, k, v = _hf_inputs(Tq=Tq, Tk=Tk)
    mask = _hf_keep(Tq, Tk)
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2,
                                            enable_gqa=True).transpose(1, 2)
    for m in (None, mask[None, None], mask[None, None].expand(2, 1, Tq, Tk),
              torch.zeros(Tq, Tk).masked_fill(~mask, torch.finfo(torch.float32).min)[None, None],
              torch.ones(2, Tk, dtype=torch.long)):
        out, weights = gqattn_attention_forward(_Module(), q, k, v, m, scaling=0.2)
        assert weights is None and out.shape == (2, Tq, 4, 16)
        close(out, expect, 1e-5)


def test_hf_sliding_window_and_softcap():
    from gqattn.hf import gqattn_attention_forward

    q, k, v = _hf_inputs(Tq=10, Tk=10)
    keep = _hf_keep(10, 10, window=3)
    out, _ = gqattn_attention_forward(_Module(), q, k, v, keep[None, None], sliding_window=3,
                                      softcap=4.0)
    close(out, ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                   window=3, softcap=4.0)[0])


def test_hf_not_causal_module():
    from gqattn.hf import gqattn_attention_forward

    q, k, v = _hf_inputs()
    out, _ = gqattn_attention_forward(_Module(is_causal=False), q, k, v, None)
    close(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2), 1e-5)
    # The is_causal keyword wins over the module's attribute, as in HF's SDPA path.
    out, _ = gqattn_attention_forward(_Module(is_causal=False), q, k, v, None, is_causal=True)
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=True).transpose(1, 2), 1e-5)


def test_hf_refusals():
    from gqattn.hf import gqattn_attention_forward

    q, k, v = _hf_inputs()
    keep = _hf_keep(7, 7)
    padded = keep[None, None].repeat(2, 1, 1, 1)
    padded[1, :, :, 0] = False  # sequence 1 left-padded by one token
    pad2d = torch.ones(2, 7, dtype=torch.long)
    pad2d[0, 0] = 0
    cases = [
        (dict(attention_mask=padded), r"not supported: it is not the plain causal mask"),
        (dict(attention_mask=pad2d), r"with padding is not supported"),
        (dict(attention_mask=keep[None, None], is_causal=False), r"not the plain no mask"),
        (dict(attention_mask=None, dropout=0.1), r"dropout=0.1 is not supported"),
        (dict(attention_mask=None, output_attentions=True), r"output_attentions=True"),
        (dict(attention_mask=None, s_aux=torch.zeros(4)), r"s_aux"),
        (dict(attention_mask=None, sliding_window=4, is_causal=False), r"without causal"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            gqattn_attention_forward(_Module(), q, k, v, **kwargs)


def test_hf_register_and_tiny_llama():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import gqattn.hf as hf

    hf.register()
    assert transformers.AttentionInterface._global_mapping["gqattn"] is \
        hf.gqattn_attention_forward
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expect = model(ids).logits
        model.set_attn_implementation("gqattn")
        got = model(ids).logits
        close(got, expect, 1e-4)
        # A padded batch is refused, not silently attended over.
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[0, :3] = 0
        with pytest.raises(ValueError, match="not supported"):
            model(ids, attention_mask=mask)
