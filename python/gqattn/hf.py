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
  the sliding window; per sequence in a packed batch, below); anything
  else (padding, custom masks) raises ValueError. This check reads the
  mask (a host synchronisation on CUDA, and a graph break under
  torch.compile); pass no mask (``register()`` arranges that) to avoid it.

``register()`` also registers FlashAttention-2's mask function for
"gqattn" with ``AttentionMaskInterface``, so models hand this function
``None`` when nothing is padded and a 2-D padding mask otherwise (which then
raises) instead of building a 4-D mask per layer, and padded batches can
never be ignored silently. Register through ``register()``, not
``AttentionInterface.register`` alone: for an implementation with no mask
function, transformers passes ``attention_mask=None`` even for padded
batches, which this function cannot tell from an unpadded one.

Packed (padding-free) batches, as transformers' FlashAttention path takes
them: B = 1 row holding several sequences one after another (e.g. from
``DataCollatorWithFlattening``). Each sequence is attended on its own (causal,
sliding window, softcap and scaling per sequence, as the dense path) through
``gqattn.torch.varlen_attention``; the output keeps the dense layout
``[1, total, H, d]``. The sequences are found as FlashAttention's path finds
them:

* ``cu_seq_lens_q``, ``cu_seq_lens_k`` (int ``[n + 1]`` offsets) and
  ``max_length_q``, ``max_length_k`` (the longest sequences; read from the
  offsets when absent): what ``DataCollatorWithFlattening(
  return_flash_attn_kwargs=True)`` returns and models pass down. Only with
  B = 1 (else ValueError); nothing else is read.
* else ``position_ids`` ``[1, T]`` alone (the collator's default): the row
  is packed when it is not one run ``p0, p0 + 1, ...``; sequences start where
  the position id equals the row's smallest (transformers'
  ``_is_packed_sequence`` and ``prepare_fa_kwargs_from_position_ids``:
  transformers hands the attention function the position ids, not offsets,
  so they are read here). Whenever position ids of one row (B = 1) arrive
  without the ``cu_seq_lens`` keywords and ``Tq > 1`` (models pass them for
  plain batches too), they are read on the host in every layer: one
  synchronisation on CUDA, and a graph break under torch.compile, as in
  transformers' FlashAttention path. The ``cu_seq_lens``/``max_length``
  keywords avoid it (that path compiles with ``fullgraph=True``). Batches of
  B > 1 rows are never read for packing (as there): packed rows come as one
  row. Packed position ids with a KV cache (``Tk != Tq``) raise ValueError
  rather than being attended across.

With a packed batch, a 2-D mask must keep every key and a 4-D mask must
equal the per-sequence (block-diagonal) causal / sliding-window mask gqattn
applies (ValueError otherwise).

Also importable as ``gqattn.transformers`` (``register``,
``gqattn_attention_forward``).

Checked by python/tests/test_dropins.py and test_hf_varlen.py (the model
tests skip without transformers).
"""

from typing import Optional

import torch
from torch import Tensor

from .torch import attention, varlen_attention

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


def _packed_keep_mask(cu_q: Tensor, cu_k: Tensor, causal: bool, window: int) -> Tensor:
    # [total_q, total_k]: the keys gqattn keeps in a packed batch. Query row r
    # of sequence b (local index i) keeps key row c of the same sequence
    # (local index j) under the dense rule of that sequence's own lengths.
    cu_q, cu_k = cu_q.long(), cu_k.long()
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    rows = torch.arange(total_q, device=cu_q.device)
    cols = torch.arange(total_k, device=cu_q.device)
    seq_q = torch.searchsorted(cu_q[1:], rows, right=True)
    seq_k = torch.searchsorted(cu_k[1:], cols, right=True)
    i = rows - cu_q[seq_q]
    j = cols - cu_k[seq_k]
    pos = i + (cu_k[seq_q + 1] - cu_k[seq_q]) - (cu_q[seq_q + 1] - cu_q[seq_q])
    keep = seq_q[:, None] == seq_k[None, :]
    if causal:
        keep &= j[None, :] <= pos[:, None]
    if window > 0:
        keep &= j[None, :] >= pos[:, None] - window + 1
    return keep


def _check_packed_mask(mask: Tensor, H: int, Tq: int, Tk: int, cu_q: Tensor, cu_k: Tensor,
                       causal: bool, window: int) -> None:
    if mask.dim() == 2:
        _check_mask(mask, 1, H, Tq, Tk, causal, window)  # all keep, or it raises
        return
    if mask.dim() != 4 or mask.shape[-2:] != (Tq, Tk) or mask.shape[0] != 1 \
            or mask.shape[1] not in (1, H):
        raise _refuse(f"attention_mask of shape {tuple(mask.shape)} with a packed batch",
                      f"expected None, [1, Tk] or [1, 1 or H, Tq, Tk] = [1, {H}, {Tq}, {Tk}]")
    keep = mask if mask.dtype == torch.bool else mask == 0
    expected = _packed_keep_mask(cu_q, cu_k, causal, window)
    if tuple(expected.shape) != (Tq, Tk):
        raise _refuse(f"offsets ending at {tuple(expected.shape)} (total_q, total_k)",
                      f"cu_seq_lens_q/k must end at the packed rows, ({Tq}, {Tk})")
    if not bool((keep == expected).all()):
        raise _refuse("this attention_mask with a packed batch",
                      "it is not the per-sequence " + ("causal" if causal else "full") +
                      (f" sliding-window ({window})" if window else "") +
                      " mask gqattn applies; pass attention_mask=None")


def _as_offsets(t, name: str, device) -> Tensor:
    t = torch.as_tensor(t)
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise _refuse(f"{name} of shape {tuple(t.shape)} and dtype {t.dtype}",
                      "expected a vector of integer offsets [n + 1]")
    return t.to(device=device, dtype=torch.int32)


def _max_length(given, cu: Tensor) -> int:
    if given is not None:
        return int(given)  # an int, or a 0-d tensor (transformers' own, from position ids)
    return int((cu[1:] - cu[:-1]).max()) if cu.shape[0] > 1 else 0


def _packed_from_kwargs(kwargs, B: int, device):
    # (cu_q, cu_k, max_q, max_k) from transformers' FlashAttention keywords, or None.
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and cu_k is None:
        return None
    if B != 1:
        raise _refuse(f"cu_seq_lens_q/k with batch size B = {B}",
                      "a packed batch is one row holding every sequence (B = 1, as "
                      "DataCollatorWithFlattening builds it)")
    if cu_q is None or cu_k is None:
        missing = "cu_seq_lens_k" if cu_k is None else "cu_seq_lens_q"
        raise _refuse(f"a packed batch without {missing}",
                      "pass cu_seq_lens_q and cu_seq_lens_k together")
    cu_q = _as_offsets(cu_q, "cu_seq_lens_q", device)
    cu_k = _as_offsets(cu_k, "cu_seq_lens_k", device)
    return (cu_q, cu_k, _max_length(kwargs.get("max_length_q"), cu_q),
            _max_length(kwargs.get("max_length_k"), cu_k))


def _is_packed(position_ids, B: int, Tq: int) -> bool:
    # Whether position_ids describe packed sequences, as transformers'
    # FlashAttention path reads them (_is_packed_sequence): some row is not
    # one run p0, p0 + 1, ... (reads the values: a host synchronisation).
    # Only for B = 1, as there: a plain batch of B > 1 rows pays no read.
    if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or Tq <= 1 \
            or position_ids.shape[-1] != Tq or B != 1 or position_ids.shape[0] != 1:
        return False  # absent, a single query (decoding), B > 1, or a layout not read
    first = position_ids.min(dim=-1, keepdim=True).values
    return bool((position_ids != first + torch.arange(Tq, device=position_ids.device)).any())


def _packed_from_position_ids(position_ids: Tensor, B: int, Tq: int, Tk: int, device):
    # (cu, cu, max, max) for packed position_ids (_is_packed): sequences start
    # where the position id is the row's smallest, as transformers'
    # prepare_fa_kwargs_from_position_ids finds them. Raises where that
    # cannot run.
    if B != 1 or position_ids.shape[0] != 1:
        raise _refuse(f"packed sequences in position_ids with batch size B = {B}",
                      "a packed batch is one row holding every sequence (B = 1, as "
                      "DataCollatorWithFlattening builds it)")
    if Tk != Tq:
        raise _refuse(f"packed sequences in position_ids with Tq = {Tq} != Tk = {Tk}",
                      "packed batches have no KV cache (every sequence's keys are its queries)")
    row = position_ids[0]
    starts = (row == row.min()).nonzero().view(-1)
    if int(starts[0]) != 0:
        raise _refuse("packed position_ids whose first entry is not the smallest",
                      "every packed sequence starts at the row's smallest position id "
                      "(as transformers' FlashAttention path reads them)")
    cu = torch.cat((starts, starts.new_tensor([Tq]))).to(device=device, dtype=torch.int32)
    longest = _max_length(None, cu)
    return cu, cu, longest, longest


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
            to the causal / sliding-window mask gqattn applies (per sequence in a
            packed batch; see the module docstring); anything else raises
            ValueError.
        scaling: score scale (``1/sqrt(d)`` when None).
        dropout: must be 0 (HF passes the layer's dropout only in training;
            gqattn has no attention dropout).
        sliding_window: keys kept per query, itself included (HF's causal
            sliding-window masks keep ``q - sliding_window < k <= q``); only with
            causal attention. gqattn's ``window = sliding_window``.
        softcap: scores become ``softcap * tanh(s / softcap)`` (None or 0: off).
        cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k (keywords): a
            packed batch (B = 1), as transformers passes them to FlashAttention;
            sequence n owns query rows ``cu_seq_lens_q[n] .. cu_seq_lens_q[n+1] - 1``
            and key rows likewise.
        position_ids (keyword): read for packed sequences when the cu_seq_lens
            keywords are absent (see the module docstring).

    Returns:
        ``(attn_output [B, Tq, H, d], None)`` (``[1, total, H, d]`` for a packed
        batch).

    Refused (ValueError, "not supported: <reason>"): dropout != 0,
    ``output_attentions=True``, attention sinks (``s_aux``), packed sequences
    with B > 1 or (from position_ids) with ``Tk != Tq``, only one of
    ``cu_seq_lens_q``/``cu_seq_lens_k``, sliding windows without causal
    attention, masks other than the above. Offsets that break gqattn's varlen
    rules raise gqattn.Error (a ValueError) naming the offset.
    """
    if dropout != 0.0:
        raise _refuse(f"dropout={dropout}", "gqattn has no attention dropout (HF passes the "
                      "layer's attention_dropout in training); set it to 0")
    if kwargs.get("output_attentions", False):
        raise _refuse("output_attentions=True", "gqattn never materialises the attention "
                      "weights; use attn_implementation='eager' for them")
    if kwargs.get("s_aux") is not None:
        raise _refuse("s_aux (attention sinks)", "gqattn has no sink logits")
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
    packed = _packed_from_kwargs(kwargs, B, query.device)
    mask_checked = False
    position_ids = kwargs.get("position_ids")
    if packed is None and attention_mask is not None and attention_mask.dim() == 2:
        _check_mask(attention_mask, B, H, Tq, Tk, causal, window)  # padding raises first
        mask_checked = True
    if packed is None and _is_packed(position_ids, B, Tq):
        try:
            packed = _packed_from_position_ids(position_ids, B, Tq, Tk, query.device)
        except ValueError:
            if attention_mask is not None and not mask_checked:
                _check_mask(attention_mask, B, H, Tq, Tk, causal, window)  # e.g. padding
            raise
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        if attention_mask is not None and not mask_checked:
            _check_packed_mask(attention_mask, H, Tq, Tk, cu_q, cu_k, causal, window)
        # [1, H, T, d] -> [T, H, d] views; the output [total_q, H, d] -> [1, Tq, H, d].
        o = varlen_attention(query[0].transpose(0, 1), key[0].transpose(0, 1),
                             value[0].transpose(0, 1), cu_q, cu_k, max_q, max_k, causal=causal,
                             window=window, softcap=float(softcap or 0.0), scale=scaling)
        return o.unsqueeze(0), None
    if attention_mask is not None and not mask_checked:
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
