// The fused KV-cache path: the one place that decides how a call runs: the
// kernel's head dim, how its four warps share a CTA's work (rows or keys),
// and how each sequence's keys split over CTAs (split-KV). Plain C++ (the
// host passes the device's size), checked on the CPU by
// tests/cpu/test_kv_cache_plan.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "gqattn/types.hpp"

namespace gqattn::kv_cache {

constexpr int kWarps = 4;
constexpr int kBlockN = 64;  // keys per tile, loaded with cp.async from any page size
constexpr int kStages = 2;   // key tiles in flight per CTA
// A CTA's rows are packed (query, head of its group) pairs of one kv head:
// row r is query r / G of query head hk * G + r % G (G = H / Hkv), so a
// key tile is loaded once for every query head that reads it.
constexpr int kRowsPerWarp = 16;  // one m16 mma tile
// Batch-invariant splits: this many key tiles (1024 keys) per split,
// whatever the batch (Options::batch_invariant).
constexpr int kInvariantTilesPerSplit = 16;
// Without it: where the CTAs fill at most half a wave of resident CTAs,
// splits (at most kMaxSplits) fill one wave and no more (a second, partial
// wave would leave SMs idle at its end); with more CTAs, sequences longer
// than 2 x 1024 keys split into runs of 1024 keys, as batch_invariant does.
constexpr int kMaxSplits = 128;
// ... and keep at least this many key tiles per split, so that the partial
// results' traffic stays small beside the keys'.
constexpr int kMinTilesPerSplit = 4;

// What the default split rule needs of the device: 0 where unknown (then no
// split).
struct DeviceShape {
  int multiprocessors = 0;
  int ctas_per_sm = 0;  // resident CTAs of the plan's kernel per SM (occupancy)
};

struct Plan {
  int d = 0;        // kernel head dim: 64, 128 or 256
  int warps_m = 0;  // warps over rows: 16 rows each; the other 4 / warps_m split the key tiles
  int block_m = 0;  // packed rows per CTA
  int64_t m_tiles = 0;
  int num_splits = 1;
  int tiles_per_split = 0;       // 0: a CTA's own tiles shared evenly over num_splits
  int64_t workspace_floats = 0;  // o_part and lse_part (0 without splits)
  std::size_t smem_bytes = 0;
};

// The kernel (d, warps_m) depends on the problem only; the default split
// also on `device` (unknown: no split). The batch-invariant split ignores it.
Plan plan(const Problem& p, DeviceShape device, bool batch_invariant);

// Shared memory per CTA of a kernel of head dim d and warps_m warps over rows.
std::size_t smem_bytes(int d, int warps_m);

// One line for explain().
std::string describe(const Plan& plan, bool batch_invariant);

}  // namespace gqattn::kv_cache
