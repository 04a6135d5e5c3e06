"""Context parallelism: one sequence's attention across the ranks of a
torch.distributed group (NCCL on GPUs, gloo on CPUs), forward and backward.

Each rank holds a shard of the sequence along T (``shard`` / ``unshard`` go
between a full sequence and the shards) and calls
``context_parallel_attention`` with its shards of q, k and v; it gets its
shard of o, and autograd brings dq, dk and dv back to the ranks that own the
shards. Every block is an ordinary gqattn attention call whose queries sit
at their global positions among the block's keys (``q_start``); partial
results over different key blocks are merged by their lse, and the backward
of every block is the backward of the call that produced it with its rows'
do scaled by exp(lse_block - lse), which makes it the block's share of the
global gradient (_shard_grads).
Blocks that the causal mask or the window leaves empty are skipped.

Layouts (the sequence of T tokens over W ranks):
  "contiguous"     rank r holds tokens [r T/W, (r+1) T/W).
  "load_balanced"  the sequence in 2W chunks of T/(2W); rank r holds chunks r
                   and 2W-1-r, so that causal work is the same on every rank.
Methods:
  "all_gather"  every rank gathers all of K and V once (cheap under GQA: K, V
                are H/Hkv times smaller than Q) and attends to them in one
                call per local chunk; the backward sends each rank's dK, dV
                contributions to their owners (all_to_all) and sums them in
                rank order. Memory O(T) for K and V.
  "ring"        K and V shards travel around the ring (batched send/recv,
                the next shard in flight while the current one is used); each
                step's partial result is merged into the running one in step
                order; the backward passes the shards again with their dK, dV
                accumulators, which arrive home after W steps. Memory O(T/W).
Both are deterministic for a given W: every sum runs in a fixed order.

Checked by python/tests/test_distributed.py (gloo, 2 and 4 processes, both
layouts and methods, against the single-process result, and bitwise repeats).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import Error
from . import torch as _gt

__all__ = ["context_parallel_attention", "shard", "unshard"]

_LAYOUTS = ("contiguous", "load_balanced")
_METHODS = ("all_gather", "ring")


def _error(argument: str, rule: str) -> Error:
    return Error(f"{argument}: {rule}")


def _world(group) -> Tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _chunks_of(rank: int, world: int, layout: str) -> List[int]:
    """The global chunk indices a rank holds, in its local order."""
    if layout == "contiguous":
        return [rank]
    return [rank, 2 * world - 1 - rank]


def _num_chunks(world: int, layout: str) -> int:
    return world if layout == "contiguous" else 2 * world


def _check_layout(layout: str, method: Optional[str] = None) -> None:
    if layout not in _LAYOUTS:
        raise _error(f"layout = {layout!r}", f"must be one of {', '.join(_LAYOUTS)}")
    if method is not None and method not in _METHODS:
        raise _error(f"method = {method!r}", f"must be one of {', '.join(_METHODS)}")


def shard(x: Tensor, group=None, layout: str = "load_balanced", dim: int = 1) -> Tensor:
    """This rank's shard of a full sequence ``x`` (the same on every rank),
    split along ``dim`` (T of [B, T, heads, d]) by ``layout``."""
    _check_layout(layout)
    world, rank = _world(group)
    n = _num_chunks(world, layout)
    if x.shape[dim] % n != 0:
        raise _error(f"x.shape[{dim}] = {x.shape[dim]}",
                     f"must be a multiple of {n} to split over {world} ranks as {layout!r}")
    chunks = x.chunk(n, dim=dim)
    return torch.cat([chunks[c] for c in _chunks_of(rank, world, layout)], dim=dim)


def unshard(x: Tensor, group=None, layout: str = "load_balanced", dim: int = 1) -> Tensor:
    """The full sequence from every rank's shard ``x`` (an all_gather)."""
    _check_layout(layout)
    world, _ = _world(group)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    n = _num_chunks(world, layout)
    full: List[Optional[Tensor]] = [None] * n
    for r, part in enumerate(parts):
        for piece, c in zip(part.chunk(len(_chunks_of(r, world, layout)), dim=dim),
                            _chunks_of(r, world, layout)):
            full[c] = piece
    return torch.cat(full, dim=dim)


# ---- blocks -------------------------------------------------------------------


class _Params:
    def __init__(self, causal, window, softcap, scale, backend):
        self.causal, self.window, self.softcap = causal, window, softcap
        self.scale, self.backend = scale, backend

    def empty(self, q_pos: int, q_len: int, k_pos: int, k_len: int) -> bool:
        """Whether the mask keeps no pair of the queries at q_pos.. and the
        keys at k_pos.. (the block is skipped)."""
        if q_len == 0 or k_len == 0:
            return True
        if self.causal and k_pos > q_pos + q_len - 1:
            return True
        if self.window > 0 and k_pos + k_len - 1 < q_pos - self.window + 1:
            return True
        return False


def _block_forward(q, k, v, q_start: int, p: _Params) -> Tuple[Tensor, Tensor]:
    return _gt._attention_forward(q, k, v, causal=p.causal, window=p.window, softcap=p.softcap,
                                  scale=p.scale, deterministic=True, backend=p.backend,
                                  q_start=q_start)


def _block_backward(do, q, k, v, o, lse, q_start: int, p: _Params):
    return _gt._attention_backward(do, q, k, v, o, lse, causal=p.causal, window=p.window,
                                   softcap=p.softcap, scale=p.scale, deterministic=True,
                                   backend=p.backend, q_start=q_start)


def _merge(o: Optional[Tensor], lse: Optional[Tensor], o_b: Tensor,
           lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """(o, lse) of the union of two disjoint key sets, in f32 (o [B, T, H, d],
    lse [B, H, T]); rows with lse -inf on both sides stay o = 0, lse = -inf."""
    if o is None:
        return o_b.float(), lse_b.float()
    m = torch.maximum(lse, lse_b)
    safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    wa, wb = torch.exp(lse - safe), torch.exp(lse_b - safe)
    total = wa + wb
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    # [B, H, T] weights onto [B, T, H, 1].
    wa_o, wb_o = (wa * inv).transpose(1, 2).unsqueeze(-1), (wb * inv).transpose(1, 2).unsqueeze(-1)
    merged = wa_o * o + wb_o * o_b.float()
    return merged, torch.where(total > 0, safe + torch.log(total), m)


class _Layout:
    """Where this rank's chunks (and any rank's) sit in the sequence."""

    def __init__(self, world: int, rank: int, layout: str, t_local: int):
        self.world, self.rank, self.layout = world, rank, layout
        self.per_rank = len(_chunks_of(rank, world, layout))
        if t_local % self.per_rank != 0:
            raise _error(f"q.shape[1] = {t_local}",
                         f"must be a multiple of {self.per_rank} for layout {layout!r} "
                         "(two chunks per rank)")
        self.chunk = t_local // self.per_rank

    def pieces(self, rank: int) -> List[Tuple[int, int]]:
        """(local row, global position) of each chunk of `rank`."""
        return [(i * self.chunk, c * self.chunk)
                for i, c in enumerate(_chunks_of(rank, self.world, self.layout))]


def _rows(x: Tensor, row: int, n: int) -> Tensor:
    return x.narrow(1, row, n)


def _lse_rows(x: Tensor, row: int, n: int) -> Tensor:
    return x.narrow(2, row, n)


def _attend_shard(q, k, v, L: _Layout, k_rank: int, p: _Params, o, lse, block_lse):
    """Merges the attention of this rank's query chunks over rank k_rank's
    key chunks into (o, lse) (lists, one per query chunk), in key order; each
    block's own lse goes to block_lse[(query row, k_rank, key row)] for the
    backward."""
    for qi, (q_row, q_pos) in enumerate(L.pieces(L.rank)):
        for k_row, k_pos in L.pieces(k_rank):
            if p.empty(q_pos, L.chunk, k_pos, L.chunk):
                continue
            ob, lb = _block_forward(_rows(q, q_row, L.chunk).contiguous(),
                                    _rows(k, k_row, L.chunk).contiguous(),
                                    _rows(v, k_row, L.chunk).contiguous(), q_pos - k_pos, p)
            block_lse[(q_row, k_rank, k_row)] = lb
            o[qi], lse[qi] = _merge(o[qi], lse[qi], ob, lb)


def _shard_grads(do, q, k, v, o, lse, block_lse, L: _Layout, k_rank: int, p: _Params, dq, dk,
                 dv):
    """Adds the gradients of this rank's query chunks against rank k_rank's
    key chunks: to dq (this rank's) and dk, dv (k_rank's shard), in f32.

    A block is differentiated as the call that produced it, with its own lse
    (so any backend, one that recomputes P from the scores or one that reads
    lse, forms the block's P_b = exp(s - lse_b)), the global o, and do
    scaled per row by w = exp(lse_b - lse): then D = rowsum(w do o) = w D,
    dS = P_b (w dP - w D) = P (dP - D) with the global P = w P_b, and
    dV = P_b^T (w do) = P^T do -- the block's share of the global gradient.
    """
    for q_row, q_pos in L.pieces(L.rank):
        for k_row, k_pos in L.pieces(k_rank):
            if p.empty(q_pos, L.chunk, k_pos, L.chunk):
                continue
            lse_b = block_lse[(q_row, k_rank, k_row)]
            lse_g = _lse_rows(lse, q_row, L.chunk)
            w = torch.where(torch.isinf(lse_b) & (lse_b < 0), torch.zeros_like(lse_b),
                            torch.exp(lse_b - lse_g))
            do_b = (_rows(do, q_row, L.chunk).float() * w.transpose(1, 2).unsqueeze(-1))
            gq, gk, gv = _block_backward(
                do_b.to(do.dtype).contiguous(), _rows(q, q_row, L.chunk).contiguous(),
                _rows(k, k_row, L.chunk).contiguous(), _rows(v, k_row, L.chunk).contiguous(),
                _rows(o, q_row, L.chunk).contiguous(), lse_b.contiguous(), q_pos - k_pos, p)
            _rows(dq, q_row, L.chunk).add_(gq.float())
            _rows(dk, k_row, L.chunk).add_(gk.float())
            _rows(dv, k_row, L.chunk).add_(gv.float())


def _ring_start(tensors: Sequence[Tensor], group, world: int, rank: int):
    """Starts sending `tensors` to rank + 1 and receiving the same-shaped ones
    from rank - 1 (one batch of point-to-point operations); returns the
    receive buffers and the requests to wait on before reading them."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    g_nxt = dist.get_global_rank(group, nxt) if group is not None else nxt
    g_prv = dist.get_global_rank(group, prv) if group is not None else prv
    sent = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in sent]
    ops = [dist.P2POp(dist.isend, t, g_nxt, group) for t in sent]
    ops += [dist.P2POp(dist.irecv, t, g_prv, group) for t in received]
    return received, dist.batch_isend_irecv(ops)


def _ring_wait(requests) -> None:
    for req in requests:
        req.wait()


def _forward(q, k, v, L: _Layout, p: _Params, method: str, group):
    n_local = L.per_rank
    block_lse = {}
    o: List[Optional[Tensor]] = [None] * n_local
    lse: List[Optional[Tensor]] = [None] * n_local
    if method == "all_gather":
        ks = [torch.empty_like(k) for _ in range(L.world)]
        vs = [torch.empty_like(v) for _ in range(L.world)]
        dist.all_gather(ks, k.contiguous(), group=group)
        dist.all_gather(vs, v.contiguous(), group=group)
        for r in range(L.world):  # fixed order: rank 0's keys first
            _attend_shard(q, ks[r], vs[r], L, r, p, o, lse, block_lse)
    else:
        cur_k, cur_v = k, v
        for step in range(L.world):
            src = (L.rank - step) % L.world
            if step + 1 < L.world:  # the next shard in flight while this one is used
                nxt, requests = _ring_start([cur_k, cur_v], group, L.world, L.rank)
            _attend_shard(q, cur_k, cur_v, L, src, p, o, lse, block_lse)
            if step + 1 < L.world:
                _ring_wait(requests)
                cur_k, cur_v = nxt
    B, _, H, d = q.shape
    for i in range(n_local):  # a chunk no key reached: o = 0, lse = -inf
        if o[i] is None:
            o[i] = q.new_zeros((B, L.chunk, H, d), dtype=torch.float32)
            lse[i] = q.new_full((B, H, L.chunk), float("-inf"), dtype=torch.float32)
    return torch.cat(o, dim=1).to(q.dtype), torch.cat(lse, dim=2), block_lse


def _backward(do, q, k, v, o, lse, block_lse, L: _Layout, p: _Params, method: str, group):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if method == "all_gather":
        ks = [torch.empty_like(k) for _ in range(L.world)]
        vs = [torch.empty_like(v) for _ in range(L.world)]
        dist.all_gather(ks, k.contiguous(), group=group)
        dist.all_gather(vs, v.contiguous(), group=group)
        dks = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in ks]
        dvs = [torch.zeros(v.shape, dtype=torch.float32, device=v.device) for _ in vs]
        for r in range(L.world):
            _shard_grads(do, q, ks[r], vs[r], o, lse, block_lse, L, r, p, dq, dks[r], dvs[r])
        # Each owner gets every rank's contribution to its shard and sums
        # them in rank order.
        got_k = [torch.empty_like(dks[0]) for _ in range(L.world)]
        got_v = [torch.empty_like(dvs[0]) for _ in range(L.world)]
        dist.all_to_all(got_k, dks, group=group)
        dist.all_to_all(got_v, dvs, group=group)
        dk, dv = got_k[0], got_v[0]
        for r in range(1, L.world):
            dk = dk + got_k[r]
            dv = dv + got_v[r]
    else:
        cur_k, cur_v = k, v
        acc_k = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        acc_v = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for step in range(L.world):
            src = (L.rank - step) % L.world
            last = step + 1 == L.world
            if not last:  # the next shard in flight while this one is used
                nxt, requests = _ring_start([cur_k, cur_v], group, L.world, L.rank)
            _shard_grads(do, q, cur_k, cur_v, o, lse, block_lse, L, src, p, dq, acc_k, acc_v)
            # The accumulators follow their shard; after W moves they are home.
            (acc_k, acc_v), acc_requests = _ring_start([acc_k, acc_v], group, L.world, L.rank)
            _ring_wait(acc_requests)
            if not last:
                _ring_wait(requests)
                cur_k, cur_v = nxt
        dk, dv = acc_k, acc_v
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, L, p, method, group):
        o, lse, block_lse = _forward(q, k, v, L, p, method, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block_lse = block_lse
        ctx.args = (L, p, method, group)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(do.contiguous(), q, k, v, o, lse, ctx.block_lse, *ctx.args)
        return dq, dk, dv, None, None, None, None


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, *, group=None,
                               causal: bool = False, window: int = 0, softcap: float = 0.0,
                               scale: Optional[float] = None, layout: str = "load_balanced",
                               method: str = "all_gather", backend: str = "auto") -> Tensor:
    """This rank's shard of the attention output of one sequence whose q, k,
    v [B, T_local, heads, d] shards (``shard``) are spread over ``group``.
    Differentiable. The mask's positions are the global ones (queries and
    keys of the full sequence, Tq = Tk). A group of one rank is plain
    ``gqattn.torch.attention``."""
    _check_layout(layout, method)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise _error("q, k, v", "must be [B, T_local, heads, d] shards")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise _error(f"k.shape[1] = {k.shape[1]}",
                     f"must equal q.shape[1] = {q.shape[1]} (one sequence: Tq = Tk)")
    if q.dtype == torch.float64:
        raise _error("q.dtype = float64", "not supported: the partial blocks need a backend "
                     "that takes o and lse (float32, bfloat16, float16)")
    world, rank = _world(group)
    if world == 1:
        return _gt.attention(q, k, v, causal=causal, window=window, softcap=softcap,
                             scale=scale, backend=backend)
    # Equal shards on every rank (cheap to detect: one small all_gather).
    lengths = [torch.zeros(1, dtype=torch.int64, device=q.device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([q.shape[1]], dtype=torch.int64, device=q.device),
                    group=group)
    if any(int(x.item()) != q.shape[1] for x in lengths):
        raise _error(f"q.shape[1] = {q.shape[1]} on rank {rank}",
                     "every rank must hold a shard of the same length "
                     f"(got {[int(x.item()) for x in lengths]})")
    L = _Layout(world, rank, layout, q.shape[1])
    p = _Params(causal, int(window), float(softcap), scale, backend)
    return _ContextParallel.apply(q, k, v, L, p, method, group)
