// cuda-hopper: which order the dK/dV grid takes (host side, used by
// hopper_backend.cpp): (batch, kv head) pairs per group of tile_order.hpp's
// key_tile_id, by backward_tile_sizes.hpp's dkdv_group_pairs rule.
// GQATTN_HOPPER_DKDV_GROUP=N overrides the rule (a testing and benchmarking
// switch, not a user setting): N pairs a group, 0 key-tile major. The test
// shapes are too small for the rule to group them, so
// tests/gpu/test_hopper_backward.cpp runs cases through this switch.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda/hopper/backward/params.hpp"
#include "cuda/hopper/backward/tile_sizes.hpp"
#include "gqattn/error.hpp"
#include "gqattn/types.hpp"

namespace gqattn::hopper::bwd {

inline int dkdv_grid_group_pairs(const Problem& p, int sms) {
  constexpr const char* kVar = "GQATTN_HOPPER_DKDV_GROUP";
  const char* env = std::getenv(kVar);
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const long pairs = std::strtol(env, &end, 10);
    if (*end != '\0' || errno != 0 || pairs < 0 || pairs > std::numeric_limits<int>::max())
      throw Error(std::string(kVar) + " = '" + env + "'",
                  "must be a whole number of (batch, kv head) pairs >= 0 (or unset)");
    return int(pairs);
  }
  const int64_t pairs = p.B * p.Hkv;
  return dkdv_group_pairs(int(pairs), int(dkdv_blocks(p.B, p.Hkv, p.Tk, p.d) / pairs), sms);
}

}  // namespace gqattn::hopper::bwd
