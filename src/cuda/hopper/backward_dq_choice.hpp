// cuda-hopper: which dQ path a backward call takes (host side, used by
// hopper_backend.cpp). Checked by tests/gpu/test_hopper_backward.cpp, which
// runs every d <= 128 case down both paths (GQATTN_HOPPER_DQ).
//
// - separate: the dK/dV kernel, then the dQ kernel that recomputes S and dP
//   per (query tile, key tile): seven GEMMs, no workspace beyond lse2 / D.
// - fused (d <= 128): the dK/dV kernel also forms dQ = dS K and reduce-adds
//   it into an f32 accumulator (five GEMMs), ordered by semaphores when the
//   call is deterministic; plus a zeroing and a conversion pass over the
//   B*H*Tq*d accumulator, a fixed cost per query row.
//
// Measured on the H200 (bf16, d128, 2026-11-30, docs/hopper.md): fused is
// faster when each query row keeps many keys (causal T16k: 496 vs 462
// TFLOP/s, 8192 keys per row on average) or under softcap (the separate dQ
// kernel recomputes tanh: 361 vs 322 at T4k); separate is faster at 4096
// keys per row and fewer (non-causal T4k 433 vs 372, causal T4k 408 vs 329,
// window 1024: 351 vs 223), where the fixed cost and the ordered adds'
// waits weigh more.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/hopper/backward_tile_sizes.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn::hopper::bwd {

// Mean kept keys per query row from which the fused path is taken.
constexpr int64_t kFusedDqMinKeysPerRow = 8192;

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
