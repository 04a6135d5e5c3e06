// The shared fused layer: where sequence b of a batch lives and what its mask
// is. A dense batch's sequences are all alike (rows from 0, the batch's
// mask); a varlen batch's sequence b starts at row cu_seqlens[b] of the
// packed tensors (batch stride 0, rows of a [1, total, heads, d] view) with
// its own lengths. Every kernel of both fused backends addresses its rows
// through this, so a tile never mixes sequences unmasked: rows past the
// sequence's tq or tk are outside its mask like rows past a dense Tq or Tk.
//
// Offsets the library did not check (Options::check_offsets off) are clamped
// here: row0 in [0, total], length in [0, min(total - row0, max length)],
// seqused_k in [0, tk]. So no index a kernel forms from a Sequence leaves
// the tensors, whatever the offsets say. Checked on the host by
// tests/cpu/test_fused_sequence.cpp (clamping) and through the varlen GPU
// tests of both backends.
#pragma once

#include <cstdint>

#include "cuda/fused/host_device.hpp"
#include "cuda/fused/params.hpp"

namespace gqattn::fused {

struct Sequence {
  int q_row0 = 0;   // first row of q, o, do, dq (and lse column) of the sequence
  int k_row0 = 0;   // first row of k, v, dk, dv
  int ws_row0 = 0;  // first row of its block of the backward's per-head workspaces
  // Its packed key rows (k, v, dk, dv), at least mask.tk: the rows past
  // seqused_k are not read, but their dk, dv are written (zeros).
  int k_rows = 0;
  MaskArgs mask;  // its lengths, query offset and window
};

// The window of a sequence whose queries sit at off .. off + tq - 1: 0 when
// it keeps every key on the left (Problem::effective_window's rule).
GQATTN_HD int sequence_window(int window, int off, int tq) {
  return window <= 0 || int64_t(window) >= int64_t(off) + tq ? 0 : window;
}

GQATTN_HD int clamp_to(int x, int lo, int hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Rows of the backward's per-head workspaces that sequence b's block starts
// at: its first packed row rounded up to kWorkspaceRowAlign, plus one
// alignment unit per earlier sequence. Blocks of tq rows rounded up to
// kWorkspaceRowAlign never overlap (the rounding of sequence b loses less
// than the unit it adds), and with clamped offsets every block ends within
// varlen_workspace_rows(total_q, B).
GQATTN_HD int64_t varlen_workspace_row0(int q_row0, int b) {
  const int64_t a = kWorkspaceRowAlign;
  return (int64_t(q_row0) + a - 1) / a * a + int64_t(b) * a;
}
GQATTN_HD int64_t varlen_workspace_rows(int64_t total_q, int64_t batch) {
  const int64_t a = kWorkspaceRowAlign;
  return (total_q + a - 1) / a * a + (batch + 1) * a;
}

// Sequence b of the batch: `batch_mask` is the batch's (MaskArgs of the
// problem: tq, tk the longest lengths for a varlen batch).
GQATTN_HD Sequence sequence_of(const SequenceArgs& s, const MaskArgs& batch_mask, int b) {
  Sequence seq;
  seq.mask = batch_mask;
  seq.k_rows = batch_mask.tk;
  if (!s.varlen()) return seq;
  const int q0 = clamp_to(s.cu_seqlens_q[b], 0, s.total_q);
  const int q1 = clamp_to(s.cu_seqlens_q[b + 1], q0, s.total_q);
  const int k0 = clamp_to(s.cu_seqlens_k[b], 0, s.total_k);
  const int k1 = clamp_to(s.cu_seqlens_k[b + 1], k0, s.total_k);
  const int tq = q1 - q0 < batch_mask.tq ? q1 - q0 : batch_mask.tq;
  int tk = k1 - k0 < batch_mask.tk ? k1 - k0 : batch_mask.tk;
  seq.k_rows = tk;
  if (s.seqused_k != nullptr) tk = clamp_to(s.seqused_k[b], 0, tk);
  seq.q_row0 = q0;
  seq.k_row0 = k0;
  seq.ws_row0 = int(varlen_workspace_row0(q0, b));
  seq.mask.tq = tq;
  seq.mask.tk = tk;
  if (!s.q_start_given) seq.mask.off = tk - tq;
  seq.mask.window = sequence_window(batch_mask.window, seq.mask.off, tq);
  return seq;
}

}  // namespace gqattn::fused
