"""Hugging Face packed (padding-free) batches through gqattn.hf /
gqattn.transformers: transformers' FlashAttention keywords (cu_seq_lens_q/k,
max_length_q/k) and position_ids-only packing, against the same sequences
run one at a time; tiny random models built from configs (nothing
downloaded). On the CPU; skipped without torch, the model tests without
transformers.
"""

import pytest

torch = pytest.importorskip("torch", reason="gqattn.hf is a PyTorch function; torch is not "
                            "installed")
F = torch.nn.functional

from gqattn.hf import gqattn_attention_forward  # noqa: E402

LENGTHS = (5, 1, 11)  # odd lengths, one sequence of a single token


def close(a, b, tol=2e-5):
    assert torch.allclose(a.double(), b.double(), atol=tol, rtol=tol), (a.double() - b).abs().max()


class _Module(torch.nn.Module):
    def __init__(self, is_causal=True):
        super().__init__()
        self.is_causal = is_causal


def _cu(lengths=LENGTHS):
    return torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                        dtype=torch.int32)


def _position_ids(lengths=LENGTHS):
    return torch.cat([torch.arange(n) for n in lengths])[None]


def _packed_inputs(H=4, Hkv=2, d=16, lengths=LENGTHS, grad=False):
    g = torch.Generator().manual_seed(3)
    total = sum(lengths)
    return tuple(torch.randn(1, h, total, d, generator=g, requires_grad=grad)
                 for h in (H, Hkv, Hkv))


def _one_at_a_time(q, k, v, lengths=LENGTHS, **kwargs):
    # Each sequence alone through the dense path, concatenated along T.
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        outs.append(gqattn_attention_forward(_Module(), q[:, :, s], k[:, :, s], v[:, :, s], None,
                                             **kwargs)[0])
        start += n
    return torch.cat(outs, dim=1)


def _sdpa_one_at_a_time(q, k, v, lengths=LENGTHS, window=0, scale=None):
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        keep = j <= i
        if window:
            keep &= j > i - window
        outs.append(F.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s],
                                                   attn_mask=keep, scale=scale,
                                                   enable_gqa=True).transpose(1, 2))
        start += n
    return torch.cat(outs, dim=1)


def _flash_kwargs(lengths=LENGTHS):
    cu = _cu(lengths)
    return dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=max(lengths),
                max_length_k=max(lengths))


# ---- the function ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cu_seq_lens", "position_ids"])
@pytest.mark.parametrize("window,softcap", [(0, None), (3, None), (4, 5.0)])
def test_packed_matches_one_at_a_time(how, window, softcap):
    q, k, v = _packed_inputs(grad=True)
    packing = _flash_kwargs() if how == "cu_seq_lens" else dict(position_ids=_position_ids())
    out, weights = gqattn_attention_forward(_Module(), q, k, v, None, scaling=0.3,
                                            sliding_window=window or None, softcap=softcap,
                                            **packing)
    assert weights is None and out.shape == (1, sum(LENGTHS), 4, 16)
    expect = _one_at_a_time(q, k, v, scaling=0.3, sliding_window=window or None,
                            softcap=softcap)
    assert torch.equal(out, expect)  # batch invariance: the same bits alone and packed
    if softcap is None:
        close(out, _sdpa_one_at_a_time(q, k, v, window=window, scale=0.3), 1e-5)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    grads_expect = torch.autograd.grad(expect, (q, k, v), do)
    for a, b in zip(grads, grads_expect):
        close(a, b, 1e-5)


def test_packed_not_causal_and_accepted_masks():
    q, k, v = _packed_inputs()
    # Not causal: each sequence attends to all of its own keys, none of the others'.
    out, _ = gqattn_attention_forward(_Module(is_causal=False), q, k, v, None, **_flash_kwargs())
    start, parts = 0, []
    for n in LENGTHS:
        s = slice(start, start + n)
        parts.append(F.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s],
                                                    enable_gqa=True).transpose(1, 2))
        start += n
    close(out, torch.cat(parts, dim=1), 1e-5)
    # An all-keep 2-D mask and the block-diagonal 4-D causal mask are accepted.
    expect = _one_at_a_time(q, k, v)
    seq = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    pos = _position_ids()[0]
    block = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
    T = sum(LENGTHS)
    for mask in (torch.ones(1, T, dtype=torch.long), block[None, None],
                 torch.zeros(T, T).masked_fill(~block, torch.finfo(torch.float32).min)[None,
                                                                                       None]):
        for packing in (_flash_kwargs(), dict(position_ids=_position_ids())):
            out, _ = gqattn_attention_forward(_Module(), q, k, v, mask, **packing)
            assert torch.equal(out, expect)


def test_packed_kwargs_compile_fullgraph():
    # With the cu_seq_lens keywords nothing is read on the host.
    q, k, v = _packed_inputs()
    kwargs = _flash_kwargs()

    def f(q, k, v, cu_q, cu_k):
        return gqattn_attention_forward(_Module(), q, k, v, None, sliding_window=4,
                                        cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k,
                                        max_length_q=11, max_length_k=11)[0]

    compiled = torch.compile(f, fullgraph=True)
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    assert torch.equal(compiled(q, k, v, cu_q, cu_k), f(q, k, v, cu_q, cu_k))


def test_unpacked_position_ids_keep_the_dense_path():
    # One run of positions per row (a plain batch, chunked prefill with a cache,
    # decoding) is not a packed batch.
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 6, 16, generator=g)
    k, v = (torch.randn(2, 2, 9, 16, generator=g) for _ in range(2))
    expect, _ = gqattn_attention_forward(_Module(), q, k, v, None)
    for position_ids in (torch.arange(3, 9)[None], torch.arange(3, 9)[None].expand(2, 6)):
        out, _ = gqattn_attention_forward(_Module(), q, k, v, None, position_ids=position_ids)
        assert torch.equal(out, expect)
    out, _ = gqattn_attention_forward(_Module(), q[:, :, -1:], k, v, None,
                                      position_ids=torch.tensor([[8], [8]]))
    assert torch.equal(out, expect[:, -1:])


def test_packed_refusals():
    q, k, v = _packed_inputs()
    T = sum(LENGTHS)
    q2, k2, v2 = (torch.cat([t, t]) for t in (q, k, v))  # B = 2
    cu = _cu()
    full4d = torch.ones(1, 1, T, T, dtype=torch.bool).tril()  # plain causal: crosses sequences
    cases = [
        ((q2, k2, v2), dict(**_flash_kwargs()),
         r"cu_seq_lens_q/k with batch size B = 2 is not supported: a packed batch is one row"),
        ((q, k, v), dict(cu_seq_lens_q=cu),
         r"without cu_seq_lens_k is not supported"),
        ((q, k, v), dict(attention_mask=full4d, **_flash_kwargs()),
         r"with a packed batch is not supported: it is not the per-sequence causal mask"),
        ((q, k, v), dict(attention_mask=full4d, position_ids=_position_ids()),
         r"with a packed batch is not supported: it is not the per-sequence causal mask"),
        ((q, k[:, :, :T - 1], v[:, :, :T - 1]), dict(position_ids=_position_ids()),
         r"Tq = 17 != Tk = 16 is not supported"),
        ((q, k, v), dict(position_ids=torch.cat([torch.arange(1, 6), torch.arange(12)])[None]),
         r"first entry is not the smallest is not supported"),
        ((q, k, v), dict(cu_seq_lens_q=cu.float(), cu_seq_lens_k=cu),
         r"cu_seq_lens_q of shape \(4,\) and dtype torch.float32 is not supported"),
    ]
    pad = torch.ones(1, T, dtype=torch.long)
    pad[0, 0] = 0
    cases.append(((q, k, v), dict(attention_mask=pad, **_flash_kwargs()),
                  r"with padding is not supported"))
    cases.append(((q, k, v), dict(attention_mask=pad, position_ids=_position_ids()),
                  r"with padding is not supported"))
    for (qq, kk, vv), kwargs, match in cases:
        kwargs.setdefault("attention_mask", None)
        with pytest.raises(ValueError, match=match):
            gqattn_attention_forward(_Module(), qq, kk, vv, **kwargs)
    # Offsets that do not cover the packed rows: gqattn's own error (a ValueError).
    bad = _flash_kwargs()
    bad["cu_seq_lens_q"] = bad["cu_seq_lens_k"] = torch.tensor([0, 5, 6, 16], dtype=torch.int32)
    with pytest.raises(ValueError):
        gqattn_attention_forward(_Module(), q, k, v, None, **bad)
    with pytest.raises(ValueError, match=r"must end at the packed rows, \(17, 17\)"):
        gqattn_attention_forward(_Module(), q, k, v, torch.ones(1, 1, T, T, dtype=torch.bool),
                                 **bad)
    # The other refusals stay.
    with pytest.raises(ValueError, match=r"dropout=0.1 is not supported"):
        gqattn_attention_forward(_Module(), q, k, v, None, dropout=0.1, **_flash_kwargs())
    with pytest.raises(ValueError, match=r"without causal"):
        gqattn_attention_forward(_Module(), q, k, v, None, sliding_window=3, is_causal=False,
                                 **_flash_kwargs())


def test_gqattn_transformers_module_reexports_hf(monkeypatch):
    import sys

    import gqattn.hf
    import gqattn.transformers

    assert gqattn.transformers.register is gqattn.hf.register
    assert gqattn.transformers.gqattn_attention_forward is gqattn.hf.gqattn_attention_forward
    # gqattn.transformers does not stand in for Hugging Face's package.
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="needs Hugging Face transformers"):
        gqattn.transformers.register()


# ---- tiny models ---------------------------------------------------------------------


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed")


def _sequences(vocab, lengths=LENGTHS, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def _packed_vs_one_at_a_time(model, reference, vocab, tol=1e-4):
    transformers = _transformers()
    import gqattn.transformers as gtr

    gtr.register()
    seqs = _sequences(vocab)
    g = torch.Generator().manual_seed(6)
    total = sum(LENGTHS)
    weights = torch.randn(1, total, vocab, generator=g)

    # The same sequences one at a time through the reference implementation.
    model.set_attn_implementation(reference)
    model.zero_grad()
    logits, start = [], 0
    for s in seqs:
        out = model(input_ids=s[None]).logits
        (out * weights[:, start:start + len(s)]).sum().backward()
        logits.append(out.detach())
        start += len(s)
    expect = torch.cat(logits, dim=1)
    expect_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.set_attn_implementation("gqattn")
    collators = {
        "position_ids": transformers.DataCollatorWithFlattening(),
        "cu_seq_lens": transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True),
    }
    for how, collator in collators.items():
        batch = collator([{"input_ids": s.tolist()} for s in seqs])
        batch.pop("labels")
        assert ("cu_seq_lens_q" in batch) == (how == "cu_seq_lens")
        assert batch["input_ids"].shape == (1, total)
        model.zero_grad()
        got = model(**batch).logits
        (got * weights).sum().backward()
        close(got.detach(), expect, tol)
        for n, p in model.named_parameters():
            close(p.grad, expect_grads[n], tol)
        # Not the same as attending across the sequences.
        with torch.no_grad():
            crossed = model(input_ids=batch["input_ids"]).logits
        assert not torch.allclose(crossed, expect, atol=tol, rtol=tol)


def test_tiny_llama_packed_batch_matches_sdpa_one_at_a_time():
    transformers = _transformers()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    _packed_vs_one_at_a_time(model, "sdpa", 64)


def test_tiny_mistral_sliding_window_packed_batch_matches_sdpa_one_at_a_time():
    transformers = _transformers()
    config = transformers.MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        sliding_window=4)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config)
    _packed_vs_one_at_a_time(model, "sdpa", 64)


def test_tiny_gemma2_softcap_and_window_packed_batch_matches_eager_one_at_a_time():
    # Gemma2: sliding-window and global layers, attention logit soft-capping
    # (which SDPA does not apply, so the reference is "eager").
    transformers = _transformers()
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=64, sliding_window=4,
                                       attn_logit_softcapping=2.0, query_pre_attn_scalar=16)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    _packed_vs_one_at_a_time(model, "eager", 64)


def test_tiny_llama_refuses_packed_kwargs_with_two_rows():
    transformers = _transformers()
    import gqattn.transformers as gtr

    gtr.register()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("gqattn")
    ids = torch.randint(0, 64, (2, 8))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with torch.no_grad(), pytest.raises(ValueError, match=r"B = 2 is not supported"):
        model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5,
              max_length_k=5)
    # Position ids of B > 1 rows are not read for packing (as in transformers'
    # FlashAttention path, so plain batches pay no host read): each row is
    # attended as one sequence, the same as without them.
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]).expand(2, 8)
    with torch.no_grad():
        with_ids = model(input_ids=ids, position_ids=position_ids).logits
        model.set_attn_implementation("sdpa")
        reference = model(input_ids=ids, position_ids=position_ids).logits
    torch.testing.assert_close(with_ids, reference, rtol=1e-4, atol=1e-4)
