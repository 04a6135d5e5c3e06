// cpu-flash's forward: one task per (batch, kv head, query block) holds the
// query rows of the group's rep heads in one tile, so each K and V block is
// converted once for the whole group; key blocks outside the causal/window
// band are never visited. Online softmax per row (running max m, sum l,
// O rescaled by exp(m_old - m_new)), o = O / l and lse = m + log(l) at the
// end; rows without kept keys get o = 0, lse = -inf. A task writes only its
// own rows, in an order fixed by the tile sizes, so the bits do not depend on
// the thread count. bf16 problems on a CPU with AVX512-BF16 run the tile
// products on bf16 operands (Bf16Tiles: S = Q K^T exact products, P rounded
// to bf16 for P V, f32 accumulation); everything else converts to f32
// (F32Avx512Tiles on an AVX-512 CPU, else the portable F32Tiles). Checked by
// tests/cpu/test_cpu_flash.cpp and tests/cpu/test_cpu_flash_avx512.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/parallel.hpp"
#include "cpu_flash/avx512_kernels.hpp"
#include "cpu_flash/cpu_flash.hpp"
#include "cpu_flash/tile_io.hpp"
#include "cpu_flash/tile_kernels.hpp"

namespace gqattn::cpu_flash {
namespace {

// The tile products of the f32 path: Q, K and V converted to f32 (any
// dtype), the portable loops of tile_kernels.hpp (any CPU).
struct F32Tiles {
  std::vector<float> Q, K, Kt, V;
  F32Tiles(const Plan& p, int64_t R)
      : Q(cpu::scratch_floats(R * p.dp)),
        K(cpu::scratch_floats(kBlockK * p.dp)),
        Kt(cpu::scratch_floats(p.dp * kBlockK)),
        V(cpu::scratch_floats(kBlockK * p.dp)) {}
  void load_queries(const TensorRef& q, const Shape& s, const Plan& p, int64_t b, int64_t h,
                    int64_t q0, int64_t nq, int64_t row) {
    load_tile(q, b, h, q0, p.block_q, nq, s.d, Q.data() + row * p.dp, p.dp);
  }
  void load_keys(const detail::ForwardArgs& a, const Shape& s, const Plan& p, int64_t b,
                 int64_t hkv, int64_t j0, int64_t nk) {
    load_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, K.data(), p.dp);
    load_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose(kBlockK, p.dp, K.data(), p.dp, Kt.data(), kBlockK);
  }
  // S = Q K^T over R rows.
  void scores(const Shape& s, const Plan& p, int64_t R, float* S) {
    gemm_nn(R, kBlockK, s.d, Q.data(), p.dp, Kt.data(), kBlockK, S, kBlockK, false);
  }
  // The online-softmax step on the R x Bk scores S of query rows q0.. and
  // keys j0 .. j0 + nk - 1: m, l and O updated, then O += P V.
  void step(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk, int64_t R, float* S,
            float* m, float* l, float* O) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < R; ++r) {
      float* row = S + r * kBlockK;
      const Range cols = kept_columns(s, q0 + r % p.block_q, j0, nk);
      if (cols.empty()) {
        std::fill(row, row + kBlockK, 0.0f);
        continue;
      }
      transform_row(s, row, kBlockK, cols.first, cols.last, nullptr);
      float mx = neg_inf;
      for (int64_t c = cols.first; c <= cols.last; ++c) mx = std::max(mx, row[c]);
      const float m_new = std::max(m[r], mx);
      const float alpha = std::exp(m[r] - m_new);  // 0 while m was -inf
      exp_sub(kBlockK, row, m_new, row);
      float sum = 0.0f;
      for (int64_t c = 0; c < kBlockK; ++c) sum += row[c];
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* o = O + r * p.dp;
        for (int64_t x = 0; x < p.dp; ++x) o[x] *= alpha;
      }
    }
    gemm_nn(R, p.dp, kBlockK, S, kBlockK, V.data(), p.dp, O, p.dp, true);
  }
  void store(const TensorRef& t, int64_t b, int64_t h, int64_t row0, int64_t valid, int64_t d,
             float* tile, int64_t ld) {
    store_tile(t, b, h, row0, valid, d, tile, ld);
  }
};

// The f32 path on an AVX-512 CPU (avx512_enabled()): the products and the
// softmax step by the intrinsics of avx512_kernels.hpp (the auto-vectorized
// gemm_nn spilled its accumulators: docs/decisions/cpu-flash-gemm.md); K
// and V read where they lie when they need no conversion (f32_tile).
struct F32Avx512Tiles : F32Tiles {
  KeptColumns kept;
  TileView v;  // where the loaded V is read
  F32Avx512Tiles(const Plan& p, int64_t R) : F32Tiles(p, R), kept(R) {}
  void load_keys(const detail::ForwardArgs& a, const Shape& s, const Plan& p, int64_t b,
                 int64_t hkv, int64_t j0, int64_t nk) {
    const TileView k = f32_tile(a.k, b, hkv, j0, kBlockK, nk, s.d, p.dp, K.data());
    transpose_f32(kBlockK, p.dp, k.data, k.ld, Kt.data(), kBlockK);
    v = f32_tile(a.v, b, hkv, j0, kBlockK, nk, s.d, p.dp, V.data());
  }
  void scores(const Shape& s, const Plan& p, int64_t R, float* S) {
    gemm_f32(R, kBlockK, s.d, Q.data(), p.dp, 1, Kt.data(), kBlockK, S, kBlockK, false);
  }
  void step(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk, int64_t R, float* S,
            float* m, float* l, float* O) {
    softmax_step_f32(R, S, kept.of(s, q0, R, p.block_q, j0, nk), m, l, O, p.dp, p.dp);
    gemm_f32(R, p.dp, kBlockK, S, kBlockK, 1, v.data, v.ld, O, p.dp, true);
  }
};

// The tile products on bf16 operands (bf16 I/O, bf16_dot_enabled()): Q and
// K as they are (their products exact), V pair-major, P rounded to bf16
// before P V, as the fused CUDA kernels feed it to the tensor cores.
struct Bf16Tiles {
  std::vector<uint16_t> Q, K, V, P;
  std::vector<uint32_t> Kt, Vp;
  KeptColumns kept;
  Bf16Tiles(const Plan& p, int64_t R)
      : Q(std::size_t(R * p.dp)),
        K(std::size_t(kBlockK * p.dp)),
        V(std::size_t(kBlockK * p.dp)),
        P(std::size_t(R * kBlockK)),
        Kt(std::size_t(p.dp / 2 * kBlockK)),
        Vp(std::size_t(kBlockK / 2 * p.dp)),
        kept(R) {}
  void load_queries(const TensorRef& q, const Shape& s, const Plan& p, int64_t b, int64_t h,
                    int64_t q0, int64_t nq, int64_t row) {
    load_tile_bf16(q, b, h, q0, p.block_q, nq, s.d, Q.data() + row * p.dp, p.dp);
  }
  void load_keys(const detail::ForwardArgs& a, const Shape& s, const Plan& p, int64_t b,
                 int64_t hkv, int64_t j0, int64_t nk) {
    load_tile_bf16(a.k, b, hkv, j0, kBlockK, nk, s.d, K.data(), p.dp);
    load_tile_bf16(a.v, b, hkv, j0, kBlockK, nk, s.d, V.data(), p.dp);
    transpose_pairs(kBlockK, p.dp, K.data(), p.dp, Kt.data(), kBlockK);
    pair_rows(kBlockK, p.dp, V.data(), p.dp, Vp.data(), p.dp);
  }
  void scores(const Shape& s, const Plan& p, int64_t R, float* S) {
    gemm_bf16(R, kBlockK, round_up(s.d, 2), Q.data(), p.dp, Kt.data(), kBlockK, S, kBlockK, false);
  }
  void step(const Shape& s, const Plan& p, int64_t q0, int64_t j0, int64_t nk, int64_t R, float* S,
            float* m, float* l, float* O) {
    softmax_step_bf16(R, S, kept.of(s, q0, R, p.block_q, j0, nk), m, l, O, p.dp, p.dp, P.data());
    gemm_bf16(R, p.dp, kBlockK, P.data(), kBlockK, Vp.data(), p.dp, O, p.dp, true);
  }
  void store(const TensorRef& t, int64_t b, int64_t h, int64_t row0, int64_t valid, int64_t d,
             float* tile, int64_t ld) {
    for (int64_t r = 0; r < valid; ++r)
      round_to_bf16(1, d, tile + r * ld, ld,
                    static_cast<uint16_t*>(t.data) + cpu::element_offset(t, b, row0 + r, h), d);
  }
};

template <class Tiles>
struct Scratch {
  Tiles tiles;
  std::vector<float> O, S, m, l;
  Scratch(const Plan& p, int64_t R)
      : tiles(p, R),
        O(cpu::scratch_floats(R * p.dp)),
        S(cpu::scratch_floats(R * kBlockK)),
        m(cpu::scratch_floats(R)),
        l(cpu::scratch_floats(R)) {}
};

template <class Tiles>
void run(const detail::ForwardArgs& args) {
  const Shape s = detail::resolve(args.problem);
  const Plan plan = make_plan(s);
  const int64_t d = s.d, dp = plan.dp, bq = plan.block_q, R = s.rep * bq;
  const int64_t tasks = s.B * s.Hkv * plan.q_blocks;
  const int threads = args.options.num_threads;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // Every buffer before any output is written (std::bad_alloc leaves them
  // untouched).
  std::vector<Scratch<Tiles>> scratch;
  const int64_t workers = cpu::worker_count(tasks, threads);
  scratch.reserve(static_cast<std::size_t>(workers));
  for (int64_t i = 0; i < workers; ++i) scratch.emplace_back(plan, R);

  cpu::parallel_for(tasks, threads, [&](int64_t task, int64_t worker) {
    Scratch<Tiles>& w = scratch[static_cast<std::size_t>(worker)];
    // Latest query blocks first: under a causal mask they are the longest.
    const int64_t qb = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t hkv = (task / plan.q_blocks) % s.Hkv;
    const int64_t b = task / (plan.q_blocks * s.Hkv);
    const int64_t q0 = qb * bq, nq = std::min(bq, s.Tq - q0);

    for (int64_t g = 0; g < s.rep; ++g)
      w.tiles.load_queries(args.q, s, plan, b, hkv * s.rep + g, q0, nq, g * bq);
    std::fill(w.O.begin(), w.O.end(), 0.0f);
    std::fill(w.m.begin(), w.m.end(), neg_inf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);

    const Range blocks = key_blocks(s, q0, q0 + nq - 1);
    for (int64_t kb = blocks.first; kb <= blocks.last; ++kb) {
      const int64_t j0 = kb * kBlockK, nk = std::min(kBlockK, s.Tk - j0);
      w.tiles.load_keys(args, s, plan, b, hkv, j0, nk);
      w.tiles.scores(s, plan, R, w.S.data());
      w.tiles.step(s, plan, q0, j0, nk, R, w.S.data(), w.m.data(), w.l.data(), w.O.data());
    }

    for (int64_t r = 0; r < R; ++r) {
      float* o = w.O.data() + r * dp;
      const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;
      for (int64_t x = 0; x < dp; ++x) o[x] *= inv;
    }
    for (int64_t g = 0; g < s.rep; ++g) {
      const int64_t h = hkv * s.rep + g;
      w.tiles.store(args.o, b, h, q0, nq, d, w.O.data() + g * bq * dp, dp);
      if (args.lse.data == nullptr) continue;
      for (int64_t ii = 0; ii < nq; ++ii) {
        const int64_t r = g * bq + ii;
        const float lse = w.l[r] > 0.0f ? w.m[r] + std::log(w.l[r]) : neg_inf;
        cpu::store_floats(args.lse, cpu::element_offset(args.lse, b, h, q0 + ii), 1, &lse);
      }
    }
  });
}

}  // namespace

void forward(const detail::ForwardArgs& args) {
  if (args.q.dtype == DType::bf16 && bf16_dot_enabled())
    run<Bf16Tiles>(args);
  else if (avx512_enabled())
    run<F32Avx512Tiles>(args);
  else
    run<F32Tiles>(args);
}

}  // namespace gqattn::cpu_flash
