"""gqattn for PyTorch: autograd, torch.compile, and a FlashAttention-style call.

``attention(q, k, v, ...)`` runs gqattn's forward and backward as two custom
ops (``torch.ops.gqattn.attention_forward`` / ``attention_backward``,
registered with ``torch.library.custom_op``), each with a fake-tensor
implementation and the forward with registered autograd, so a model using it
traces under ``torch.compile(fullgraph=True)`` without graph breaks.

``varlen_attention(...)`` runs a packed batch of variable-length sequences
(``torch.ops.gqattn.varlen_forward`` / ``varlen_backward``, registered the
same way).

``flash_attn_func(...)`` / ``flash_attn_varlen_func(...)`` take
FlashAttention-2's arguments and map them onto ``attention`` /
``varlen_attention`` (what cannot be mapped raises ValueError saying what
can).
``scaled_dot_product_attention(...)`` takes torch SDPA's arguments and
``[B, H, T, d]`` layout. FlashAttention-3's signature is in
``gqattn.flash_attn_interface``, Hugging Face's attention interface in
``gqattn.hf``.

Checked by python/tests/test_torch.py and test_varlen.py: against torch's math SDPA and explicit
f64 math, gradcheck, opcheck and torch.compile on the CPU; the CUDA tests
there skip without a GPU.
"""

import contextlib
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _ext
from ._ext import Error

__all__ = ["attention", "varlen_attention", "flash_attn_func", "flash_attn_varlen_func",
           "scaled_dot_product_attention", "Error"]

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
                       backend: str, q_start: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    B, Tq, H, d = _shape4(q, "q", _Q_DIMS)
    if q.dtype == torch.float64:
        # Not a backend: the f64 oracle, so that torch.autograd.gradcheck can
        # check this op's gradients at f64 precision.
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        o = torch.empty((B, Tq, H, d), dtype=torch.float64)
        lse = torch.empty((B, H, Tq), dtype=torch.float64)
        _ext.oracle_forward(q.detach(), k.detach(), v.detach(), o, lse, causal=causal,
                            window=window, softcap=softcap, scale=scale, q_start=q_start)
        return o, lse
    # torch.empty: every element of o and lse is written by the kernels.
    o = torch.empty((B, Tq, H, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
    with _on_device(q):
        # detach(): DLPack refuses tensors that require grad; these are views.
        _ext.forward(q.detach(), k.detach(), v.detach(), o, lse, causal=causal, window=window,
                     softcap=softcap, scale=scale, q_start=q_start, backend=backend,
                     deterministic=deterministic, stream=_stream(q),
                     num_threads=torch.get_num_threads())
    return o, lse


@_attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, window, softcap, scale, deterministic, backend,
                            q_start=None):
    B, Tq, H, d = _shape4(q, "q", _Q_DIMS)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((B, Tq, H, d)), q.new_empty((B, H, Tq), dtype=lse_dtype)


@torch.library.custom_op("gqattn::attention_backward", mutates_args=())
def _attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                        causal: bool, window: int, softcap: float, scale: Optional[float],
                        deterministic: bool, backend: str,
                        q_start: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.dtype == torch.float64:
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        _ext.oracle_backward(q.detach(), k.detach(), v.detach(), do.detach(), dq, dk, dv,
                             causal=causal, window=window, softcap=softcap, scale=scale,
                             q_start=q_start)
        return dq, dk, dv
    with _on_device(q):
        _ext.backward(q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(), do.detach(),
                      dq, dk, dv, causal=causal, window=window, softcap=softcap, scale=scale,
                      q_start=q_start, backend=backend, deterministic=deterministic,
                      stream=_stream(q),
                      num_threads=torch.get_num_threads())
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(do, q, k, v, o, lse, causal, window, softcap, scale, deterministic,
                             backend, q_start=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, window, softcap, scale, deterministic, backend, q_start = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.params = (causal, window, softcap, scale, deterministic, backend, q_start)
    # lse is an output for callers (e.g. to merge attention over chunks), not
    # a differentiable one: gqattn's backward has no lse-gradient input.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(_last_dim_contiguous(do), q, k, v, o, lse, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None, None


_attention_forward.register_autograd(_backward, setup_context=_setup_context)


def _float64_on_device(q: Tensor) -> Error:
    return _error(f"q.dtype = float64 on {q.device}",
                  "gqattn's backends run float32, bfloat16 and float16; float64 runs only the "
                  "f64 reference oracle, on the CPU (meant for gradcheck)")


# ---- the varlen custom ops ----------------------------------------------------
# A packed batch of B sequences: q, o [total_q, H, d], k, v [total_k, Hkv, d],
# lse [H, total_q], int32 offsets on q's device. check_offsets is decided by
# the Python caller (off under torch.compile and CUDA graph capture, where the
# library must not copy device offsets to the host), so the op itself stays a
# pure function of its arguments.


@torch.library.custom_op("gqattn::varlen_forward", mutates_args=())
def _varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                    seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                    causal: bool, window: int, softcap: float, scale: Optional[float],
                    q_start: Optional[int], deterministic: bool, backend: str,
                    check_offsets: bool) -> Tuple[Tensor, Tensor]:
    H = q.shape[1]
    offsets = dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
                   causal=causal, window=window, softcap=softcap, scale=scale, q_start=q_start)
    if q.dtype == torch.float64:
        # The f64 oracle, for gradcheck (as the dense op).
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        o = torch.empty(q.shape, dtype=torch.float64)
        lse = torch.empty((H, q.shape[0]), dtype=torch.float64)
        _ext.oracle_forward_varlen(q.detach(), k.detach(), v.detach(), o, lse, cu_seqlens_q,
                                   cu_seqlens_k, **offsets)
        return o, lse
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((H, q.shape[0]), dtype=torch.float32, device=q.device)
    with _on_device(q):
        _ext.forward_varlen(q.detach(), k.detach(), v.detach(), o, lse, cu_seqlens_q,
                            cu_seqlens_k, **offsets, backend=backend,
                            deterministic=deterministic, stream=_stream(q),
                            num_threads=torch.get_num_threads(), check_offsets=check_offsets)
    return o, lse


@_varlen_forward.register_fake
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                         max_seqlen_k, causal, window, softcap, scale, q_start, deterministic,
                         backend, check_offsets):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype)


@torch.library.custom_op("gqattn::varlen_backward", mutates_args=())
def _varlen_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                     cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool, window: int,
                     softcap: float, scale: Optional[float], q_start: Optional[int],
                     deterministic: bool, backend: str,
                     check_offsets: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    offsets = dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
                   causal=causal, window=window, softcap=softcap, scale=scale, q_start=q_start)
    if q.dtype == torch.float64:
        if q.device.type != "cpu":
            raise _float64_on_device(q)
        _ext.oracle_backward_varlen(q.detach(), k.detach(), v.detach(), do.detach(), dq, dk, dv,
                                    cu_seqlens_q, cu_seqlens_k, **offsets)
        return dq, dk, dv
    with _on_device(q):
        _ext.backward_varlen(q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(),
                             do.detach(), dq, dk, dv, cu_seqlens_q, cu_seqlens_k, **offsets,
                             backend=backend, deterministic=deterministic, stream=_stream(q),
                             num_threads=torch.get_num_threads(), check_offsets=check_offsets)
    return dq, dk, dv


@_varlen_backward.register_fake
def _varlen_backward_fake(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          max_seqlen_q, max_seqlen_k, causal, window, softcap, scale, q_start,
                          deterministic, backend, check_offsets):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, seqused_k = inputs[:6]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, seqused_k)
    ctx.params = inputs[6:]  # max_seqlen_q .. check_offsets
    ctx.mark_non_differentiable(lse)


def _varlen_backward_autograd(ctx, do, dlse):
    q, k, v, o, lse, cu_q, cu_k, seqused_k = ctx.saved_tensors
    *params, check_offsets = ctx.params
    # The backward may run where the forward did not check (e.g. under CUDA
    # graph capture): check only where both allow it.
    check_offsets = bool(check_offsets) and _may_check_offsets(q)
    dq, dk, dv = _varlen_backward(_last_dim_contiguous(do), q, k, v, o, lse, cu_q, cu_k,
                                  seqused_k, *params, check_offsets)
    return (dq, dk, dv) + (None,) * 13


_varlen_forward.register_autograd(_varlen_backward_autograd,
                                  setup_context=_varlen_setup_context)


def _may_check_offsets(q: Tensor) -> bool:
    # Checking CUDA offsets copies them to the host and synchronises: not
    # allowed while a CUDA graph is captured, and under torch.compile it would
    # be a host sync inside the compiled graph (the kernels clamp every index
    # they derive from unchecked offsets, so wrong ones never read or write
    # outside the tensors). Host offsets are always checked by the library.
    if torch.compiler.is_compiling():
        return False
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


# ---- the public functions -----------------------------------------------------


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, window: int = 0,
              softcap: float = 0.0, scale: Optional[float] = None, return_lse: bool = False,
              deterministic: bool = True, backend: str = "auto", q_start: Optional[int] = None):
    """Exact attention with grouped-query heads, differentiable and compilable.

    Args:
        q: ``[B, Tq, H, d]``; k, v: ``[B, Tk, Hkv, d]`` with ``H % Hkv == 0``
            (query head h reads kv head ``h // (H // Hkv)``). float32,
            bfloat16 or float16, all the same dtype, on one device. Any
            strides; a last dimension that is not contiguous is copied.
        causal: key j is kept for query i only if ``j <= q_start + i``:
            query i sits at key position ``q_start + i``, by default
            ``Tk - Tq`` (queries align to the end of the keys, as in
            FlashAttention).
        window: keys kept per query, itself included (0 = no window): key j
            is kept only if ``j >= q_start + i - window + 1``. This is
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
        backend: "auto", "cpu-flash", "cpu" (the mirror), "cuda-unfused",
            "cuda-flash" or "cuda-hopper"; an explicit backend that cannot run the problem
            raises gqattn.Error saying why.
        q_start: the key position of query 0 (None = ``Tk - Tq``,
            bottom-right). 0 is top-left alignment (PyTorch SDPA's
            ``is_causal``); any integer is allowed, negative or past Tk (a
            query row left with no kept key gets output 0).

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
                                str(backend), None if q_start is None else int(q_start))
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


def _check_offsets_tensor(t, name: str, length: Optional[int], q: Tensor, caller: str) -> int:
    # What the op's schema cannot say: the offsets are int32 vectors on q's
    # device. Their values are the library's to check (eager mode).
    if not isinstance(t, Tensor):
        raise _error(f"{name} = {type(t).__name__}", f"must be an int32 tensor ({caller})")
    if t.dtype != torch.int32:
        raise _error(f"{name}.dtype = {str(t.dtype).replace('torch.', '')}",
                     "must be int32 (as FlashAttention's cu_seqlens)")
    if t.dim() != 1:
        raise _error(f"{name}.dim() = {t.dim()}", "must be 1 (a vector)")
    if length is not None and t.shape[0] != length:
        raise _error(f"{name}.shape = {list(t.shape)}",
                     f"must be [{length}] (B + 1 = cu_seqlens_q's length for cu_seqlens_k, "
                     "B for seqused_k)")
    if t.device != q.device:
        raise _error(f"{name}.device = {t.device}", f"must be {q.device} (where q lives)")
    return t.shape[0]


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                     seqused_k: Optional[Tensor] = None, causal: bool = False, window: int = 0,
                     softcap: float = 0.0, scale: Optional[float] = None,
                     q_start: Optional[int] = None, return_lse: bool = False,
                     deterministic: bool = True, backend: str = "auto"):
    """``attention`` over a packed batch of variable-length sequences.

    Args:
        q: ``[total_q, H, d]``; k, v: ``[total_k, Hkv, d]``: the B sequences'
            rows one after another. Sequence b owns query rows
            ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` and key rows
            ``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]`` on q's device, starting
            at 0, non-decreasing, ending at total_q / total_k.
        max_seqlen_q, max_seqlen_k: bounds on every sequence's lengths (as
            FlashAttention's; they size the kernels' grids).
        seqused_k: optional int32 ``[B]``: sequence b uses only its first
            ``seqused_k[b]`` keys (its other key rows get zero gradients).
        causal, window, softcap, scale, deterministic, backend: as
            ``attention``, per sequence: each sequence is the dense problem of
            its own lengths ``Tq_b``, ``Tk_b``, its query i at key position
            ``q_start + i`` (q_start None: ``Tk_b - Tq_b``, bottom-right).
            Zero-length sequences are allowed.
        return_lse: also return lse ``[H, total_q]`` float32 (not
            differentiable).

    The offsets' values are checked in eager mode (gqattn.Error naming the
    offset); under torch.compile and CUDA graph capture they are not read on
    the host, and wrong offsets may give wrong numbers (never an access
    outside the tensors). float64 runs the f64 oracle on the CPU (gradcheck).
    """
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if t.dim() != 3:
            dims = "[total_q, H, d]" if n == "q" else "[total_k, Hkv, d]"
            raise _error(f"{n}.rank = {t.dim()}", f"must be 3 (shape {dims})")
    caller = "gqattn.torch.varlen_attention"
    n = _check_offsets_tensor(cu_seqlens_q, "cu_seqlens_q", None, q, caller)
    if n < 1:
        raise _error("cu_seqlens_q.shape = [0]", "must be [B + 1] (at least one offset, 0)")
    _check_offsets_tensor(cu_seqlens_k, "cu_seqlens_k", n, q, caller)
    if seqused_k is not None:
        _check_offsets_tensor(seqused_k, "seqused_k", n - 1, q, caller)
    if q.dtype == torch.float64 and q.device.type != "cpu":
        raise _float64_on_device(q)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if seqused_k is not None:
        seqused_k = seqused_k.contiguous()
    o, lse = _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q),
                             int(max_seqlen_k), bool(causal), int(window), float(softcap),
                             None if scale is None else float(scale),
                             None if q_start is None else int(q_start), bool(deterministic),
                             str(backend), _may_check_offsets(q))
    return (o, lse) if return_lse else o


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Sequence[int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                           deterministic: bool = True, return_attn_probs: bool = False,
                           block_table: Optional[Tensor] = None, *,
                           seqused_k: Optional[Tensor] = None, q_start: Optional[int] = None):
    """FlashAttention-2's ``flash_attn_varlen_func``, run by gqattn.

    q ``[total_q, H, d]``; k, v ``[total_k, Hkv, d]``; cu_seqlens_q/k int32
    ``[B + 1]``; max_seqlen_q/k the longest sequences. Each sequence is
    FlashAttention's dense problem of its own lengths: causal bottom-right
    aligned per sequence, window_size mapped as ``flash_attn_func`` maps it.
    Returns ``out`` ``[total_q, H, d]``, or with ``return_attn_probs=True``
    ``(out, softmax_lse, None)``, softmax_lse ``[H, total_q]`` float32.

    gqattn's additions (keywords): ``seqused_k`` (int32 ``[B]``, the keys
    each sequence uses, as FlashAttention-3's) and ``q_start`` (query i at
    key position ``q_start + i`` in every sequence; None = each sequence's
    ``Tk_b - Tq_b``).

    Not supported (ValueError): dropout_p != 0, alibi_slopes, block_table
    (paged KV), windows with a right bound > 0. See ``varlen_attention`` for
    when the offsets are checked.
    """
    name = "gqattn.flash_attn_varlen_func"
    if dropout_p != 0.0:
        raise ValueError(f"{name}: dropout_p={dropout_p} is not supported: gqattn has no "
                         "attention dropout; pass dropout_p=0.0")
    if alibi_slopes is not None:
        raise ValueError(f"{name}: alibi_slopes is not supported; pass None")
    if block_table is not None:
        raise ValueError(f"{name}: block_table is not supported: gqattn's varlen batches "
                         "take packed k and v; pass None")
    causal, window = _window_from_flash(window_size, bool(causal), caller=name)
    result = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqused_k=seqused_k, causal=causal, window=window,
                              softcap=softcap, scale=softmax_scale, q_start=q_start,
                              return_lse=bool(return_attn_probs),
                              deterministic=bool(deterministic))
    if return_attn_probs:
        out, lse = result
        return out, lse, None
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


from .kv_cache import flash_attn_with_kvcache, merge_attention_states  # noqa: E402,F401
