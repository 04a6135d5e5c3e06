"""FlashAttention-3's ``flash_attn_func`` signature, run by gqattn.

A drop-in for ``from flash_attn_interface import flash_attn_func`` (FA3's
hopper/flash_attn_interface.py)::

    from gqattn.flash_attn_interface import flash_attn_func
    out = flash_attn_func(q, k, v, softmax_scale, True)             # FA3's positional order
    out, lse = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)

FA3 differs from FlashAttention-2 (``gqattn.torch.flash_attn_func``) in its
positional order: there is no ``dropout_p``, so the 4th positional is
``softmax_scale`` and the 5th ``causal``. Everything runs through
``gqattn.torch.attention`` (autograd, torch.compile).

Return value: FA3's current interface returns ``out``, or ``(out,
softmax_lse)`` with ``return_attn_probs=True``; this matches that. Early FA3
releases (2024 betas) returned ``(out, softmax_lse)`` always: code written for
those should pass ``return_attn_probs=True``.

``flash_attn_varlen_func`` is FA3's packed variable-length form (through
``gqattn.torch.varlen_attention``).

Checked by python/tests/test_dropins.py and test_varlen.py.
"""

from typing import Optional, Sequence

from torch import Tensor

from .torch import _window_from_flash, attention, varlen_attention

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]

_NAME = "gqattn.flash_attn_interface.flash_attn_func"
_NAME_VARLEN = "gqattn.flash_attn_interface.flash_attn_varlen_func"


def _refuse(what: str, reason: str, caller: str = _NAME) -> ValueError:
    return ValueError(f"{caller}: {what} is not supported: {reason}")


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float] = None,
                    causal: bool = False, qv: Optional[Tensor] = None,
                    q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                    v_descale: Optional[Tensor] = None,
                    window_size: Sequence[int] = (-1, -1), attention_chunk: int = 0,
                    softcap: float = 0.0, num_splits: int = 1, pack_gqa: Optional[bool] = None,
                    deterministic: bool = False, sm_margin: int = 0,
                    return_attn_probs: bool = False):
    """FlashAttention-3's ``flash_attn_func``, run by gqattn.

    q ``[B, Tq, H, d]``; k, v ``[B, Tk, Hkv, d]`` with ``H % Hkv == 0``;
    bottom-right causal alignment, ``softmax_scale`` (default ``1/sqrt(d)``)
    and ``softcap`` as FA3. float32, bfloat16 and float16 (FA3 also fp8; gqattn
    does not).

    window_size=(left, right), FA3's (key j kept for query i iff
    ``i + Tk - Tq - left <= j <= i + Tk - Tq + right``, -1 = unbounded):
      * (-1, -1): no window;
      * (left, 0), left >= -1: causal with gqattn ``window = left + 1``;
      * (left, -1) with causal=False: keys from ``i-left`` on, no right bound.
    A right window > 0 has no gqattn equivalent and raises.

    Returns ``out`` ``[B, Tq, H, d]``; with ``return_attn_probs=True``,
    ``(out, softmax_lse)``, lse ``[B, H, Tq]`` float32 (natural log, -inf for
    a row with no kept key; not differentiable), as FA3 returns them.

    ``deterministic`` defaults to False as in FA3 (gqattn may then take
    non-deterministic backward paths); ``num_splits``, ``pack_gqa`` and
    ``sm_margin`` are FA3's performance knobs and are accepted and ignored
    (gqattn picks its own split and packing).

    Not supported (ValueError "not supported: <reason>"): ``qv``,
    ``q_descale``/``k_descale``/``v_descale`` (fp8), ``attention_chunk != 0``,
    and windows with a right bound > 0.
    """
    if qv is not None:
        raise _refuse("qv", "gqattn has no extra query-value term (MLA-style qv); pass None")
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale),
                    ("v_descale", v_descale)):
        if t is not None:
            raise _refuse(name, "gqattn runs float32, bfloat16 and float16, not fp8 with "
                          "descaling; pass None")
    if int(attention_chunk) != 0:
        raise _refuse(f"attention_chunk={attention_chunk}",
                      "gqattn has no chunked-local attention; pass 0")
    causal, window = _window_from_flash(window_size, bool(causal), caller=_NAME)
    return attention(q, k, v, causal=causal, window=window, softcap=softcap,
                     scale=softmax_scale, deterministic=bool(deterministic),
                     return_lse=bool(return_attn_probs))


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           seqused_q: Optional[Tensor] = None,
                           seqused_k: Optional[Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           qv: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                           k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None,
                           window_size: Sequence[int] = (-1, -1), attention_chunk: int = 0,
                           softcap: float = 0.0, num_splits: int = 1,
                           pack_gqa: Optional[bool] = None, deterministic: bool = False,
                           sm_margin: int = 0, return_attn_probs: bool = False):
    """FlashAttention-3's ``flash_attn_varlen_func``, run by gqattn.

    q ``[total_q, H, d]``; k, v ``[total_k, Hkv, d]``; cu_seqlens_q/k int32
    ``[B + 1]``; seqused_k int32 ``[B]`` or None; max_seqlen_q/k bound every
    sequence. Each sequence is the dense problem of its own lengths (causal
    bottom-right per sequence; window_size as ``flash_attn_func``). Returns
    ``out``, or ``(out, softmax_lse)`` with lse ``[H, total_q]`` float32.

    Not supported (ValueError "not supported: <reason>"): ``seqused_q``, and
    what ``flash_attn_func`` refuses; its performance knobs are ignored.
    """
    if seqused_q is not None:
        raise _refuse("seqused_q", "gqattn takes each sequence's queries from cu_seqlens_q; "
                      "pass None", _NAME_VARLEN)
    if qv is not None:
        raise _refuse("qv", "gqattn has no extra query-value term (MLA-style qv); pass None",
                      _NAME_VARLEN)
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale),
                    ("v_descale", v_descale)):
        if t is not None:
            raise _refuse(name, "gqattn runs float32, bfloat16 and float16, not fp8 with "
                          "descaling; pass None", _NAME_VARLEN)
    if int(attention_chunk) != 0:
        raise _refuse(f"attention_chunk={attention_chunk}",
                      "gqattn has no chunked-local attention; pass 0", _NAME_VARLEN)
    causal, window = _window_from_flash(window_size, bool(causal), caller=_NAME_VARLEN)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            seqused_k=seqused_k, causal=causal, window=window, softcap=softcap,
                            scale=softmax_scale, deterministic=bool(deterministic),
                            return_lse=bool(return_attn_probs))


from .kv_cache import flash_attn_with_kvcache_fa3 as flash_attn_with_kvcache  # noqa: E402,F401
