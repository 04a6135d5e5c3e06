// cuda-hopper: which dQ path a backward call takes (host side, used by
// hopper_backend.cpp). Checked by tests/gpu/test_hopper_backward.cpp, which
// runs every d <= 128 case down both paths (GQATTN_HOPPER_DQ).
//
// - separate: the dK/dV kernel, then the dQ kernel that recomputes S and dP
//   per (query tile, key tile): seven GEMMs, no workspace beyond lse2 / D.
// - fused (d <= 128): the dK/dV kernel also forms dQ = dS K and writes it
//   into an f32 accumulator (five GEMMs) in an order fixed by semaphores;
//   plus a conversion pass over the B*H*Tq*d accumulator, a fixed cost per
//   query row, and the queueing of the first adds.
//
// Measured on the H200 (bf16, backward TFLOP/s, 2026-11-30, docs/hopper.md,
// "fifth run" of performance.md), fused vs separate: causal T4k 472 vs 412
// (2048 kept keys per row on average), T16k 540 vs 463, non-causal T4k 517
// vs 436, d64 causal T4k 393 vs 341, softcap 30 T4k 415 vs 330; separate is
// faster at 1024 keys per row and fewer (window 1024: 376 vs 316; causal
// T1k, 512: 329 vs 280), where the fixed costs weigh more. The threshold
// lies between those two measured points. Re-measured 2026-12-01 with the
// grouped dK/dV grid, separate vs fused: window 1024 376, 372 vs 352, 356;
// causal T1k 332, 332 vs 290, 294.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/hopper/backward/tile_sizes.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn::hopper::bwd {

// Mean kept keys per query row from which the fused path is taken.
constexpr int64_t kFusedDqMinKeysPerRow = 1536;

// True: fused dQ; false: the separate dQ kernel. GQATTN_HOPPER_DQ=fused or
// =separate overrides the rule (a testing and benchmarking switch, not a
// user setting); fused where d has no fused path is an error.
inline bool use_fused_dq(const Problem& p) {
  constexpr const char* kVar = "GQATTN_HOPPER_DQ";
  const bool supported = fused_dq_supported(int(p.d));
  const char* env = std::getenv(kVar);
  if (env != nullptr && *env != '\0') {
    if (std::strcmp(env, "separate") == 0) return false;
    if (std::strcmp(env, "fused") == 0) {
      if (!supported)
        throw Error(std::string(kVar) + " = fused",
                    "not supported: cuda-hopper's fused dQ needs d <= 128 (got d=" +
                        std::to_string(p.d) + ")");
      return true;
    }
    throw Error(std::string(kVar) + " = '" + env + "'", "must be fused or separate (or unset)");
  }
  if (!supported) return false;
  return p.softcap > 0 || p.kept_pairs() >= kFusedDqMinKeysPerRow * p.Tq;
}

}  // namespace gqattn::hopper::bwd
