"""gqattn as a Hugging Face transformers attention implementation.

::

    import gqattn.hf
    gqattn.hf.register()   # once, before loading the model
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="gqattn")

``gqattn_attention_forward`` has the signature of transformers' attention
interface (``AttentionInterface``): it gets query ``[B, H, Tq, d]`` and key,
value ``[B, Hkv, Tk, d]`` (grouped-query heads are read in place, never
repeated) and returns ``(attn_output [B, Tq, H, d], None)``: no attention
weights.

Masks. gqattn applies only causal (bottom-right aligned, as HF's masks with
a KV cache) and sliding-window masks, so the rule is conservative:

* ``attention_mask=None``: causal when the ``is_causal`` keyword, or else
  ``module.is_causal`` (default True, as HF's SDPA path), says so.
* a 2-D ``[B, Tk]`` padding mask: accepted only when every entry keeps its
  key (no padding); padding raises ValueError ("not supported").
* a 4-D mask ``[B or 1, 1 or H, Tq, Tk]`` (bool: True keeps; float: 0
  keeps): accepted only when it equals the mask gqattn applies (causal and
  the sliding window); anything else (padding, packed sequences, custom
  masks) raises ValueError. This check reads the mask (a host
  synchronisation on CUDA, and a graph break under torch.compile); pass no
  mask (``register()`` arranges that) to avoid it.

``register()`` also registers FlashAttention-2's mask function for
"gqattn" with ``AttentionMaskInterface``, so models hand this function
``None`` when nothing is padded and a 2-D padding mask otherwise (which then
raises) instead of building a 4-D mask per layer, and padded batches can
never be ignored silently. Register through ``register()``, not
``AttentionInterface.register`` alone: for an implementation with no mask
function, transformers passes ``attention_mask=None`` even for padded
batches, which this function cannot tell from an unpadded one.

Checked by python/tests/test_dropins.py (skipped without transformers).
"""

from typing import Optional

import torch
from torch import Tensor

from .torch import attention

__all__ = ["gqattn_attention_forward", "register"]

_NAME = "gqattn.hf.gqattn_attention_forward"


def _refuse(what: str, reason: str) -> ValueError:
    return ValueError(f"{_NAME}: {what} is not supported: {reason}")


def _keep_mask(Tq: int, Tk: int, causal: bool, window: int, device) -> Tensor:
    # The keys gqattn keeps: j <= i + Tk - Tq (causal) and
    # j >= i + Tk - Tq - window + 1 (window > 0).
    i = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)
    j = torch.arange(Tk, device=device)[None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if window > 0:
        keep &= j >= i - window + 1
    return keep


def _check_mask(mask: Tensor, B: int, H: int, Tq: int, Tk: int, causal: bool,
                window: int) -> None:
    if mask.dim() == 2:
        if tuple(mask.shape) != (B, Tk) or not bool(mask.bool().all()):
            raise _refuse(f"a 2-D attention_mask of shape {tuple(mask.shape)} with padding",
                          "gqattn has no padding masks (every sequence must fill the batch's "
                          f"{Tk} keys); unpad the batch or run one sequence at a time")
        return
    if mask.dim() != 4 or mask.shape[-2:] != (Tq, Tk) or mask.shape[0] not in (1, B) \
            or mask.shape[1] not in (1, H):
        raise _refuse(f"attention_mask of shape {tuple(mask.shape)}",
                      f"expected None, [B, Tk] or [B or 1, 1 or H, Tq, Tk] = [{B}, {H}, {Tq}, "
                      f"{Tk}]")
    keep = mask if mask.dtype == torch.bool else mask == 0
    expected = _keep_mask(Tq, Tk, causal, window, mask.device)
    if not bool((keep == expected).all()):
        what = "causal" if causal else "no"
        raise _refuse("this attention_mask",
                      f"it is not the plain {what} mask" +
                      (f" with sliding window {window}" if window else "") +
                      " gqattn applies (padding, packed sequences and custom masks are not "
                      "supported); pass attention_mask=None for a plain causal model")


def gqattn_attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Optional[Tensor], scaling: Optional[float] = None,
                             dropout: float = 0.0, sliding_window: Optional[int] = None,
                             softcap: Optional[float] = None, **kwargs):
    """Hugging Face attention-interface function run by gqattn.

    Args:
        module: the attention layer; its ``is_causal`` (default True) is read
            unless the ``is_causal`` keyword is passed.
        query ``[B, H, Tq, d]``; key, value ``[B, Hkv, Tk, d]``, ``H % Hkv == 0``.
        attention_mask: None, an all-keep 2-D padding mask, or a 4-D mask equal
            to the causal / sliding-window mask gqattn applies (see the module
            docstring); anything else raises ValueError.
        scaling: score scale (``1/sqrt(d)`` when None).
        dropout: must be 0 (HF passes the layer's dropout only in training;
            gqattn has no attention dropout).
        sliding_window: keys kept per query, itself included (HF's causal
            sliding-window masks keep ``q - sliding_window < k <= q``); only with
            causal attention. gqattn's ``window = sliding_window``.
        softcap: scores become ``softcap * tanh(s / softcap)`` (None or 0: off).

    Returns:
        ``(attn_output [B, Tq, H, d], None)``.

    Refused (ValueError, "not supported: <reason>"): dropout != 0,
    ``output_attentions=True``, attention sinks (``s_aux``), packed sequences
    (``cu_seq_lens_q``/``cu_seq_lens_k``), sliding windows without causal
    attention, masks other than the above.
    """
    if dropout != 0.0:
        raise _refuse(f"dropout={dropout}", "gqattn has no attention dropout (HF passes the "
                      "layer's attention_dropout in training); set it to 0")
    if kwargs.get("output_attentions", False):
        raise _refuse("output_attentions=True", "gqattn never materialises the attention "
                      "weights; use attn_implementation='eager' for them")
    if kwargs.get("s_aux") is not None:
        raise _refuse("s_aux (attention sinks)", "gqattn has no sink logits")
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        raise _refuse("packed sequences (cu_seq_lens_q/k)", "gqattn has no varlen batches")
    is_causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = 0
    if sliding_window is not None and int(sliding_window) > 0:
        if not causal:
            raise _refuse(f"sliding_window={sliding_window} without causal attention",
                          "HF's bidirectional windows are symmetric; gqattn's window bounds "
                          "only the left side")
        window = int(sliding_window)
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        if t.dim() != 4:
            raise _refuse(f"{n}.dim() = {t.dim()}", "expected [B, heads, T, d]")
    B, H, Tq, _ = query.shape
    Tk = key.shape[2]
    if attention_mask is not None:
        _check_mask(attention_mask, B, H, Tq, Tk, causal, window)
    o = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                  causal=causal, window=window, softcap=float(softcap or 0.0), scale=scaling)
    return o, None


def register(name: str = "gqattn") -> None:
    """Register ``gqattn_attention_forward`` with transformers as ``name``.

    Calls ``transformers.AttentionInterface.register(name, ...)`` and, where
    transformers has it, registers FlashAttention-2's mask function for
    ``name`` with ``AttentionMaskInterface`` (masks then arrive as None, or as
    a 2-D padding mask that raises). Then load a model with
    ``attn_implementation=name``, or set ``model.set_attn_implementation(name)``.

    Raises:
        ImportError: transformers is not installed (or has no
            AttentionInterface: it needs transformers >= 4.48).
    """
    try:
        import transformers
    except ImportError as e:
        raise ImportError("gqattn.hf.register() needs Hugging Face transformers "
                          "(pip install transformers)") from e
    interface = getattr(transformers, "AttentionInterface", None)
    if interface is None:
        raise ImportError(f"gqattn.hf.register(): transformers {transformers.__version__} has "
                          "no AttentionInterface (added in 4.48); upgrade transformers")
    interface.register(name, gqattn_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:
        return  # older transformers: models build 4-D masks, which are checked
    AttentionMaskInterface.register(name, flash_attention_mask)
