"""gqattn for PyTorch: autograd, torch.compile, and a FlashAttention-style call.

``attention(q, k, v, ...)`` runs gqattn's forward and backward as two custom
ops (``torch.ops.gqattn.attention_forward`` / ``attention_backward``,
registered with ``torch.library.custom_op``), each with a fake-tensor
implementation and the forward with registered autograd, so a model using it
traces under ``torch.compile(fullgraph=True)`` without graph breaks.

``flash_attn_func(...)`` takes FlashAttention-2's arguments and maps them onto
``attention`` (what cannot be mapped raises ValueError saying what can).
``scaled_dot_product_attention(...)`` takes torch SDPA's arguments and
``[B, H, T, d]`` layout. FlashAttention-3's signature is in
``gqattn.flash_attn_interface``, Hugging Face's attention interface in
``gqattn.hf``.

Checked by python/tests/test_torch.py: against torch's math SDPA and explicit
f64 math, gradcheck, opcheck and torch.compile on the CPU; the CUDA tests
there skip without a GPU.
"""

import contextlib
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _ext
from ._ext import Error

__all__ = ["attention", "flash_attn_func", "scaled_dot_product_attention", "Error"]

_Q_DIMS = "[B, Tq, H, d]"
_KV_DIMS = "[B, Tk, Hkv, d]"


def _error(argument: str, rule: str) -> Error:
    # Worded like the C++ library's errors ("gqattn: <argument>: <rule>"),
    # with .argument and .rule set as the extension sets them.
    e = Error(f"gqattn: {argument}: {rule}")
    e.argument, e.rule = argument, rule
    return e


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # gqattn reads any strides except on the last dimension. Copy only when
    # that one is not 1 (e.g. a transposed view, or an expanded gradient).
    if t.stride(-1) == 1:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _on_device(t: Tensor):
    # gqattn's TensorRef has no GPU index: the kernels run on the current
    # device, so make the tensors' device current for the call.
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _stream(t: Tensor) -> int:
    # torch's current stream on t's device, as the integer cudaStream_t the
    # extension takes; 0 (unused) on the CPU.
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _shape4(t: Tensor, name: str, dims: str) -> Tuple[int, int, int, int]:
    if t.dim() != 4:
        raise _error(f"{name}.rank = {t.dim()}", f"must be 4 (shape {dims})")
    return tuple(t.shape)


# ---- the custom ops ----------------------------------------------------------
# Both take the problem's scalars explicitly (no defaults) so the schema is the
# whole contract; attention() below is the friendly front door.


@torch.library.custom_op("gqattn::attention_forward", mutates_args=())
def _attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, window: int,
                       softcap: float, scale: Optional[float], deterministic: bool,
                       backend: str) -> Tuple[Tensor, Tensor]:
    B, Tq, H, d = _shape4(q, "q", _Q_DIMS)
    if q.dtype == torch.float64:
        # Not a backend: the f64 oracle, so that torch.autograd.gradcheck can
        # check this op's gradients at f64 precision.
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        o = torch.empty((B, Tq, H, d), dtype=torch.float64)
        lse = torch.empty((B, H, Tq), dtype=torch.float64)
        _ext.oracle_forward(q.detach(), k.detach(), v.detach(), o, lse, causal=causal,
                            window=window, softcap=softcap, scale=scale)
        return o, lse
    # torch.empty: every element of o and lse is written by the kernels.
    o = torch.empty((B, Tq, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    with _on_device(q):
        # detach(): DLPack refuses tensors that require grad; these are views.
        _ext.forward(q.detach(), k.detach(), v.detach(), o, lse, causal=causal, window=window,
                     softcap=softcap, scale=scale, backend=backend,
                     deterministic=deterministic, stream=_stream(q),
                     num_threads=torch.get_num_threads())
    return o, lse


@_attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, window, softcap, scale, deterministic, backend):
    B, Tq, H, d = _shape4(q, "q", _Q_DIMS)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((B, Tq, H, d)), q.new_empty((B, H, Tq), dtype=lse_dtype)


@torch.library.custom_op("gqattn::attention_backward", mutates_args=())
def _attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                        causal: bool, window: int, softcap: float, scale: Optional[float],
                        deterministic: bool, backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.dtype == torch.float64:
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        _ext.oracle_backward(q.detach(), k.detach(), v.detach(), do.detach(), dq, dk, dv,
                             causal=causal, window=window, softcap=softcap, scale=scale)
        return dq, dk, dv
    with _on_device(q):
        _ext.backward(q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), do.detach(),
                      dq, dk, dv, causal=causal, window=window, softcap=softcap, scale=scale,
                      backend=backend, deterministic=deterministic, stream=_stream(q),
                      num_threads=torch.get_num_threads())
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(do, q, k, v, o, lse, causal, window, softcap, scale, deterministic,
                             backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, window, softcap, scale, deterministic, backend = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.params = (causal, window, softcap, scale, deterministic, backend)
    # lse is an output for callers (e.g. to merge attention over chunks), not
    # a differentiable one: gqattn's backward has no lse-gradient input.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(_last_dim_contiguous(do), q, k, v, o, lse, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None


_attention_forward.register_autograd(_backward, setup_context=_setup_context)


def _float64_on_device(q: Tensor) -> Error:
    return _error(f"q.dtype = float64 on {q.device}",
                  "gqattn's backends run float32, bfloat16 and float16; float64 runs only the "
                  "f64 reference oracle, on the CPU (meant for gradcheck)")


# ---- the public functions -----------------------------------------------------


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, window: int = 0,
              softcap: float = 0.0, scale: Optional[float] = None, return_lse: bool = False,
              deterministic: bool = True, backend: str = "auto"):
    """Exact attention with grouped-query heads, differentiable and compilable.

    Args:
        q: ``[B, Tq, H, d]``; k, v: ``[B, Tk, Hkv, d]`` with ``H % Hkv == 0``
            (query head h reads kv head ``h // (H // Hkv)``). float32,
            bfloat16 or float16, all the same dtype, on one device. Any
            strides; a last dimension that is not contiguous is copied.
        causal: key j is kept for query i only if ``j <= i + Tk - Tq``
            (queries align to the end of the keys, as in FlashAttention).
        window: keys kept per query, itself included (0 = no window): key j
            is kept only if ``j >= i + Tk - Tq - window + 1``. This is
            FlashAttention's ``window_size=(window - 1, 0)`` with causal.
        softcap: when > 0, scores become ``softcap * tanh(s / softcap)``.
        scale: score scale, ``1 / sqrt(d)`` when None (computed in float32).
        return_lse: also return ``lse`` ``[B, H, Tq]`` float32, the natural
            log-sum-exp of each row's kept scores (-inf for a row with no
            kept key, whose output is 0). It is not differentiable.
        deterministic: same bits on every run (gqattn's default everywhere);
            False permits faster non-deterministic paths (e.g. cuda-flash's
            backward adds dQ with atomics; same tolerances, last bits may
            vary between runs).
        backend: "auto", "cpu", "cuda-unfused", "cuda-flash" or
            "cuda-hopper"; an explicit backend that cannot run the problem
            raises gqattn.Error saying why.

    Returns:
        ``o`` ``[B, Tq, H, d]`` in q's dtype, or ``(o, lse)``.

    float64: gqattn's backends run float32, bfloat16 and float16 only.
    float64 runs the f64 reference oracle on the CPU, meant for gradcheck
    (``torch.autograd.gradcheck``); it is slow, and lse is then float64.
    float64 on CUDA raises gqattn.Error.

    Raises:
        gqattn.Error (a ValueError) naming the argument and the rule it broke.
    """
    _shape4(q, "q", _Q_DIMS)
    _shape4(k, "k", _KV_DIMS)
    _shape4(v, "v", _KV_DIMS)
    if q.dtype == torch.float64 and q.device.type != "cpu":
        raise _float64_on_device(q)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    o, lse = _attention_forward(q, k, v, bool(causal), int(window), float(softcap),
                                None if scale is None else float(scale), bool(deterministic),
                                str(backend))
    return (o, lse) if return_lse else o


def _window_from_flash(window_size: Sequence[int], causal: bool,
                       caller: str = "gqattn.flash_attn_func") -> Tuple[bool, int]:
    """FlashAttention's (left, right) window as gqattn's (causal, window).

    FlashAttention keeps key j for query i iff
    ``i + Tk - Tq - left <= j <= i + Tk - Tq + right``, -1 meaning unbounded
    on that side; causal=True bounds the right side at 0. gqattn's window
    bounds only the left side (``window = left + 1``, 0 = unbounded) and its
    causal flag the right side at 0, so right must be 0 or unbounded.
    """
    supported = ("supported: window_size=(-1, -1) (no window); (left, 0) with left >= -1 "
                 "(keys i-left..i: causal, with gqattn window = left + 1); and with "
                 "causal=False, (left, -1) (keys from i-left on, no right bound)")
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"{caller}: window_size={window_size!r} must be a pair "
                         f"of ints (left, right); {supported}") from None
    if left < -1 or right < -1 or right > 0 or (causal and right == -1 and left != -1):
        # With causal=True, FlashAttention reads (left, -1) as (left, 0);
        # rather than guess whether that was meant, ask for (left, 0).
        raise ValueError(f"{caller}: window_size=({left}, {right}) with "
                         f"causal={causal} is not supported; {supported}")
    window = 0 if left == -1 else left + 1
    # right == 0 is the causal bound whether or not causal was passed.
    return (causal or right == 0), window


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Sequence[int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = True,
                    return_attn_probs: bool = False):
    """FlashAttention-2's ``flash_attn_func``, run by gqattn.

    Same layout (q ``[B, Tq, H, d]``, k/v ``[B, Tk, Hkv, d]``), GQA rule,
    bottom-right causal alignment, softmax_scale and softcap as FlashAttention;
    returns ``out``, or with ``return_attn_probs=True`` the triple
    ``(out, softmax_lse, None)`` as FlashAttention-2 returns it:
    ``softmax_lse`` is ``[B, H, Tq]`` float32, the natural log-sum-exp of each
    row's scaled (and soft-capped) kept scores (-inf for a row with no kept
    key; not differentiable); the third item, FlashAttention's attention
    probabilities ``S_dmask``, is always None: gqattn never materialises
    them. Also takes float32 (FlashAttention: fp16/bf16 only).

    window_size=(left, right) maps onto gqattn's window (keys kept per query,
    self included):
      * (-1, -1): no window;
      * (left, 0), left >= -1: keys ``i-left .. i`` = causal with window
        ``left + 1`` (0 when left = -1), whether or not causal=True is passed;
      * (left, -1) with causal=False: keys from ``i-left`` on, no right bound.
    A right window > 0 has no gqattn equivalent and raises ValueError.

    Not supported (ValueError): dropout_p != 0 (gqattn has no attention
    dropout), alibi_slopes. deterministic defaults to
    True here (gqattn's default); False permits non-deterministic paths (e.g.
    cuda-flash's backward adds dQ with atomics, as FlashAttention does by
    default).
    """
    if dropout_p != 0.0:
        raise ValueError(f"gqattn.flash_attn_func: dropout_p={dropout_p} is not supported: "
                         "gqattn has no attention dropout; pass dropout_p=0.0")
    if alibi_slopes is not None:
        raise ValueError("gqattn.flash_attn_func: alibi_slopes is not supported; pass None")
    causal, window = _window_from_flash(window_size, bool(causal))
    result = attention(q, k, v, causal=causal, window=window, softcap=softcap,
                       scale=softmax_scale, deterministic=deterministic,
                       return_lse=bool(return_attn_probs))
    if return_attn_probs:
        out, lse = result
        return out, lse, None  # FlashAttention-2's (out, softmax_lse, S_dmask); no S_dmask
    return result


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``'s signature and
    ``[B, H, T, d]`` layout, run by gqattn (differentiable, compilable).

    query ``[B, H, Tq, d]``; key, value ``[B, Hkv, Tk, d]``; returns
    ``[B, H, Tq, d]`` in query's dtype. The inputs are passed to gqattn as
    ``transpose(1, 2)`` views (no copy unless the last dimension is not
    contiguous), and the result is gqattn's ``[B, Tq, H, d]`` output
    transposed back: a view, not contiguous (call ``.contiguous()`` if you
    need that). Only 4-D tensors (SDPA also takes other batch ranks).

    With ``enable_gqa=True``, ``H`` may be a multiple of ``Hkv`` (query head h
    reads kv head ``h // (H // Hkv)``, as SDPA); without it, ``H != Hkv``
    raises as SDPA does. ``scale`` defaults to ``1/sqrt(d)``.

    Not supported (ValueError, "not supported: <reason>"): ``attn_mask``
    (gqattn takes only causal and sliding-window masks: use ``attention``);
    ``dropout_p != 0``; ``is_causal=True`` with ``Tq != Tk``: SDPA's causal
    mask is top-left aligned (key j kept for query i iff ``j <= i``) and
    gqattn's bottom-right (``j <= i + Tk - Tq``); they agree when Tq == Tk.
    """
    name = "gqattn.torch.scaled_dot_product_attention"
    if attn_mask is not None:
        raise ValueError(f"{name}: attn_mask is not supported: gqattn applies only causal and "
                         "sliding-window masks; pass attn_mask=None (is_causal=True for the "
                         "causal mask), or use gqattn.torch.attention(..., causal, window)")
    if dropout_p != 0.0:
        raise ValueError(f"{name}: dropout_p={dropout_p} is not supported: gqattn has no "
                         "attention dropout; pass dropout_p=0.0")
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        if t.dim() != 4:
            raise ValueError(f"{name}: {n}.dim() = {t.dim()} is not supported: gqattn takes "
                             "4-D [B, H, T, d] tensors only")
    Tq, Tk = query.shape[2], key.shape[2]
    if is_causal and Tq != Tk:
        raise ValueError(f"{name}: is_causal=True with Tq = {Tq} != Tk = {Tk} is not "
                         "supported: SDPA's is_causal is top-left aligned; gqattn aligns "
                         "bottom-right (equal for Tq == Tk)")
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError(f"{name}: query has {query.shape[1]} heads and key {key.shape[1]}: "
                         "pass enable_gqa=True for grouped-query attention (as SDPA requires)")
    o = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                  causal=bool(is_causal), scale=scale)
    return o.transpose(1, 2)
