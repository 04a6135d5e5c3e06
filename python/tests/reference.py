"""The tests' own f64 attention in numpy, forward and backward, written from
the semantics (docs/semantics.md) and sharing nothing with the
library: the binding's results are checked against it, not against gqattn's
own oracle, so a bug in both cannot hide. Its gradient is itself checked
against central finite differences in test_numpy.py.
"""

import numpy as np


def default_scale(d):
    # The library computes 1/sqrt(d) in float32 (Problem::effective_scale);
    # use the same number so f64 comparisons are not off by float32 rounding.
    return float(np.float32(1.0) / np.sqrt(np.float32(d)))


def keep_mask(Tq, Tk, causal, window):
    """[Tq, Tk] bool: key j kept for query i. Queries sit at i + (Tk - Tq)."""
    pos = np.arange(Tq)[:, None] + (Tk - Tq)
    j = np.arange(Tk)[None, :]
    keep = np.ones((Tq, Tk), dtype=bool)
    if causal:
        keep &= j <= pos
    if window:
        keep &= j >= pos - window + 1
    return keep


def _expand(kv, H):
    # [B, Tk, Hkv, d] -> [B, Tk, H, d]: query head h reads kv head h // (H // Hkv).
    return np.repeat(kv, H // kv.shape[2], axis=2)


def _parts(q, k, v, causal, window, softcap, scale):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Tq, H, d = q.shape
    Tk = k.shape[1]
    scale = default_scale(d) if scale is None else float(np.float32(scale))
    kh, vh = _expand(k, H), _expand(v, H)
    raw = scale * np.einsum("bihd,bjhd->bhij", q, kh)
    s = softcap * np.tanh(raw / softcap) if softcap else raw
    keep = keep_mask(Tq, Tk, causal, window)[None, None]
    m = np.where(keep, s, -np.inf).max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # rows with no kept key
    e = np.where(keep, np.exp(np.where(keep, s - m, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    P = e / np.where(total > 0, total, 1.0)
    o = np.einsum("bhij,bjhd->bihd", P, vh)
    total, m = total[..., 0], m[..., 0]
    lse = np.where(total > 0, m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    return dict(q=q, kh=kh, vh=vh, raw=raw, P=P, o=o, lse=lse, scale=scale)


def forward(q, k, v, causal=False, window=0, softcap=0.0, scale=None):
    """Returns (o [B, Tq, H, d], lse [B, H, Tq]) in float64."""
    p = _parts(q, k, v, causal, window, softcap, scale)
    return p["o"], p["lse"]


def backward(q, k, v, do, causal=False, window=0, softcap=0.0, scale=None):
    """Returns (dq, dk, dv) in float64: the gradient of sum(o * do)."""
    p = _parts(q, k, v, causal, window, softcap, scale)
    do = np.asarray(do, dtype=np.float64)
    B, Tk, Hkv, d = np.shape(k)
    H = p["q"].shape[2]
    dP = np.einsum("bihd,bjhd->bhij", do, p["vh"])
    D = np.einsum("bihd,bihd->bhi", do, p["o"])[..., None]
    dS = p["P"] * (dP - D)
    if softcap:
        dS = dS * (1.0 - np.tanh(p["raw"] / softcap) ** 2)
    dq = p["scale"] * np.einsum("bhij,bjhd->bihd", dS, p["kh"])
    dkh = p["scale"] * np.einsum("bhij,bihd->bjhd", dS, p["q"])
    dvh = np.einsum("bhij,bihd->bjhd", p["P"], do)
    group = H // Hkv
    dk = dkh.reshape(B, Tk, Hkv, group, d).sum(axis=3)
    dv = dvh.reshape(B, Tk, Hkv, group, d).sum(axis=3)
    return dq, dk, dv


def inputs(rng, B, Tq, Tk, H, Hkv, d, dtype=np.float32):
    """Fresh inputs of the kind docs/semantics.md's checker draws: normal
    with a non-zero mean, a few rows of large magnitude (the softmax's max
    tracking), never zeros."""
    q = rng.normal(0.3, 1.0, (B, Tq, H, d))
    k = rng.normal(-0.2, 1.0, (B, Tk, Hkv, d))
    v = rng.normal(0.5, 1.0, (B, Tk, Hkv, d))
    do = rng.normal(0.1, 1.0, (B, Tq, H, d))
    q[:, rng.integers(0, Tq)] *= 8.0
    k[:, rng.integers(0, Tk)] *= 8.0
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def rel_error(x, ref):
    """max |x - ref| / max |ref| (docs/semantics.md), over finite reference
    entries; inf where x is not finite where ref is."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref)
    if not np.all(np.isfinite(x[finite])):
        return np.inf
    scale = np.abs(ref[finite]).max() if finite.any() else 1.0
    return np.abs(x[finite] - ref[finite]).max() / max(scale, 1e-300)
