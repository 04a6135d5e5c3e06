"""gqattn: exact attention with grouped-query heads (GQA), causal and
sliding-window masks and logit soft-capping, forward and backward, on the CPU
and NVIDIA GPUs.

This module is the low-level API: ``forward`` / ``backward`` write into
arrays you provide (any DLPack array: numpy on the CPU, torch or cupy on
CUDA), zero-copy. For PyTorch autograd and torch.compile use
``gqattn.torch.attention`` (or ``gqattn.torch.flash_attn_func``).

Layouts (last dimension contiguous, other strides free)::

    q, o, do, dq : [B, Tq, H, d]      float32, bfloat16 or float16
    k, v, dk, dv : [B, Tk, Hkv, d]    the dtype of q; H % Hkv == 0
    lse          : [B, H, Tq]         float32 (natural log)

``forward_varlen`` / ``backward_varlen`` take a packed batch of B
variable-length sequences: q, o [total_q, H, d]; k, v [total_k, Hkv, d];
lse [H, total_q]; int32 offsets cu_seqlens_q, cu_seqlens_k [B + 1] (and
seqused_k [B]) on the tensors' device. ``q_start`` (every pass) places query
i at key position q_start + i (default Tk - Tq, per sequence in a varlen
batch).

``release_workspace_memory()`` returns the CUDA backends' retained
workspace (up to 1 GiB per device, invisible to PyTorch's caching allocator)
to the driver; a no-op without CUDA.

Checked by python/tests/ (pytest).
"""

from . import _ext
from ._ext import (Error, backend_status, backward, backward_varlen, build_info, cuda_devices,
                   forward, forward_varlen, release_workspace_memory)

__all__ = [
    "Error",
    "forward",
    "backward",
    "forward_varlen",
    "backward_varlen",
    "explain",
    "backend_status",
    "build_info",
    "cuda_devices",
    "release_workspace_memory",
    "oracle_forward",
    "oracle_backward",
    "__version__",
]

# One source for the version: the C++ library's (CMakeLists.txt project()).
__version__ = _ext.build_info()["version"]


def _dtype_name(dtype):
    # Accepts "bfloat16", numpy dtypes (np.float32, np.dtype("float32")) and
    # torch dtypes (whose str() is "torch.float32") alike.
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "__name__", None) or str(dtype)  # np.float32 is a class
    return name[len("torch."):] if name.startswith("torch.") else name


def explain(B, Tq, Tk, H, Hkv, d, *, causal=False, window=0, softcap=0.0, scale=None,
            dtype="bfloat16", device="cuda", backend="auto", backward=False,
            deterministic=True):
    """Whether ``backend`` can run this problem's forward (or, with
    ``backward=True``, its backward), without running it, and how.

    Returns ``{"supported": bool, "chosen": backend name, "reason": str,
    "plan": str}``; for ``backend="auto"``, ``chosen`` is the backend Auto
    would pick and ``reason`` says, per backend, why the faster ones would
    not run. ``plan`` is one line on what the chosen backend would run (its
    tile, score mode, split count, dQ path, workspace; "" for a backend with
    nothing to choose). A backend may support one pass and not the other,
    so Auto can pick different backends for forward and backward.
    ``dtype`` may be a name ("bfloat16"), a numpy or a torch dtype;
    ``deterministic=False`` explains a call that allows a faster
    non-deterministic path.
    """
    return _ext.explain(B, Tq, Tk, H, Hkv, d, causal=causal, window=window, softcap=softcap,
                        scale=scale, dtype=_dtype_name(dtype), device=str(device),
                        backend=backend, backward=backward, deterministic=deterministic)


def oracle_forward(q, k, v, *, causal=False, window=0, softcap=0.0, scale=None, q_start=None):
    """The f64 reference oracle's forward: returns ``(o, lse)`` as float64 numpy arrays.

    Inputs are converted to float64 numpy arrays. The oracle is plain loops
    (slow): it is meant for tests and gradient checks, not for work.
    """
    import numpy as np

    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    o = np.empty(q.shape, dtype=np.float64)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]) if q.ndim == 4 else (0,),
                   dtype=np.float64)
    _ext.oracle_forward(q, k, v, o, lse, causal=causal, window=window, softcap=softcap,
                        scale=scale, q_start=q_start)
    return o, lse


def oracle_backward(q, k, v, do, *, causal=False, window=0, softcap=0.0, scale=None,
                    q_start=None):
    """The f64 reference oracle's gradients: returns ``(dq, dk, dv)`` as float64 numpy arrays.

    It recomputes the forward itself (D = do . o with the oracle's own o).
    """
    import numpy as np

    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    dq = np.empty(q.shape, dtype=np.float64)
    dk = np.empty(k.shape, dtype=np.float64)
    dv = np.empty(k.shape, dtype=np.float64)
    _ext.oracle_backward(q, k, v, do, dq, dk, dv, causal=causal, window=window,
                         softcap=softcap, scale=scale, q_start=q_start)
    return dq, dk, dv


def __getattr__(name):
    # `gqattn.torch` (and the drop-ins `gqattn.flash_attn_interface`, the
    # FlashAttention-3 signature, and `gqattn.hf`, Hugging Face's attention
    # interface, also as `gqattn.transformers`, and `gqattn.distributed`,
    # context parallelism) without
    # importing them first; torch stays optional and `import gqattn` stays
    # fast for users who never touch it.
    if name in ("torch", "flash_attn_interface", "hf", "transformers", "distributed"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'gqattn' has no attribute {name!r}")
