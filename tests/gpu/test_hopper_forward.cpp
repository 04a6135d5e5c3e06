// cuda-hopper (sm_90a forward: wgmma, TMA, warp specialisation) against the
// f64 oracle through gqattn::check (tolerances of docs/semantics.md,
// NaN-poisoned outputs, determinism by rerunning and comparing bits), forward
// only: the shapes that break kernels — T = 1, T not a multiple of the tiles,
// Tq != Tk both ways, d 64/128/256, Hkv = 1, Hkv = H, windows 1, 64 and >= T,
// softcap with large logits (each softcap score mode of score_mode.hpp),
// softcap logits straddling the polynomial tanh's range, rows with no kept
// key, bf16 and f16, padded strides, and sequences long enough to wrap the
// TMA ring several times.
// Non-causal d128 without a window runs on the wide 128 x 176 key tile
// (the wide d128 tile): its cases have Tk not a multiple of
// 176 (partially masked last key tile), Tk < 176, Tk a multiple of 176.
// d64 without softcap or window and with Tk >= 1024 runs on the tall
// 192 x 128 tile with three consumer warpgroups: cases with Tq
// a multiple of 192 and not, Tq < 192, Tq > Tk (rows without keys), f16,
// padded, and more work tiles than SMs, one and several query tiles per
// head. Causal query tiles end at Tq's last row:
// cases whose first tile starts 64 or 128 rows before row 0, with Tk
// above and below Tq.
// Packed GQA (pack_gqa.hpp: Tq short of a tile, the rows of a tile the
// query heads of one kv head): cases listed at the end of cases(), and the
// plain O stores of packed rows in UnalignedOutputStrideGivesTheSameBits.
// With K/V multicast, d128 without
// softcap and with an even number of query heads per kv head runs in 2-CTA
// clusters that multicast K/V: among them one-query-tile, many-tile (more work tiles than resident
// clusters), windowed, wide and padded cases; the MHA cases (H = Hkv) and
// softcap take the plain-CTA kernel of the same tile.
// Split-KV (split_kv.hpp): every case runs three ways, with the rule's
// splits (the cases with few work tiles and 8 key tiles or more split),
// unsplit (splits=1) and in three splits (splits=3, empty ranges
// included), both forced through the plan override, each against the
// oracle and for determinism.
// Also: a stride TMA cannot use is refused naming the tensor (the
// backward, d 64/128/256, is tests/gpu/test_hopper_backward.cpp); an o
// stride that neither TMA nor 16-byte stores can write takes the
// epilogue's plain stores and gives the same bits; an odd o stride is
// refused. Every
// case skips, saying why, where cuda-hopper cannot run (no device, not
// sm_90, no sm_90a code in the build).
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "api/plan_override.hpp"
#include "gpu_test_util.hpp"
#include "gqattn/attention.hpp"
#include "gqattn/check.hpp"
#include "gqattn/dtype.hpp"
#include "oracle_cases.hpp"

namespace {

using gqattn::Backend;
using gqattn::Device;
using gqattn::DType;
using gqattn::Problem;

constexpr uint64_t kSeed = 20261202;

using HopperCase = gqattn::testing::OracleCase;
using gqattn::testing::case_name;
using gqattn::testing::describe;
using gqattn::testing::large_logits;
using gqattn::testing::make;
using gqattn::testing::straddling_poly_range;

std::vector<HopperCase> cases() {
  const DType f16 = DType::f16;
  const DType bf16 = DType::bf16;
  return {
      // d = 128, bf16 first: the configuration brought up first.
      make("T1_d128", 1, 1, 1, 2, 1, 128, false),
      make("T1_causal_d128", 2, 1, 1, 2, 2, 128, true),
      make("T128_d128", 1, 128, 128, 1, 1, 128, false),
      make("T200_d128_mha", 1, 200, 200, 4, 4, 128, false),
      make("T257_causal_d128_gqa4", 1, 257, 257, 8, 2, 128, true),
      make("T1000_causal_d128_gqa2", 1, 1000, 1000, 4, 2, 128, true),
      make("T1100_d128_mqa", 2, 1100, 1100, 2, 1, 128, false),
      make("Tq37_Tk200_causal_d128", 1, 37, 200, 2, 1, 128, true),
      make("Tq200_Tk37_causal_d128_empty_rows", 1, 200, 37, 2, 2, 128, true),
      make("Tq90_Tk300_d128", 2, 90, 300, 2, 2, 128, false),
      make("Tq300_Tk90_d128", 1, 300, 90, 2, 1, 128, false),
      make("T100_causal_window1_d128", 1, 100, 100, 2, 1, 128, true, 1),
      make("T200_causal_window_ge_T_d128", 1, 200, 200, 2, 2, 128, true, 500),
      make("T300_window64_d128", 1, 300, 300, 2, 1, 128, false, 64),
      make("T700_causal_window64_d128", 1, 700, 700, 2, 1, 128, true, 64),
      make("Tq180_Tk70_causal_window40_d128", 1, 180, 70, 2, 1, 128, true, 40),
      large_logits(make("T160_causal_softcap30_d128", 1, 160, 160, 4, 2, 128, true, 0, 30.0f)),
      make("T100_causal_d128_padded", 2, 100, 100, 4, 2, 128, true, 0, 0.0f, bf16, true),
      make("T200_window64_d128_f16", 1, 200, 200, 2, 1, 128, true, 64, 0.0f, f16),
      large_logits(
          make("T120_causal_softcap30_d128_f16", 1, 120, 120, 2, 1, 128, true, 0, 30.0f, f16)),
      make("B5_H6_T65_causal_d128", 5, 65, 65, 6, 3, 128, true),
      // Softcap score modes (flash/score_mode.hpp): bf16 with cap log2 e <=
      // 76 has no row maximum (the cap 20, 30 and 50 bf16 cases, P up to
      // 2^72 with large logits; cap 52 next to the bound); bf16 with a larger
      // cap (60 here) and f16 keep it.
      large_logits(make("T260_causal_softcap52_d128", 1, 260, 260, 4, 2, 128, true, 0, 52.0f)),
      large_logits(
          make("T300_causal_softcap60_d128_row_max", 1, 300, 300, 4, 2, 128, true, 0, 60.0f)),
      make("T300_causal_softcap30_d128_small_logits", 1, 300, 300, 4, 1, 128, true, 0, 30.0f),
      // The polynomial tanh (docs/decisions/hopper-forward-softcap-poly.md), no-maximum mode:
      // the small-logit cases take it on every tile, the large_logits ones
      // never; these mix both paths among the warp tiles of one problem.
      straddling_poly_range(
          make("T700_causal_softcap30_d128_poly_mixed", 1, 700, 700, 4, 2, 128, true, 0, 30.0f)),
      straddling_poly_range(
          make("B2_T500_softcap30_d128_wide_poly_mixed", 2, 500, 500, 4, 1, 128, false, 0, 30.0f)),
      straddling_poly_range(
          make("T400_causal_softcap30_d64_poly_mixed", 1, 400, 400, 4, 2, 64, true, 0, 30.0f)),
      // The running-maximum softcap mode's tanh (f16; bf16 with cap 60).
      straddling_poly_range(make("T500_causal_softcap30_d128_f16_poly_mixed", 1, 500, 500, 4, 2,
                                 128, true, 0, 30.0f, f16)),
      straddling_poly_range(
          make("T300_softcap60_d128_row_max_poly_mixed", 1, 300, 300, 2, 1, 128, false, 0, 60.0f)),
      straddling_poly_range(make("T300_causal_softcap30_d64_f16_poly_mixed", 1, 300, 300, 2, 1, 64,
                                 true, 0, 30.0f, f16)),
      make("T300_causal_softcap30_d128_f16_small_logits", 1, 300, 300, 4, 2, 128, true, 0, 30.0f,
           f16),
      straddling_poly_range(
          make("T300_causal_softcap30_d256_poly_mixed", 1, 300, 300, 2, 1, 256, true, 0, 30.0f)),
      large_logits(make("Tq200_Tk37_causal_softcap20_d128_empty_rows", 1, 200, 37, 2, 1, 128, true,
                        0, 20.0f)),
      // d = 128, neither causal nor window: the wide 128 x 176 key tile
      // (so are T1_d128, T128_d128, T200_d128_mha, T1100_d128_mqa and the
      // non-causal Tq != Tk cases above). Key tiles of 176: Tk 200 = 176 +
      // 24, 37 < 176, 353 = 2 x 176 + 1, 1000 = 5 x 176 + 120, 352 = 2 x 176.
      make("Tq37_Tk200_d128_wide", 1, 37, 200, 2, 1, 128, false),
      make("Tq200_Tk37_d128_wide_gqa4", 1, 200, 37, 8, 2, 128, false),
      make("T353_d128_wide_gqa2", 1, 353, 353, 4, 2, 128, false),
      make("Tq130_Tk1000_d128_wide_mqa", 2, 130, 1000, 4, 1, 128, false),
      make("T352_d128_wide_gqa2", 1, 352, 352, 4, 2, 128, false),
      make("T1000_d128_wide_f16", 1, 1000, 1000, 2, 1, 128, false, 0, 0.0f, f16),
      make("Tq100_Tk353_d128_wide_padded", 2, 100, 353, 4, 2, 128, false, 0, 0.0f, bf16, true),
      make("Tq200_Tk1000_d128_wide_f16_padded", 1, 200, 1000, 2, 2, 128, false, 0, 0.0f, f16, true),
      large_logits(make("T353_softcap30_d128_wide_gqa2", 1, 353, 353, 4, 2, 128, false, 0, 30.0f)),
      large_logits(make("Tq300_Tk200_softcap30_d128_wide_f16", 1, 300, 200, 2, 1, 128, false, 0,
                        30.0f, f16)),
      // A window >= Tk is no window (mask_args): the wide tile too.
      make("T300_window_ge_T_d128_wide", 1, 300, 300, 2, 1, 128, false, 300),
      // d = 64.
      make("T1_d64", 1, 1, 1, 2, 1, 64, false),
      make("T37_causal_d64_gqa2", 1, 37, 37, 4, 2, 64, true),
      make("Tq200_Tk37_causal_d64_empty_rows", 1, 200, 37, 2, 2, 64, true),
      make("Tq70_Tk180_causal_window40_d64", 1, 70, 180, 4, 2, 64, true, 40),
      make("T150_d64_mqa8", 1, 150, 150, 8, 1, 64, false),
      large_logits(make("T96_softcap30_d64", 2, 96, 96, 2, 1, 64, false, 0, 30.0f)),
      large_logits(
          make("T130_causal_softcap30_d64_f16", 1, 130, 130, 2, 1, 64, true, 0, 30.0f, f16)),
      make("T129_causal_d64_f16", 1, 129, 129, 4, 2, 64, true, 0, 0.0f, f16),
      make("Tq60_Tk90_d64_f16_padded", 1, 60, 90, 2, 1, 64, false, 0, 0.0f, f16, true),
      make("T900_causal_d64", 1, 900, 900, 2, 1, 64, true),
      // d = 64 with Tk >= kTallD64MinKeys (1024), no softcap, no window: the
      // tall 192 x 128 tile. Query tiles of 192: 70 < 192, 300 = 192 + 108,
      // 384 = 2 x 192, 4200 = 21 x 192 + 168; key tiles of 128: 4500 and
      // 4097 partial.
      make("Tq70_Tk4500_causal_d64_tall_gqa2", 1, 70, 4500, 4, 2, 64, true),
      make("Tq300_Tk4096_d64_tall_f16", 1, 300, 4096, 2, 1, 64, false, 0, 0.0f, f16),
      make("Tq384_Tk4224_causal_d64_tall_padded", 2, 384, 4224, 4, 2, 64, true, 0, 0.0f, bf16,
           true),
      make("Tq4200_Tk4097_causal_d64_tall_empty_rows", 1, 4200, 4097, 1, 1, 64, true),
      // Causal query tiles end at Tq's last row (end-aligned causal
      // tiles): the first tile starts 64 or 128 rows before
      // row 0, whose warpgroups keep no key and store nothing, also where
      // Tk > Tq would give such rows keys (i + Tk - Tq >= 0). Tq 4096 = 22 x
      // 192 - 128, 4100 = 22 x 192 - 124 (64 rows before 0); d128's tiles
      // of 128: 1030 = 9 x 128 - 122 (64), windowed and not (the
      // multicast kernel: GQA 2). Other shifted cases above: T257, Tq37_Tk200,
      // T700 window 64, T130 d256, Tq70_Tk4500 and the many-tile Tq3_Tk4096.
      // Tk 1030 and 1500: the tall tile from kTallD64MinKeys (1024) on.
      make("T4096_causal_d64_tall_shift128", 1, 4096, 4096, 4, 2, 64, true),
      make("T1030_causal_d64_tall_shift64_gqa2", 2, 1030, 1030, 4, 2, 64, true),
      make("Tq500_Tk1500_d64_tall", 1, 500, 1500, 2, 1, 64, false),
      make("Tq4100_Tk4300_causal_d64_tall_shift64", 1, 4100, 4300, 2, 1, 64, true),
      make("Tq4100_Tk4000_causal_d64_tall_shift64_empty_rows", 1, 4100, 4000, 2, 1, 64, true, 0,
           0.0f, f16),
      make("Tq1030_Tk1100_causal_d128_shift64_gqa2", 1, 1030, 1100, 4, 2, 128, true),
      make("T1030_causal_window200_d128_shift64", 2, 1030, 1030, 2, 1, 128, true, 200),
      // d = 256.
      make("T130_causal_d256_mqa", 1, 130, 130, 4, 1, 256, true),
      make("Tq150_Tk20_causal_d256_empty_rows", 1, 150, 20, 2, 1, 256, true),
      make("T190_causal_window64_d256", 1, 190, 190, 2, 2, 256, true, 64),
      large_logits(
          make("Tq100_Tk140_causal_w32_softcap50_d256", 1, 100, 140, 2, 1, 256, true, 32, 50.0f)),
      make("T70_d256_f16", 1, 70, 70, 2, 2, 256, false, 0, 0.0f, f16),
      large_logits(make("T190_causal_softcap20_d256_gqa2", 1, 190, 190, 4, 2, 256, true, 0, 20.0f)),
      make("T80_causal_w16_d256_padded", 1, 80, 80, 2, 1, 256, true, 16, 0.0f, bf16, true),
      make("T600_d256", 1, 600, 600, 2, 1, 256, false),
      // More work tiles than an H200 has SMs (132): with the persistent
      // scheduler each CTA runs several tiles, so Q, K/V barrier phases and
      // the ping-pong stream carry across tiles; mixed with tiles whose rows
      // have no key (Tq > Tk causal: o = 0, lse = -inf) and tiles of
      // different key counts.
      make("B2_H32_Tq700_Tk300_causal_d64_many_tiles_empty_rows", 2, 700, 300, 32, 8, 64, true),
      make("B3_H16_T600_causal_window100_d128_many_tiles", 3, 600, 600, 16, 4, 128, true, 100),
      large_logits(make("B2_H24_Tq300_Tk200_causal_softcap30_d128_many_tiles_f16", 2, 300, 200, 24,
                        8, 128, true, 0, 30.0f, f16)),
      make("B2_H24_Tq300_Tk500_d256_many_tiles", 2, 300, 500, 24, 4, 256, false),
      large_logits(make("B2_H24_Tq300_Tk400_softcap30_d128_wide_many_tiles", 2, 300, 400, 24, 8,
                        128, false, 0, 30.0f)),
      make("B3_H16_Tq260_Tk530_d128_wide_many_tiles_f16", 3, 260, 530, 16, 4, 128, false, 0, 0.0f,
           f16),
      // More of the same: the softcap modes with and without row maximum,
      // work tiles of one key tile each, and tiles without keys at the end
      // of a CTA's list (d128 and d256).
      large_logits(make("B2_H24_Tq500_Tk300_causal_softcap30_d128_many_tiles_empty_rows", 2, 500,
                        300, 24, 8, 128, true, 0, 30.0f)),
      large_logits(make("B3_H16_T400_causal_softcap30_d64_many_tiles", 3, 400, 400, 16, 4, 64, true,
                        0, 30.0f)),
      make("B8_H48_T128_causal_d128_many_one_key_tile", 8, 128, 128, 48, 8, 128, true),
      make("B2_H24_Tq400_Tk150_causal_d256_many_tiles_empty_rows", 2, 400, 150, 24, 4, 256, true),
      make("B4_H36_Tq3_Tk4096_causal_d64_tall_many_tiles", 4, 3, 4096, 36, 6, 64, true),
      make("B3_H24_Tq384_Tk4096_causal_d64_tall_many_tiles", 3, 384, 4096, 24, 8, 64, true),
      // Scale 1 without softcap: row maxima that grow by far more than
      // lazy rescaling's threshold (ForwardTile::kLazyRescaleLog2: 8 at
      // d256, 0 elsewhere) from one key tile to the next, so the lazy
      // rescaling (flash/softmax.cuh) must move the reference maximum late
      // in a row; at d256 the default-scale cases above keep stale
      // references (p up to 2^8, compensated) on most tiles.
      large_logits(make("T700_causal_d128_large_logits", 1, 700, 700, 4, 2, 128, true)),
      large_logits(
          make("T900_d128_wide_large_logits_f16", 1, 900, 900, 2, 1, 128, false, 0, 0.0f, f16)),
      large_logits(make("T500_causal_d64_large_logits", 1, 500, 500, 2, 1, 64, true)),
      large_logits(make("T600_d256_large_logits", 1, 600, 600, 2, 1, 256, false)),
      // Packed GQA (pack_gqa.hpp): Tq short of a tile, so a tile's rows are
      // the (query, head) pairs of all G query heads of a kv head. G 2 to
      // 64, one and several packed tiles per kv head, rows crossing from
      // one warpgroup to the next (Tq G not a multiple of 64), causal
      // bottom-right with Tk > Tq and Tq > Tk (rows without keys), windows,
      // both softcap modes, f16, padded strides, d 64 (128 x 128 and the
      // tall tile), 128 (narrow and wide), 256, and more packed tiles than
      // SMs. T1_d128 and Tq37_Tk200_causal_d128 above are packed too (G 2).
      make("Tq1_Tk300_d128_pack_gqa4_wide", 2, 1, 300, 8, 2, 128, false),
      make("Tq1_Tk1000_causal_d128_pack_mqa32", 1, 1, 1000, 32, 1, 128, true),
      make("Tq1_Tk150_d128_pack_mqa64", 1, 1, 150, 64, 1, 128, true),
      make("Tq5_Tk300_causal_d128_pack_gqa4", 3, 5, 300, 16, 4, 128, true),
      make("Tq33_Tk200_causal_window40_d128_pack_gqa2", 1, 33, 200, 4, 2, 128, true, 40),
      make("Tq40_Tk600_causal_d128_pack_gqa8_3tiles", 1, 40, 600, 16, 2, 128, true),
      make("Tq50_Tk20_causal_d128_pack_gqa2_empty_rows", 1, 50, 20, 4, 2, 128, true),
      large_logits(make("Tq17_Tk300_causal_softcap30_d128_pack_gqa4", 1, 17, 300, 8, 2, 128, true,
                        0, 30.0f)),
      large_logits(make("Tq9_Tk200_softcap30_d128_pack_gqa4_f16", 1, 9, 200, 8, 2, 128, false, 0,
                        30.0f, f16)),
      make("Tq6_Tk130_causal_d128_pack_gqa4_padded", 2, 6, 130, 8, 2, 128, true, 0, 0.0f, bf16,
           true),
      make("Tq7_Tk100_d64_pack_gqa8_f16", 1, 7, 100, 16, 2, 64, false, 0, 0.0f, f16),
      make("Tq33_Tk1200_causal_d64_pack_tall_gqa4", 2, 33, 1200, 8, 2, 64, true),
      make("Tq3_Tk300_causal_d256_pack_gqa8", 1, 3, 300, 16, 2, 256, true),
      make("B24_H32_Tq20_Tk500_causal_d128_pack_gqa4_many_tiles", 24, 20, 500, 32, 8, 128, true),
  };
}

// The reason cuda-hopper cannot run `p` here, or "".
std::string why_not_hopper(const Problem& p, DType dtype) {
  const gqattn::Explanation why = gqattn::explain(p, dtype, Device::cuda, Backend::CudaHopper);
  return why.supported ? "" : why.reason;
}

class HopperVsOracle : public ::testing::TestWithParam<HopperCase> {};

// Runs case `c` with `splits` split-KV tasks per work tile forced through
// the plan override (0: the rule of split_kv.hpp, which splits the cases
// with few work tiles and many key tiles).
void run_forward_case(const HopperCase& c, int splits) {
  gqattn::detail::PlanOverride force;
  force.forward_splits = splits;
  const gqattn::detail::ScopedPlanOverride scope(force);
  const std::string why = why_not_hopper(c.problem, c.dtype);
  if (!why.empty()) GTEST_SKIP() << why;

  gqattn::check::Config config;
  config.problem = c.problem;
  config.dtype = c.dtype;
  config.backend = Backend::CudaHopper;
  config.seed = kSeed;
  config.backward = false;
  config.determinism = true;
  config.padded_strides = c.padded;
  const gqattn::check::Report report = gqattn::check::run(config);
  EXPECT_TRUE(report.ran) << report.skipped;
  EXPECT_EQ(report.backend, Backend::CudaHopper);
  EXPECT_TRUE(report.pass) << describe(report);
}

TEST_P(HopperVsOracle, Forward) { run_forward_case(GetParam(), 0); }
// Every work tile one task: the single-pass kernels (and K/V multicast) on
// the small cases the rule splits.
TEST_P(HopperVsOracle, ForwardUnsplit) { run_forward_case(GetParam(), 1); }
// Three splits of every work tile, where the rule would take none or
// another count: uneven ranges, and empty ones on tiles of one or two key
// tiles (rows with lse -inf in the partials).
TEST_P(HopperVsOracle, ForwardSplit3) { run_forward_case(GetParam(), 3); }

INSTANTIATE_TEST_SUITE_P(Shapes, HopperVsOracle, ::testing::ValuesIn(cases()), case_name);

Problem small_problem(int64_t d) {
  Problem p;
  p.B = 1;
  p.Tq = p.Tk = 64;
  p.H = 2;
  p.Hkv = 1;
  p.d = d;
  p.causal = true;
  return p;
}

TEST(HopperSupport, RefusesOtherHeadDimsAndF32) {
  // A build without the backend refuses everything for that reason alone.
  const std::string absent = why_not_hopper(small_problem(64), DType::bf16);
  if (absent.find("not compiled in") != std::string::npos) GTEST_SKIP() << absent;
  const std::string d84 = why_not_hopper(small_problem(84), DType::bf16);  // not a multiple of 8
  EXPECT_NE(d84.find("d=84"), std::string::npos) << d84;
  const std::string f32 = why_not_hopper(small_problem(64), DType::f32);
  EXPECT_NE(f32.find("dtype f32"), std::string::npos) << f32;
}

#ifdef GQATTN_WITH_CUDA

// bf16 [B, T, heads, d] device tensors of `p` with default strides.
struct Tensors {
  explicit Tensors(const Problem& p)
      : q(bytes(p.B * p.Tq * p.H * p.d)),
        k(bytes(p.B * p.Tk * p.Hkv * p.d)),
        v(bytes(p.B * p.Tk * p.Hkv * p.d)),
        o(bytes(p.B * p.Tq * p.H * p.d)),
        lse(std::size_t(p.B * p.H * p.Tq) * sizeof(float)),
        dout(bytes(p.B * p.Tq * p.H * p.d)),
        dq(bytes(p.B * p.Tq * p.H * p.d)),
        dk(bytes(p.B * p.Tk * p.Hkv * p.d)),
        dv(bytes(p.B * p.Tk * p.Hkv * p.d)) {}
  static std::size_t bytes(int64_t elems) { return std::size_t(elems) * 2; }
  gqattn::test::DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv;
};

gqattn::TensorRef ref(const gqattn::test::DeviceBuffer& b, const Problem& p, int64_t T,
                      int64_t heads) {
  return gqattn::contiguous(b.get(), DType::bf16, Device::cuda, p.B, T, heads, p.d);
}

// A k row stride of Hkv*d + 4 elements (8 bytes short of a 16-byte multiple):
// TMA cannot walk it; the refusal names k and nothing is written.
TEST(HopperSupport, MisalignedStrideNamesTheTensor) {
  const Problem p = small_problem(64);
  const std::string why = why_not_hopper(p, DType::bf16);
  if (!why.empty()) GTEST_SKIP() << why;
  constexpr int64_t kOddGap = 4;
  const int64_t row = p.Hkv * p.d + kOddGap;
  Tensors t(p);
  gqattn::test::DeviceBuffer k_wide(Tensors::bytes(p.B * p.Tk * row));
  gqattn::TensorRef k_ref = ref(k_wide, p, p.Tk, p.Hkv);
  k_ref.stride[1] = row;
  k_ref.stride[0] = row * p.Tk;
  t.o.poison();
  gqattn::Options options;
  options.backend = Backend::CudaHopper;
  try {
    gqattn::forward(p, ref(t.q, p, p.Tq, p.H), k_ref, ref(t.v, p, p.Tk, p.Hkv),
                    ref(t.o, p, p.Tq, p.H), gqattn::TensorRef{}, options);
    FAIL() << "a k row stride of " << row << " elements was accepted";
  } catch (const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda-hopper"), std::string::npos) << what;
    EXPECT_NE(what.find("k.stride[1]*2 bytes must be a multiple of 16"), std::string::npos) << what;
  }
  for (uint16_t bits : t.o.download<uint16_t>()) ASSERT_EQ(bits, 0xFFFFu);
}

// An o row stride of H*d + 2 elements (4-byte pieces, not 16-byte ones):
// neither TMA nor 16-byte stores can write it, so the epilogue takes its
// plain 32-bit stores instead of the staged TMA store (tile_sizes.hpp
// staged: d64, d128 causal) or the per-warp chunks
// (per-warp chunks: d256, the wide d128 tile of non-causal problems); it
// must give the same bits as packed o and leave the gaps between rows
// alone. Causal GQA 2 (d128: the multicast kernel), Tq not a multiple of
// the 64-row stores; and packed GQA tiles (pack_gqa.hpp: Tq 5 and 33 with G
// 4 and 8, whose rows are (query, head) pairs: each row's own head and
// query in the plain stores).
TEST(HopperForwardOutput, UnalignedOutputStrideGivesTheSameBits) {
  struct Shape {
    int64_t d, Tq, Tk, H, Hkv;
    bool causal;
  };
  for (const Shape& s : {Shape{64, 300, 300, 4, 2, true}, Shape{128, 300, 300, 4, 2, true},
                         Shape{128, 5, 300, 8, 2, true}, Shape{64, 33, 200, 16, 2, true},
                         Shape{256, 300, 300, 4, 2, true}, Shape{256, 33, 200, 16, 2, true},
                         Shape{128, 300, 353, 4, 2, false}, Shape{128, 5, 300, 8, 2, false}}) {
    Problem p = small_problem(s.d);
    p.B = 2;
    p.Tq = s.Tq;
    p.Tk = s.Tk;
    p.H = s.H;
    p.Hkv = s.Hkv;
    p.causal = s.causal;
    const std::string why = why_not_hopper(p, DType::bf16);
    if (!why.empty()) GTEST_SKIP() << why;
    SCOPED_TRACE("d = " + std::to_string(s.d) + ", Tq = " + std::to_string(s.Tq) + ", H / Hkv = " +
                 std::to_string(s.H / s.Hkv) + (s.causal ? ", causal" : ", not causal"));
    Tensors t(p);
    t.q.upload(gqattn::test::random_bf16(p.B * p.Tq * p.H * p.d, kSeed));
    t.k.upload(gqattn::test::random_bf16(p.B * p.Tk * p.Hkv * p.d, kSeed + 1));
    t.v.upload(gqattn::test::random_bf16(p.B * p.Tk * p.Hkv * p.d, kSeed + 2));
    t.o.poison();
    gqattn::Options options;
    options.backend = Backend::CudaHopper;
    gqattn::forward(p, ref(t.q, p, p.Tq, p.H), ref(t.k, p, p.Tk, p.Hkv), ref(t.v, p, p.Tk, p.Hkv),
                    ref(t.o, p, p.Tq, p.H), gqattn::TensorRef{}, options);
    const std::vector<uint16_t> packed = t.o.download<uint16_t>();
    for (uint16_t bits : packed)
      ASSERT_NE(bits, gqattn::test::kPoisonBits16) << "packed o not fully written";

    constexpr int64_t kPairGap = 2;
    const int64_t row = p.H * p.d + kPairGap;
    gqattn::test::DeviceBuffer o_wide(Tensors::bytes(p.B * p.Tq * row));
    o_wide.poison();
    gqattn::TensorRef o_ref = ref(o_wide, p, p.Tq, p.H);
    o_ref.stride[1] = row;
    o_ref.stride[0] = row * p.Tq;
    gqattn::forward(p, ref(t.q, p, p.Tq, p.H), ref(t.k, p, p.Tk, p.Hkv), ref(t.v, p, p.Tk, p.Hkv),
                    o_ref, gqattn::TensorRef{}, options);
    const gqattn::test::StridedComparison c = gqattn::test::compare_strided(
        o_wide.download<uint16_t>(), packed, p.B * p.Tq, p.H * p.d, row);
    EXPECT_EQ(c.differing, 0) << "elements differing from the packed (TMA-stored) o";
    EXPECT_EQ(c.gap_written, 0) << "gap elements written";
  }
}

// An odd o row stride: the plain stores write two elements per 32-bit store,
// so the refusal names o and nothing is written.
TEST(HopperSupport, OddOutputStrideNamesTheTensor) {
  const Problem p = small_problem(128);
  const std::string why = why_not_hopper(p, DType::bf16);
  if (!why.empty()) GTEST_SKIP() << why;
  const int64_t row = p.H * p.d + 1;
  Tensors t(p);
  gqattn::test::DeviceBuffer o_wide(Tensors::bytes(p.B * p.Tq * row));
  o_wide.poison();
  gqattn::TensorRef o_ref = ref(o_wide, p, p.Tq, p.H);
  o_ref.stride[1] = row;
  o_ref.stride[0] = row * p.Tq;
  gqattn::Options options;
  options.backend = Backend::CudaHopper;
  try {
    gqattn::forward(p, ref(t.q, p, p.Tq, p.H), ref(t.k, p, p.Tk, p.Hkv), ref(t.v, p, p.Tk, p.Hkv),
                    o_ref, gqattn::TensorRef{}, options);
    FAIL() << "an o row stride of " << row << " elements was accepted";
  } catch (const gqattn::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda-hopper"), std::string::npos) << what;
    EXPECT_NE(what.find("o.stride[1]*2 bytes must be a multiple of 4"), std::string::npos) << what;
  }
  for (uint16_t bits : o_wide.download<uint16_t>()) ASSERT_EQ(bits, gqattn::test::kPoisonBits16);
}

#endif  // GQATTN_WITH_CUDA

}  // namespace
