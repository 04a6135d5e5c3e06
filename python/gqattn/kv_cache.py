"""gqattn for PyTorch over a KV cache: FlashAttention-2's
``flash_attn_with_kvcache``, and ``merge_attention_states``.

``flash_attn_with_kvcache(q, k_cache, v_cache, k, v, ...)`` appends new keys
and values to a dense or paged cache in place and attends over the cached
keys (docs/semantics.md, "KV cache"); it runs as the custom op
``torch.ops.gqattn.kv_cache_forward``, which declares the two caches it
mutates and has a fake implementation, so a decode step traces under
``torch.compile(fullgraph=True)`` and can be captured in a CUDA graph.
``merge_attention_states(o_a, lse_a, o_b, lse_b)`` merges two partial
results over disjoint keys by their lse (custom op
``torch.ops.gqattn.merge_attention_states``). Both are forward only (no
autograd). ``gqattn.torch`` re-exports both.

Checked by python/tests/test_kv_cache.py: against a float64 reference
written there, the in-place append element by element, opcheck and
torch.compile on the CPU.
"""

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _ext
from ._ext import Error

__all__ = ["flash_attn_with_kvcache", "merge_attention_states"]

_NAME = "gqattn.flash_attn_with_kvcache"


def _not_supported(argument: str, reason: str) -> Error:
    # Worded like the library's errors, .argument and .rule set as the
    # extension sets them.
    rule = f"not supported: {reason}"
    e = Error(f"gqattn: {argument}: {rule}")
    e.argument, e.rule = argument, rule
    return e


# ---- the custom ops ----------------------------------------------------------
# Every scalar explicit (no defaults), so the schema is the whole contract.
# check_offsets is decided by the caller (off under torch.compile and CUDA
# graph capture, where the library must not copy the int32 vectors to the
# host); the library always checks vectors in host memory.


@torch.library.custom_op("gqattn::kv_cache_forward", mutates_args=("k_cache", "v_cache"))
def _kv_cache_forward(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                      v: Optional[Tensor], cache_seqlens: Tensor, cache_batch_idx: Optional[Tensor],
                      block_table: Optional[Tensor], causal: bool, window: int, softcap: float,
                      scale: Optional[float], backend: str, check_offsets: bool,
                      batch_invariant: bool) -> Tuple[Tensor, Tensor]:
    B, Tq, H, d = q.shape
    # torch.empty: the library writes every element of o and lse.
    o = torch.empty((B, Tq, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    # detach(): DLPack refuses tensors that require grad; the cache views
    # share the caller's storage, so the append lands in the caller's cache.
    k, v, block_table, cache_batch_idx = (None if t is None else t.detach()
                                          for t in (k, v, block_table, cache_batch_idx))
    with _gt._on_device(q):
        _ext.forward_with_kv_cache(q.detach(), k_cache.detach(), v_cache.detach(), o, lse,
                                   cache_seqlens.detach(), k=k, v=v, block_table=block_table,
                                   cache_batch_idx=cache_batch_idx, causal=causal,
                                   window=window, softcap=softcap, scale=scale,
                                   backend=backend, stream=_gt._stream(q),
                                   num_threads=torch.get_num_threads(),
                                   check_offsets=check_offsets,
                                   batch_invariant=batch_invariant)
    return o, lse


@_kv_cache_forward.register_fake
def _kv_cache_forward_fake(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                           causal, window, softcap, scale, backend, check_offsets,
                           batch_invariant):
    B, Tq, H, d = q.shape
    return q.new_empty((B, Tq, H, d)), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("gqattn::merge_attention_states", mutates_args=())
def _merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor,
                            lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    o = torch.empty(o_a.shape, dtype=o_a.dtype, device=o_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=o_a.device)
    with _gt._on_device(o_a):
        _ext.merge_attention_states(o_a.detach(), lse_a.detach(), o_b.detach(), lse_b.detach(),
                                    o, lse, stream=_gt._stream(o_a))
    return o, lse


@_merge_attention_states.register_fake
def _merge_attention_states_fake(o_a, lse_a, o_b, lse_b):
    return o_a.new_empty(o_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)


# ---- the public functions -----------------------------------------------------


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                            k: Optional[Tensor] = None, v: Optional[Tensor] = None,
                            rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None,
                            cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None,
                            cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True,
                            alibi_slopes: Optional[Tensor] = None, num_splits: int = 0,
                            return_softmax_lse: bool = False, *, batch_invariant: bool = False):
    """FlashAttention-2's ``flash_attn_with_kvcache``, run by gqattn.

    Args:
        q: ``[B, Tq, H, d]``.
        k_cache, v_cache: dense ``[B_cache, T_cache, Hkv, d]``, or paged
            ``[num_pages, page_size, Hkv, d]`` when ``block_table`` is given
            (any page size >= 1). Written in place where new keys go; their
            last dimension must be contiguous (they cannot be copied).
        k, v: optional new keys and values ``[B, T_new, Hkv, d]``, written
            into the cache at positions ``cache_seqlens[b] ..
            cache_seqlens[b] + T_new - 1`` before attention (``cache_seqlens``
            itself is not changed).
        cache_seqlens: keys already in the cache per sequence: an int (the
            same for all) or an int32 tensor ``[B]`` on q's device. None: every
            sequence uses the cache's whole capacity (then k, v must be None).
        cache_batch_idx: int32 ``[B]``, the dense cache row of sequence b
            (default b).
        block_table: int32 ``[B, pages_per_seq]``: key position p of sequence
            b lives in page ``block_table[b, p // page_size]``, slot
            ``p % page_size``, with ``page_size = k_cache.shape[1]``.
        softmax_scale, causal, softcap: as ``gqattn.torch.flash_attn_func``;
            query i of sequence b sits at key position
            ``cache_seqlens[b] + T_new - Tq + i`` (bottom-right, as
            FlashAttention).
        window_size: ``(left, right)``, mapped as ``flash_attn_func`` maps it.
        num_splits: FlashAttention's split-KV hint; gqattn chooses its own
            split, so it is ignored.
        return_softmax_lse: also return ``lse`` ``[B, H, Tq]`` float32.
        batch_invariant: gqattn's own (keyword only): a sequence gives the
            same bits alone or in any batch (the split of its keys over
            thread blocks follows its own length, not the batch's size).

    Returns:
        ``out`` ``[B, Tq, H, d]``, or ``(out, softmax_lse)``.

    Not supported (gqattn.Error, "not supported: ..."): rotary_cos/rotary_sin
    (apply rotary embeddings before the call), cache_leftpad, alibi_slopes.
    Bad int32 vectors (a block_table entry outside the cache, cache_seqlens +
    T_new above the capacity) raise gqattn.Error naming the entry, where they
    are checked: always for host tensors, and for CUDA tensors in eager mode;
    not under torch.compile or CUDA graph capture (no host sync there; the
    kernels clamp indices, so a bad table never reads or writes outside the
    cache). Forward only: no gradient flows through it.
    """
    if rotary_cos is not None or rotary_sin is not None:
        raise _not_supported("rotary_cos, rotary_sin",
                             "gqattn applies no rotary embedding; rotate q and k before the call "
                             "and pass None")
    if cache_leftpad is not None:
        raise _not_supported("cache_leftpad", "sequences start at cache position 0; pass None")
    if alibi_slopes is not None:
        raise _not_supported("alibi_slopes", "gqattn has no ALiBi bias; pass None")
    del num_splits, rotary_interleaved  # a performance hint; rotary is refused above
    for t, name, dims in ((q, "q", "[B, Tq, H, d]"), (k_cache, "k_cache", "4-D"),
                          (v_cache, "v_cache", "4-D")):
        if t.dim() != 4:
            raise _gt._error(f"{name}.rank = {t.dim()}", f"must be 4 (shape {dims})")
    causal, window = _gt._window_from_flash(window_size, bool(causal), caller=_NAME)
    if cache_seqlens is None:
        if k is not None or v is not None:
            raise _gt._error("cache_seqlens = None",
                             "must be given with new keys k, v (where to append them)")
        capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
        cache_seqlens = capacity
    if not isinstance(cache_seqlens, Tensor):
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32,
                                   device=q.device)
    q = _gt._last_dim_contiguous(q)
    k, v = (None if t is None else _gt._last_dim_contiguous(t) for t in (k, v))
    o, lse = _kv_cache_forward(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                               block_table, causal, window, float(softcap),
                               None if softmax_scale is None else float(softmax_scale), "auto",
                               _gt._may_check_offsets(q), bool(batch_invariant))
    return (o, lse) if return_softmax_lse else o


def flash_attn_with_kvcache_fa3(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                                k: Optional[Tensor] = None, v: Optional[Tensor] = None,
                                qv: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                                rotary_sin: Optional[Tensor] = None,
                                cache_seqlens: Optional[Union[int, Tensor]] = None,
                                cache_batch_idx: Optional[Tensor] = None,
                                cache_leftpad: Optional[Tensor] = None,
                                page_table: Optional[Tensor] = None,
                                cu_seqlens_q: Optional[Tensor] = None,
                                cu_seqlens_k_new: Optional[Tensor] = None,
                                max_seqlen_q: Optional[int] = None,
                                rotary_seqlens: Optional[Tensor] = None,
                                q_descale: Optional[Tensor] = None,
                                k_descale: Optional[Tensor] = None,
                                v_descale: Optional[Tensor] = None,
                                softmax_scale: Optional[float] = None, causal: bool = False,
                                window_size: Sequence[int] = (-1, -1), attention_chunk: int = 0,
                                softcap: float = 0.0, rotary_interleaved: bool = True,
                                scheduler_metadata=None, num_splits: int = 0, pack_gqa=None,
                                sm_margin: int = 0, return_softmax_lse: bool = False):
    """FlashAttention-3's ``flash_attn_with_kvcache`` (its argument order;
    ``gqattn.flash_attn_interface.flash_attn_with_kvcache``), run as
    ``flash_attn_with_kvcache`` above: ``page_table`` is FA2's
    ``block_table``. Not supported (gqattn.Error): qv, rotary_*, cache_leftpad,
    cu_seqlens_q / cu_seqlens_k_new / max_seqlen_q (packed queries),
    q/k/v_descale (FP8), attention_chunk != 0. scheduler_metadata,
    num_splits, pack_gqa and sm_margin are performance hints, ignored.
    """
    refused = dict(qv=qv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
                   max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens, q_descale=q_descale,
                   k_descale=k_descale, v_descale=v_descale)
    for name, value in refused.items():
        if value is not None:
            raise _not_supported(name, "gqattn's KV-cache call has no such input; pass None")
    if attention_chunk != 0:
        raise _not_supported(f"attention_chunk = {attention_chunk}",
                             "gqattn has no chunked attention mask; pass 0")
    del scheduler_metadata, pack_gqa, sm_margin  # performance hints
    return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                   cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
                                   softmax_scale, causal, window_size, softcap,
                                   rotary_interleaved, None, num_splits, return_softmax_lse)


def merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor,
                           lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Merges two partial attention results over disjoint key sets by lse.

    ``o_a``, ``o_b`` ``[B, Tq, H, d]`` (one dtype), ``lse_a``, ``lse_b``
    ``[B, H, Tq]`` float32 (as ``attention(..., return_lse=True)`` returns
    them); returns ``(o, lse)``: ``o = (e^lse_a o_a + e^lse_b o_b) /
    (e^lse_a + e^lse_b)``, ``lse = log(e^lse_a + e^lse_b)``, computed in
    float32. A row whose lse is -inf on both sides gets ``o = 0``,
    ``lse = -inf``. FlashInfer's ``merge_state`` in gqattn's layouts.
    Forward only.
    """
    o_a, lse_a, o_b, lse_b = (_gt._last_dim_contiguous(t) for t in (o_a, lse_a, o_b, lse_b))
    return _merge_attention_states(o_a, lse_a, o_b, lse_b)


# Last, after this module's names exist: gqattn.torch imports them from here
# at its own end, so either module may be imported first.
from . import torch as _gt  # noqa: E402
