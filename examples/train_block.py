#!/usr/bin/env python3
"""Train a small language model built on one GQA transformer block whose
attention is gqattn.torch.attention (causal, sliding window, logit softcap),
for a few steps, and check that the loss goes down.

    python examples/train_block.py --device cpu --size toy    # seconds
    python examples/train_block.py --device cuda --size real  # bf16, T=4096, d=128

The task is synthetic (no data set to download): token streams that repeat
with a short period, drawn from a skewed vocabulary, so the loss falls as
the model learns the unigram counts and then to copy from `period` tokens
back, which the sliding window must reach. Exits 1 if the loss did not fall.
This is the Python README's example; python/tests/test_example.py runs it at
toy size on the CPU.
"""

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gqattn.torch as gt

SIZES = {
    # A few seconds on two CPU cores.
    "toy": dict(vocab=64, dim=64, heads=4, kv_heads=2, seq=64, batch=8, window=16,
                softcap=20.0, period=8, steps=40, lr=3e-3),
    # A Gemma-2-like attention layer: d = 128, 4 query heads per kv head.
    "real": dict(vocab=32000, dim=2048, heads=16, kv_heads=4, seq=4096, batch=4, window=1024,
                 softcap=50.0, period=512, steps=30, lr=3e-4),
}


class Block(nn.Module):
    """Pre-norm transformer block: GQA self-attention and an MLP."""

    def __init__(self, dim, heads, kv_heads, window, softcap):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.window, self.softcap = window, softcap
        self.norm1 = nn.RMSNorm(dim)
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, T, _ = x.shape
        h = self.norm1(x)
        # gqattn's layout is [B, T, heads, head_dim], what the projections
        # give after a view: no transpose. k and v are strided views of one
        # projection; gqattn reads them in place (last dimension contiguous).
        q = self.wq(h).view(B, T, self.heads, self.head_dim)
        k, v = self.wkv(h).view(B, T, 2, self.kv_heads, self.head_dim).unbind(2)
        a = gt.attention(q, k, v, causal=True, window=self.window, softcap=self.softcap)
        x = x + self.wo(a.reshape(B, T, -1))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, heads, kv_heads, seq, window, softcap, **_):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.block = Block(dim, heads, kv_heads, window, softcap)
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        return self.head(self.norm(self.block(x)))


def batch(cfg, generator, device):
    # Zipf-like token frequencies; each row repeats a random motif of length
    # `period`, so token t equals token t - period (inside the window).
    weights = 1.0 / torch.arange(1, cfg["vocab"] + 1, dtype=torch.float)
    motif = torch.multinomial(weights, cfg["batch"] * cfg["period"], replacement=True,
                              generator=generator).view(cfg["batch"], cfg["period"])
    reps = math.ceil((cfg["seq"] + 1) / cfg["period"])
    stream = motif.repeat(1, reps)[:, :cfg["seq"] + 1]
    return stream[:, :-1].to(device), stream[:, 1:].to(device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="toy")
    parser.add_argument("--steps", type=int, help="training steps (default: per size)")
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    cfg = dict(SIZES[args.size])
    if args.steps:
        cfg["steps"] = args.steps
    device = torch.device(args.device)
    if args.size == "real" and device.type == "cpu":
        print("note: --size real on the CPU runs gqattn's reference backend; expect hours")
    if args.size == "toy" and device.type == "cpu":
        # Matrices this small gain nothing from threads, and on a busy
        # machine OpenMP's waiting threads cost seconds per step.
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    model = TinyLM(**cfg).to(device)
    step_fn = torch.compile(model, fullgraph=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    # bf16 on the GPU (autocast hands gqattn bf16 q, k, v); f32 on the CPU.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    losses = []
    start = time.perf_counter()
    for step in range(cfg["steps"]):
        tokens, targets = batch(cfg, generator, device)
        with autocast:
            logits = step_fn(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # .item() synchronises: the timing is honest
        if step % max(1, cfg["steps"] // 8) == 0 or step == cfg["steps"] - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    tokens_per_s = cfg["steps"] * cfg["batch"] * cfg["seq"] / seconds

    tail = sum(losses[-5:]) / len(losses[-5:])
    print(f"loss {losses[0]:.4f} -> {tail:.4f} (mean of the last 5) in {cfg['steps']} steps, "
          f"{seconds:.1f} s, {tokens_per_s:,.0f} tokens/s on {device}")
    if not tail < losses[0]:
        print("FAILED: the loss did not fall")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
