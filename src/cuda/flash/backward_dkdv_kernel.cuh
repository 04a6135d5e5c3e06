// cuda-flash: the backward's dK/dV kernel. One CTA per (key tile, kv head,
// batch) walks the query tiles of every query head of its GQA group, so dK
// and dV are accumulated in registers once per kv head (never expanded to H
// heads in memory) and written once, without atomics: deterministic. Checked
// against the f64 oracle by tests/gpu/test_flash_*.cpp.
//
// It computes the transposed products, so that the rows of every
// accumulator are keys (the "swapAB" arrangement):
//   dP^T = V dO^T,  S^T = K Q^T           (A from the CTA's K/V tiles)
//   P^T  = 2^(v * mult - lse2)            (masked elements set to 0)
//   dS^T = P^T o (dP^T - D) [o (1 - v^2) under softcap]
//   dV  += P^T dO,  dK += dS^T Q          (A = P^T, dS^T)
// Warps form a kWarpsN x kWarpsD grid: warp (wn, wd) owns keys
// [kKeysPerWarp wn, kKeysPerWarp (wn + 1)) (kMT m16 tiles; with two, each
// Q / dO fragment read from shared memory feeds two mma), computes S^T /
// dP^T for queries [wd kBlockM/kWarpsD, ...) and accumulates dK / dV
// columns [wd d/kWarpsD, ...). With kWarpsD == 1 the A operands P^T, dS^T
// come straight from the accumulators; otherwise through shared memory.
// Q, dO (and lse2, D) are double-buffered (Tile::kQueryStages == 2): step
// t+1's loads are issued right after the barrier that opens step t; on the
// single-buffered small-shared-memory tiles of d128 and d256, after a
// barrier that follows step t's dV / dK products, so they overlap only its
// dQ partial. dK gets the softmax scale at the end.
//
// Walk: query tiles last first, and at each the heads of the GQA group in
// turn, so that under a causal mask every key tile that visits query tile m
// of head h does so at the same step (key tile n visits the query tiles from
// its diagonal to the last).
//
// kFusedDq (DqStrategy::kOrdered and kAtomic, one kernel): each step also
// computes its dQ partial dS K (dS^T through shared memory, read back with
// ldmatrix.trans; warps form a kDqWarpsM x kDqWarpsD grid over it) and
// adds it into the f32 accumulator p.dq_accum, fragment-major
// (dq_accum_layout.hpp: one 16-byte reduction per lane and C fragment, over
// 512 contiguous bytes per warp). With p.dq_counters set
// (ordered) the adds into each query tile happen in ASCENDING key-tile
// order, so every element's sum is formed in the same order on every run
// (deterministic, no workspace quadratic in T); with p.dq_counters null
// (atomic) every partial is red.add-ed into the zeroed accumulator in
// whatever order the hardware gives (not deterministic; only for
// Options::deterministic == false). Ordered:
// - the key tiles that visit a query tile m (query head h) form an interval
//   [lo(m), hi(m)] of key-tile indices: query_blocks' bounds are
//   nondecreasing in the key tile; the interval is the same for every head
//   of a GQA group (the mask does not depend on h), and a counter is per
//   (b, h, m), so only the CTAs (n, hk = h / group, b) with n in
//   [lo(m), hi(m)] touch it, one step each;
// - key tile n is the first to add into m (n = lo(m)) iff key tile n-1 does
//   not visit m (one query_blocks call for n-1; none for key tile 0); the
//   first stores (no zeroing of the accumulator), each other key tile n
//   waits for counter(b, h, m) == n (key tile n-1 done) and adds;
// - key tile n sets counter = n + 1 (thread 0, a gpu-scope release fence
//   then a store, right after a barrier that every thread passes once its
//   adds are issued: signal_after_barrier) at the barrier after the next
//   step's dS^T or at the end; 0 means no key tile has reached m (the
//   postprocess then writes 0);
// - with the walk above, key tile n-1 reached (h, m) at the same step as
//   key tile n under a causal mask, and was dispatched no later, so a wait
//   lasts less than a step (until n-1's deferred signal); those lags add up
//   along a query tile's chain of key tiles (1-3% against atomic at d128
//   on the H200). Measured against the earlier descending order on a
//   reversed grid with a head-major walk (d128 causal T4k 230 vs 195
//   TFLOP/s, d256 188 vs 146);
// - no deadlock: the grid runs key tiles in ascending order (blockIdx /
//   (B Hkv) is the key tile), so a CTA only ever waits for a CTA of a lower
//   key tile, i.e. a lower blockIdx. With in-order CTA dispatch (as
//   FlashAttention-3 and CUTLASS stream-K assume) the dispatched CTAs are a
//   prefix of blockIdx, so the unfinished CTA of lowest blockIdx is resident
//   (or next to start) and everything it waits for is finished: it finishes
//   too. A CTA also signals its previous step before it can wait again, so a
//   chain of waits never holds a finished step back.
// Under a causal mask the first key tiles are visited by the most query
// tiles, so the ascending grid also starts the longest CTAs first.
//
// A varlen batch (fused/sequence.hpp): the CTA's sequence b gives its rows
// (q, do from q_row0; k, v, dk, dv from k_row0), its mask (tq, tk bound
// the loads as Tq, Tk do when dense) and its workspace block
// (fused::workspace_row: lse2, D, the dQ accumulator and counters). The
// grid covers the longest sequence's keys; a key tile stores dk, dv for the
// sequence's packed key rows (Sequence::k_rows), so rows past seqused_k
// (tk) get the zeros their accumulators hold (their P is masked to 0), and
// the tiles past k_rows do nothing. The ordered dQ's chain is the same per
// sequence: key tiles n-1, n of one sequence see the same mask. A template
// flag (kVarlen), launched only for varlen batches: with the mask in
// registers instead of the constant bank the dense instances' key loops
// grew and spilled (sm90a SASS), so they stay as they were.
//
// A padded head dim (p.head_dim < kD, a multiple of 8: fused::kernel_head_dim):
// K, V, Q, dO columns from head_dim on are zero-filled in shared memory, so
// S^T and dP^T are the tensors' and dK, dV (and the dQ partial) are 0
// there; dK, dV are not stored there. The fused dQ's accumulator has the
// kernel's kD columns (the postprocess copies only head_dim to dq): a warp
// skips its dQ passes that lie wholly past head_dim (products and adds).
// A template flag (kPadded), as in the forward kernel: the other instances
// compile as without it. The padded instances are the varlen ones (kVarlen)
// and take dense batches too, whose workspace rows they then address as a
// dense batch's.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda/flash/dq_accum_layout.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/flash/tile_io.cuh"
#include "cuda/flash/tile_sizes.hpp"
#include "cuda/fused/fragment.cuh"
#include "cuda/fused/mask.cuh"
#include "cuda/fused/sequence.hpp"
#include "cuda/fused/softcap.cuh"

namespace gqattn::flash {

constexpr unsigned kDqSpinNs = 64;  // back-off between polls of a dQ counter

__device__ __forceinline__ int ld_acquire_gpu(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
// Publishes *ptr = v after every write of the CTA that precedes a barrier
// this thread has passed: the barrier puts the other threads' dQ adds
// before this thread in causality order, and a release fence is cumulative
// over them (PTX memory model; CUTLASS's semaphores do the same), so one
// thread fences instead of every thread paying a sequentially consistent
// __threadfence.
__device__ __forceinline__ void signal_after_barrier(int* ptr, int v) {
  asm volatile(
      "fence.acq_rel.gpu;\n"
      "st.relaxed.gpu.global.s32 [%0], %1;\n" ::"l"(ptr),
      "r"(v)
      : "memory");
}
// ptr[0..3] += x, four adjacent floats (16-byte aligned), result unused.
// Below sm90 (no red.v4.f32) four scalar reductions, in the same lane-major
// order: docs/decisions/flash-dq-accum-lane-major-below-sm90.md.
__device__ __forceinline__ void red_add4(float* ptr, const float (&x)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "f"(x[0]), "f"(x[1]),
               "f"(x[2]), "f"(x[3])
               : "memory");
#else
  for (int v = 0; v < 4; ++v) atomicAdd(ptr + v, x[v]);
#endif
}

// One k-step (kk) of C += A B for one warp's kMT m16 tiles of rows: A's
// fragments given, B from a shared tile stored [n][k] (rows b_row0.., kNT
// n8 tiles).
template <typename Elem, typename BTile, int kMT, int kNT>
__device__ __forceinline__ void mma_kstep_nt(float (&c)[kMT][kNT][4], const uint32_t (&a)[kMT][4],
                                             uint32_t b_tile, int b_row0, int kk, int lane) {
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t bf[4];
    load_b<BTile>(bf, b_tile, b_row0 + np * 2 * fused::kMmaN, kk, lane);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      fused::mma_16816<Elem>(c[mt][2 * np], a[mt], bf[0], bf[1]);
      fused::mma_16816<Elem>(c[mt][2 * np + 1], a[mt], bf[2], bf[3]);
    }
  }
}

// C += A B over kSteps k-steps, A from a shared tile stored [m][k] (rows
// a_row0..).
template <typename Elem, typename ATile, typename BTile, int kSteps, int kMT, int kNT>
__device__ __forceinline__ void gemm_ss_nt(float (&c)[kMT][kNT][4], uint32_t a_tile, int a_row0,
                                           uint32_t b_tile, int b_row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
      load_a<ATile>(a[mt], a_tile, a_row0 + mt * fused::kMmaM, kk, lane);
    mma_kstep_nt<Elem, BTile>(c, a, b_tile, b_row0, kk, lane);
  }
}

// C += A B over kSteps k-steps, A's fragments already in registers (a[kk]:
// k-step kk of the kMT m16 tiles).
template <typename Elem, typename BTile, int kSteps, int kMT, int kNT>
__device__ __forceinline__ void gemm_rs_nt(float (&c)[kMT][kNT][4],
                                           const uint32_t (&a)[kSteps][kMT][4], uint32_t b_tile,
                                           int b_row0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) mma_kstep_nt<Elem, BTile>(c, a[kk], b_tile, b_row0, kk, lane);
}

// kSize: DkdvTile<kD, kSize>; the smaller tiles are for devices with less
// shared memory per block.
// kVarlen: a varlen batch (see above), or a padded head dim; the dense
// instances read the batch's mask from the parameters (constant bank), not
// from registers. kPadded: a head dim below kD (see above).
template <int kD, typename Elem, bool kSoftcap, bool kFusedDq = false,
          DkdvTileSize kSize = DkdvTileSize::kDefault, bool kVarlen = false, bool kPadded = false>
__global__ void __launch_bounds__(
    DkdvTile<kD, kSize>::kWarpsN* DkdvTile<kD, kSize>::kWarpsD* fused::kWarpSize)
    backward_dkdv_kernel(const fused::BackwardParams p) {
  using Tile = DkdvTile<kD, kSize>;
  constexpr int kBN = Tile::kBlockN;
  constexpr int kBM = Tile::kBlockM;
  constexpr int kWarpsD = Tile::kWarpsD;
  constexpr int kMT = Tile::kKeyTilesPerWarp;  // m16 tiles of keys per warp
  constexpr int kKeysPerWarp = kMT * fused::kMmaM;
  constexpr int kThreads = Tile::kWarpsN * kWarpsD * fused::kWarpSize;
  constexpr int kQueriesPerWarp = kBM / kWarpsD;
  constexpr int kColsPerWarp = kD / kWarpsD;
  constexpr int kNT = kQueriesPerWarp / fused::kMmaN;  // n8 tiles of S^T per warp
  constexpr int kDT = kColsPerWarp / fused::kMmaN;     // n8 tiles of dK, dV per warp
  constexpr int kStepsD = kD / fused::kMmaK;
  constexpr int kStepsM = kBM / fused::kMmaK;
  static_assert(kBN == Tile::kWarpsN * kKeysPerWarp, "the warps' key rows tile kBlockN");
  static_assert(kNT % 2 == 0 && kDT % 2 == 0, "tile shape");
  using KVTile = SmemTile<kBN, kD>;
  using QTile = SmemTile<kBM, kD>;
  using PTile = SmemTile<kBN, kBM>;
  // Fused dQ partial dS K: warp (wm, wd) owns kDqMT m16 tiles of queries
  // [kDqRows wm, kDqRows (wm + 1)) x columns [wd kDqCols, ...), in
  // kDqPasses passes of kDqDT n8 tiles.
  constexpr int kWarps = Tile::kWarpsN * kWarpsD;
  constexpr int kDqMT = Tile::kDqRowTilesPerWarp;
  constexpr int kDqRows = kDqMT * fused::kMmaM;
  constexpr int kDqWarpsM = kBM / kDqRows;
  constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  constexpr int kDqCols = kD / kDqWarpsD;
  constexpr int kDqColsPerPass = kDqCols < kDqPassCols ? kDqCols : kDqPassCols;
  constexpr int kDqPasses = kDqCols / kDqColsPerPass;
  constexpr int kDqDT = kDqColsPerPass / fused::kMmaN;
  constexpr int kStepsN = kBN / fused::kMmaK;
  constexpr int kStages = Tile::kQueryStages;
  static_assert(kStages == 2 || (kStages == 1 && kWarpsD > 1),
                "single-buffered Q / dO needs kWarpsD > 1: only that path issues the next "
                "step's loads after a barrier behind its dV / dK products");
  static_assert(!kFusedDq || (kWarps % kDqWarpsM == 0 && kD % kDqWarpsD == 0 &&
                              kDqCols % kDqColsPerPass == 0 && kDqDT % 2 == 0),
                "fused dQ warp grid");
  static_assert(!kPadded || kVarlen, "the padded instances are the varlen ones");

  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const smem_k = smem;
  unsigned char* const smem_v = smem_k + KVTile::kBytes;
  const uint32_t s_k = smem_addr(smem_k);
  const uint32_t s_v = smem_addr(smem_v);
  const uint32_t s_q0 = s_v + KVTile::kBytes;          // stage s: Q at s_q0 + s * kStageBytes
  constexpr uint32_t kStageBytes = 2 * QTile::kBytes;  // Q then dO
  // P^T (kWarpsD > 1), then dS^T (kWarpsD > 1 or fused dQ); with V in
  // registers (Tile::kVInRegisters) both in V's space, free once every warp
  // holds its V fragments.
  constexpr bool kVInRegisters = Tile::kVInRegisters;
  static_assert(
      !kVInRegisters || dkdv_p_tiles<kD, kFusedDq, kSize>() * PTile::kBytes <= KVTile::kBytes,
      "P^T and dS^T fit in V's space");
  const uint32_t s_p = kVInRegisters ? s_v : s_q0 + kStages * kStageBytes;
  const uint32_t s_ds = s_p + (kWarpsD > 1 ? PTile::kBytes : 0);
  constexpr uint32_t kPBytes =
      kVInRegisters ? 0 : dkdv_p_tiles<kD, kFusedDq, kSize>() * PTile::kBytes;
  float* const rows_f =
      reinterpret_cast<float*>(smem + 2 * KVTile::kBytes + kStages * kStageBytes + kPBytes);
  // rows_f: stage s: lse2 at rows_f[2 s kBM], D at rows_f[(2 s + 1) kBM]

  const int tid_ = threadIdx.x;
  const int warp = tid_ / fused::kWarpSize;
  int tid = tid_, lane = tid_ % fused::kWarpSize;  // refreshed by opaque() every step
  const int key_w = (warp % Tile::kWarpsN) * kKeysPerWarp;
  const int query_w = (warp / Tile::kWarpsN) * kQueriesPerWarp;
  const int col_w = (warp / Tile::kWarpsN) * kColsPerWarp;

  // Ordered dQ: counters set (else atomic dQ, or no dQ here at all).
  const bool ordered = kFusedDq && p.dq_counters != nullptr;

  // Block -> (key tile, kv head, batch), key tiles ascending (see above).
  const int num_bhk = p.B * p.Hkv;
  const int n_block = int(blockIdx.x) / num_bhk;
  const int b = (int(blockIdx.x) % num_bhk) / p.Hkv;
  const int hk = (int(blockIdx.x) % num_bhk) % p.Hkv;
  const int group = p.H / p.Hkv;

  // Dense (!kVarlen): no offsets, so the batch's mask and rows from 0.
  const fused::Sequence seq =
      fused::sequence_of(kVarlen ? p.seq : fused::SequenceArgs{}, p.mask, b);
  const fused::MaskPolicy mask(seq.mask);
  const int n0 = n_block * kBN;
  if (kVarlen && n0 >= seq.k_rows) return;  // past the sequence's keys (varlen only)
  const int cols = min(kBN, mask.tk - n0);  // <= 0: past seqused_k, dk = dv = 0
  const int store_rows = min(kBN, seq.k_rows - n0);
  const fused::BlockRange range =
      !kVarlen || cols > 0 ? mask.query_blocks(n0, cols, kBM) : fused::BlockRange{};
  const int num_m = range.last - range.first + 1;
  const int steps = num_m > 0 ? group * num_m : 0;
  // Fused dQ: the query tiles where this CTA adds (red.add) rather than
  // stores. Ordered: those key tile n-1 visits (none for key tile 0), where
  // it must also wait for n-1 (which publishes counter = n); atomic: all.
  fused::BlockRange adds{0, INT_MAX};
  if (ordered) adds = n_block > 0 ? mask.query_blocks(n0 - kBN, kBN, kBM) : fused::BlockRange{};
  int* signal = nullptr;  // counter of the last step's query tile
  const int dq_row = (warp % kDqWarpsM) * kDqRows;
  const int dq_col = (warp / kDqWarpsM) * kDqCols;
  // The tensors' columns: all kD but in the padded instances.
  const ColumnBound<kPadded> cols_d{kPadded ? p.head_dim : kD};

  const Elem* q_base =
      static_cast<const Elem*>(p.q) + b * p.q_stride.batch + int64_t(seq.q_row0) * p.q_stride.row;
  const Elem* do_base = static_cast<const Elem*>(p.dout) + b * p.do_stride.batch +
                        int64_t(seq.q_row0) * p.do_stride.row;
  // Workspace rows of (b, h): row_ws + h * head_ws (fused::workspace_row),
  // blocks of whole query tiles (kWorkspaceRowAlign is a multiple of kBM).
  // The padded instances ask the batch whether it is varlen.
  const bool varlen_ws = kVarlen && (!kPadded || p.seq.varlen());
  const int64_t row_ws =
      varlen_ws ? int64_t(seq.ws_row0) : int64_t(b) * p.H * p.tq_padded;  // workspace_row(p, b, 0)
  const int64_t head_ws = varlen_ws ? p.varlen_head_rows : p.tq_padded;
  // Ordered dQ: one counter per kBM workspace rows (row_ws, head_ws are
  // multiples of kBM).
  const int64_t counter_ws = row_ws / kBM;
  const int64_t counters_per_head = head_ws / kBM;
  static_assert(fused::kWorkspaceRowAlign % kBM == 0, "workspace blocks of whole query tiles");

  // A step's (query head hk * group + j, query tile m_block): the last
  // query tile first, every head of the group at each (see "Walk" above).
  // Stepped by increments, not t / group and t % group: a division by a
  // runtime value is dozens of instructions per step.
  struct Step {
    int j, m_block;
  };
  auto next_step = [group](Step s) {
    return s.j + 1 < group ? Step{s.j + 1, s.m_block} : Step{0, s.m_block - 1};
  };

  // Loads of step s.
  auto load_step = [&](Step s, int stage) {
    const int h = hk * group + s.j;
    const int m0 = s.m_block * kBM;
    const int rows = mask.tq - m0;
    const uint32_t s_q = s_q0 + stage * kStageBytes;
    load_tile_async<kBM, kD, kThreads>(s_q,
                                       q_base + h * p.q_stride.head + int64_t(m0) * p.q_stride.row,
                                       p.q_stride.row, rows, cols_d, tid);
    load_tile_async<kBM, kD, kThreads>(
        s_q + QTile::kBytes, do_base + h * p.do_stride.head + int64_t(m0) * p.do_stride.row,
        p.do_stride.row, rows, cols_d, tid);
    constexpr int kRowChunks = kBM * int(sizeof(float)) / fused::kChunkBytes;
    constexpr int kFloatsPerChunk = fused::kChunkBytes / int(sizeof(float));
    static_assert(2 * kRowChunks <= kThreads, "one chunk of lse2/D per thread");
    if (tid < 2 * kRowChunks) {
      const bool is_d = tid >= kRowChunks;
      const int c = tid % kRowChunks;
      const float* src =
          (is_d ? p.dsum : p.lse2) + row_ws + int64_t(h) * head_ws + m0 + c * kFloatsPerChunk;
      float* dst = rows_f + (2 * stage + (is_d ? 1 : 0)) * kBM + c * kFloatsPerChunk;
      cp_async_16(smem_addr(dst), src, true);
    }
  };

  if (steps > 0) {
    const Elem* k = static_cast<const Elem*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head +
                    (int64_t(seq.k_row0) + n0) * p.k_stride.row;
    const Elem* v = static_cast<const Elem*>(p.v) + b * p.v_stride.batch + hk * p.v_stride.head +
                    (int64_t(seq.k_row0) + n0) * p.v_stride.row;
    load_tile_async<kBN, kD, kThreads>(s_k, k, p.k_stride.row, cols, cols_d, tid);
    load_tile_async<kBN, kD, kThreads>(s_v, v, p.v_stride.row, cols, cols_d, tid);
    load_step(Step{0, range.last}, 0);
  }
  cp_async_commit();

  float acc_dk[kMT][kDT][4] = {};
  float acc_dv[kMT][kDT][4] = {};

  // V in registers: this warp's keys of V as the A operand of dP^T = V dO^T
  // for every step (V is the same for all of them), read once; the barrier
  // after it frees V's space for P^T and dS^T.
  uint32_t v_frag[kVInRegisters ? kStepsD : 1][kVInRegisters ? kMT : 1][4];
  if constexpr (kVInRegisters) {
    cp_async_wait<0>();
    __syncthreads();  // V landed (with step 0's loads)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk)
        load_a<KVTile>(v_frag[kk][mt], s_v, key_w + mt * fused::kMmaM, kk, lane);
    __syncthreads();  // every warp holds its V fragments
  }

  // Fused dQ: the partial dS K of step `s` (query tile s.m_block of head
  // hk * group + s.j; dS read transposed from the shared dS^T, which is
  // complete after the barrier that follows its stores and is not rewritten
  // before the next step's opening barrier), stored by the first key tile
  // and added by the others; ordered: after waiting for key tile n-1.
  // Returns the counter this CTA signals once the adds are issued (null when
  // atomic).
  auto add_dq_partial = [&](Step s) -> int* {
    const int h = hk * group + s.j;
    int* const counter =
        ordered ? p.dq_counters + counter_ws + int64_t(h) * counters_per_head + s.m_block : nullptr;
    const bool first = s.m_block < adds.first || s.m_block > adds.last;  // stores
    // Padded: the warp's columns below head_dim. A pass wholly past them
    // is skipped, products and adds (warp-uniform; if pass 0 is, every
    // pass is, and the warp neither waits nor adds): those accumulator
    // columns are never read (the postprocess stops at head_dim). A pass
    // that crosses head_dim adds the zeros past it, as the dense one does.
    const int dq_cols_left = cols_d.cols - dq_col;
    const int64_t warp_row0 = row_ws + int64_t(h) * head_ws + s.m_block * kBM + dq_row;
    // Fragment-major accumulator (dq_accum_layout.hpp): this lane's first
    // value in the 16 x 8 block at (warp_row0, dq_col).
    float* const acc_frag =
        p.dq_accum + dq_accum_block_offset(warp_row0, dq_col, kD) + dq_accum_in_block(lane, 0);
#pragma unroll
    for (int pass = 0; pass < kDqPasses; ++pass) {
      if (kPadded && pass * kDqColsPerPass >= dq_cols_left) break;
      float acc_dq[kDqMT][kDqDT][4] = {};
#pragma unroll
      for (int kk = 0; kk < kStepsN; ++kk) {
        uint32_t a[kDqMT][4];
#pragma unroll
        for (int mt = 0; mt < kDqMT; ++mt)
          load_a_trans<PTile>(a[mt], s_ds, dq_row + mt * fused::kMmaM, kk, lane);
#pragma unroll
        for (int dn = 0; dn < kDqDT / 2; ++dn) {
          uint32_t bf[4];
          load_b_trans<KVTile>(bf, s_k, dq_col + pass * kDqColsPerPass + dn * 2 * fused::kMmaN, kk,
                               lane);
#pragma unroll
          for (int mt = 0; mt < kDqMT; ++mt) {
            fused::mma_16816<Elem>(acc_dq[mt][2 * dn], a[mt], bf[0], bf[1]);
            fused::mma_16816<Elem>(acc_dq[mt][2 * dn + 1], a[mt], bf[2], bf[3]);
          }
        }
      }
      if (pass == 0 && !first && counter != nullptr) {  // wait for the previous adder
        if (lane == 0)
          while (ld_acquire_gpu(counter) != n_block) __nanosleep(kDqSpinNs);
        __syncwarp();
      }
      // The block of fragment (mt, dt) of this pass: one 16-byte store or
      // reduction per lane (docs/decisions/flash-dq-accum-fragment-major.md).
      auto fragment = [&](int mt, int dt) {
        return acc_frag + dq_accum_block_offset(mt * fused::kMmaM,
                                                pass * kDqColsPerPass + dt * fused::kMmaN, kD);
      };
#pragma unroll
      for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDqDT; ++dt) {
          if (first)
            *reinterpret_cast<float4*>(fragment(mt, dt)) = make_float4(
                acc_dq[mt][dt][0], acc_dq[mt][dt][1], acc_dq[mt][dt][2], acc_dq[mt][dt][3]);
          else
            red_add4(fragment(mt, dt), acc_dq[mt][dt]);
        }
    }
    return counter;
  };

  Step step{0, range.last};
  for (int t = 0; t < steps; ++t) {
    const Step next = next_step(step);
    const int stage = t % kStages;
    const int m0 = step.m_block * kBM;
    const uint32_t s_q = s_q0 + stage * kStageBytes;
    const uint32_t s_do = s_q + QTile::kBytes;
    const float* lse2 = rows_f + 2 * stage * kBM;
    const float* dsum = lse2 + kBM;

    tid = fused::opaque(tid_);
    lane = fused::opaque(tid_ % fused::kWarpSize);
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kStages == 2) {
      if (t + 1 < steps) load_step(next, (t + 1) % kStages);
      cp_async_commit();
    }

    // dP^T first: then the elementwise pass sees v before it is masked.
    float dp[kMT][kNT][4] = {};
    if constexpr (kVInRegisters)
      gemm_rs_nt<Elem, QTile, kStepsD>(dp, v_frag, s_do, query_w, lane);
    else
      gemm_ss_nt<Elem, KVTile, QTile, kStepsD>(dp, s_v, key_w, s_do, query_w, lane);
    float s[kMT][kNT][4] = {};
    gemm_ss_nt<Elem, KVTile, QTile, kStepsD>(s, s_k, key_w, s_q, query_w, lane);

    // s <- P^T, dp <- (dP^T - D) [* (1 - v^2)]; then dS^T = s * dp.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = query_w + nt * fused::kMmaN + fused::frag_col(lane) + (e & 1);
        const float lse2_col = lse2[col], dsum_col = dsum[col];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          float v = s[mt][nt][e];
          float dpd = dp[mt][nt][e] - dsum_col;
          if constexpr (kSoftcap) {
            v = fused::softcap_tanh(v * p.score.pre);
            dpd *= 1.0f - v * v;
          }
          s[mt][nt][e] = fused::fast_exp2(fmaf(v, p.score.mult, -lse2_col));
          dp[mt][nt][e] = dpd;
        }
      }
    if (!mask.fully_kept(m0, kBM, n0, kBN))
      mask.apply</*kRowsAreKeys=*/true>(s, n0 + key_w, m0 + query_w, lane, 0.0f);

    if constexpr (kWarpsD == 1) {
      static_assert(kMT == 1, "P^T, dS^T from registers: one m16 tile of keys per warp");
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk) {
        uint32_t a_p[4], a_ds[4];
        fused::acc_to_a<Elem>(a_p, s[0][2 * kk], s[0][2 * kk + 1]);
        const float(&s0)[4] = s[0][2 * kk];
        const float(&s1)[4] = s[0][2 * kk + 1];
        const float(&d0)[4] = dp[0][2 * kk];
        const float(&d1)[4] = dp[0][2 * kk + 1];
        a_ds[0] = fused::pack2<Elem>(s0[0] * d0[0], s0[1] * d0[1]);
        a_ds[1] = fused::pack2<Elem>(s0[2] * d0[2], s0[3] * d0[3]);
        a_ds[2] = fused::pack2<Elem>(s1[0] * d1[0], s1[1] * d1[1]);
        a_ds[3] = fused::pack2<Elem>(s1[2] * d1[2], s1[3] * d1[3]);
        if constexpr (kFusedDq) {  // dS^T (keys x queries) for the dQ partial
          unsigned char* const ds = smem + (s_ds - s_k);
          const int key = key_w + fused::frag_row(lane);
          const int query = query_w + kk * fused::kMmaK + fused::frag_col(lane);
          *reinterpret_cast<uint32_t*>(ds + PTile::elem_offset(key, query)) = a_ds[0];
          *reinterpret_cast<uint32_t*>(ds + PTile::elem_offset(key + fused::kFragRowHalf, query)) =
              a_ds[1];
          *reinterpret_cast<uint32_t*>(ds + PTile::elem_offset(key, query + fused::kMmaN)) =
              a_ds[2];
          *reinterpret_cast<uint32_t*>(
              ds + PTile::elem_offset(key + fused::kFragRowHalf, query + fused::kMmaN)) = a_ds[3];
        }
#pragma unroll
        for (int dn = 0; dn < kDT / 2; ++dn) {
          uint32_t bf[4];
          load_b_trans<QTile>(bf, s_do, col_w + dn * 2 * fused::kMmaN, kk, lane);
          fused::mma_16816<Elem>(acc_dv[0][2 * dn], a_p, bf[0], bf[1]);
          fused::mma_16816<Elem>(acc_dv[0][2 * dn + 1], a_p, bf[2], bf[3]);
          load_b_trans<QTile>(bf, s_q, col_w + dn * 2 * fused::kMmaN, kk, lane);
          fused::mma_16816<Elem>(acc_dk[0][2 * dn], a_ds, bf[0], bf[1]);
          fused::mma_16816<Elem>(acc_dk[0][2 * dn + 1], a_ds, bf[2], bf[3]);
        }
      }
      if constexpr (kFusedDq) {
        __syncthreads();  // dS^T complete; the dQ adds of step t-1 issued
        if (tid_ == 0 && signal != nullptr) signal_after_barrier(signal, n_block + 1);
        signal = add_dq_partial(step);
      }
    } else {
      // P^T and dS^T of this warp's keys x queries to shared memory; every
      // warp then reads all kBM queries of its keys.
      // query_w is a multiple of 8 kNT (kNT a power of two), so every
      // fragment's offset is one XOR and an add from the warp's first.
      static_assert((kNT & (kNT - 1)) == 0, "c_fragment_offset_at: nt below a power of two");
      const uint32_t frag0 = c_fragment_offset<PTile>(key_w, query_w, lane);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[e] = s[mt][nt][e] * dp[mt][nt][e];
          const uint32_t frag = c_fragment_offset_at<PTile>(frag0, mt * fused::kMmaM, nt);
          store_acc_frag_at<PTile, Elem>(smem + (s_p - s_k), frag, s[mt][nt]);
          store_acc_frag_at<PTile, Elem>(smem + (s_ds - s_k), frag, ds);
        }
      __syncthreads();  // P^T, dS^T complete; the dQ adds of step t-1 issued
      if constexpr (kFusedDq)
        if (tid_ == 0 && signal != nullptr) signal_after_barrier(signal, n_block + 1);
#pragma unroll
      for (int kk = 0; kk < kStepsM; ++kk) {
        uint32_t a_p[kMT][4], a_ds[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          load_a<PTile>(a_p[mt], s_p, key_w + mt * fused::kMmaM, kk, lane);
          load_a<PTile>(a_ds[mt], s_ds, key_w + mt * fused::kMmaM, kk, lane);
        }
#pragma unroll
        for (int dn = 0; dn < kDT / 2; ++dn) {
          uint32_t bf[4];
          load_b_trans<QTile>(bf, s_do, col_w + dn * 2 * fused::kMmaN, kk, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            fused::mma_16816<Elem>(acc_dv[mt][2 * dn], a_p[mt], bf[0], bf[1]);
            fused::mma_16816<Elem>(acc_dv[mt][2 * dn + 1], a_p[mt], bf[2], bf[3]);
          }
          load_b_trans<QTile>(bf, s_q, col_w + dn * 2 * fused::kMmaN, kk, lane);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            fused::mma_16816<Elem>(acc_dk[mt][2 * dn], a_ds[mt], bf[0], bf[1]);
            fused::mma_16816<Elem>(acc_dk[mt][2 * dn + 1], a_ds[mt], bf[2], bf[3]);
          }
        }
      }
      if constexpr (kStages == 1) {
        __syncthreads();  // every warp is done with this step's Q, dO, lse2, D
        if (t + 1 < steps) load_step(next, 0);
        cp_async_commit();
      }
      if constexpr (kFusedDq) signal = add_dq_partial(step);
    }

    step = next;
  }

  // Epilogue: dK (times the scale) and dV through the K and V tiles' space.
  tid = tid_;
  lane = tid_ % fused::kWarpSize;
  cp_async_wait<0>();
  __syncthreads();  // the last step's dQ adds issued
  if constexpr (kFusedDq)
    if (tid_ == 0 && signal != nullptr) signal_after_barrier(signal, n_block + 1);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      const int key = key_w + mt * fused::kMmaM, col = col_w + dt * fused::kMmaN;
      store_acc_frag<KVTile, Elem>(smem_k, acc_dk[mt][dt], key, col, p.score.scale, lane);
      store_acc_frag<KVTile, Elem>(smem_v, acc_dv[mt][dt], key, col, 1.0f, lane);
    }
  __syncthreads();
  Elem* dk = static_cast<Elem*>(p.dk) + b * p.dk_stride.batch + hk * p.dk_stride.head +
             (int64_t(seq.k_row0) + n0) * p.dk_stride.row;
  Elem* dv = static_cast<Elem*>(p.dv) + b * p.dv_stride.batch + hk * p.dv_stride.head +
             (int64_t(seq.k_row0) + n0) * p.dv_stride.row;
  store_tile<kBN, kD, kThreads>(smem_k, dk, p.dk_stride.row, store_rows, cols_d, tid);
  store_tile<kBN, kD, kThreads>(smem_v, dv, p.dv_stride.row, store_rows, cols_d, tid);
}

}  // namespace gqattn::flash
