// cuda-hopper: split-KV in the forward, where a problem has too few work
// tiles to fill the GPU (decoding, short chunks of a long context): each
// work tile's key tiles are divided into `splits` contiguous ranges, one
// CTA task each; every task writes its rows' normalised f32 O and lse
// (natural log) to a workspace (epilogue.cuh store_split_partial), and a
// second kernel (forward_combine.cuh) merges the splits of each row in a
// fixed order (lse = log sum exp of the splits' lse, O weighted by exp(lse_s
// - lse)), so the result stays deterministic. A split whose range holds no
// kept key of a row contributes lse -inf, weight 0. The split count
// depends on the problem and the device's SM count only: the same call on
// the same GPU model gives the same bits; on another model it may round
// differently (within the oracle's tolerance either way).
// The rule and the range arithmetic are plain C++ (host and device), so
// tests/cpu/test_hopper_split_kv.cpp checks them; the kernels are checked
// by tests/gpu/test_hopper_forward.cpp (every case with the rule and with
// GQATTN_HOPPER_SPLIT_KV=1 and =3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/fused/host_device.hpp"
#include "gqattn/error.hpp"

namespace gqattn::hopper {

// Off: every work tile is one task (the combine kernel never runs).
constexpr bool kSplitKv = true;
// A task walks at least this many key tiles: a shorter range would spend
// more on its pipeline's fill, its epilogue and the combine than it saves.
constexpr int kSplitKvMinKeyTiles = 4;
// At most this many splits (the combine reads each row's partials in turn).
constexpr int kSplitKvMaxSplits = 16;
// The combine kernel by programmatic dependent launch: launched while the
// forward kernel runs (every forward CTA triggers it once started), it
// waits on the device for the forward grid (griddepcontrol.wait), so the
// gap between the two kernels (their launch latency) overlaps the forward.
// Why: a split decoding forward takes 33-144 us (docs/performance.md,
// short queries), so a few microseconds of launch gap count: 1-2 us
// faster on each decoding shape measured (docs/hopper.md TODO 10).
// Off: a plain stream-ordered launch.
constexpr bool kCombineOverlap = true;

// Splits per work tile by the rule: only where the work tiles fill at most
// half the SMs, as many as fill them in one wave, each of at least
// kSplitKvMinKeyTiles of the problem's key tiles. 1: not split.
constexpr int split_kv_rule(int64_t work_tiles, int64_t key_tiles, int sms) {
  if (!kSplitKv || work_tiles <= 0 || 2 * work_tiles > sms) return 1;
  const int64_t by_sms = sms / work_tiles;
  const int64_t by_keys = key_tiles / kSplitKvMinKeyTiles;
  const int64_t splits = std::min({by_sms, by_keys, int64_t(kSplitKvMaxSplits)});
  return splits >= 2 ? int(splits) : 1;
}

// The splits a forward call takes: the rule, or GQATTN_HOPPER_SPLIT_KV=N
// (1 <= N <= kSplitKvMaxSplits: exactly N, empty ranges included; a testing
// and benchmarking switch, not a user setting).
inline int split_kv_count(int64_t work_tiles, int64_t key_tiles, int sms) {
  constexpr const char* kVar = "GQATTN_HOPPER_SPLIT_KV";
  const char* env = std::getenv(kVar);
  if (env == nullptr || *env == '\0') return split_kv_rule(work_tiles, key_tiles, sms);
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 1 || n > kSplitKvMaxSplits)
    throw Error(
        std::string(kVar) + " = '" + env + "'",
        "must be a whole number from 1 to " + std::to_string(kSplitKvMaxSplits) + " (or unset)");
  return int(n);
}

// Key tiles [first, last] of a work tile, split `split` of `splits`: the
// split-th of `splits` contiguous ranges of ceil(count / splits) key tiles
// (the last ones may be shorter or empty: last < first). splits 1: all.
struct KeyTileRange {
  int first, last;
};
GQATTN_HD KeyTileRange split_key_tiles(int first, int last, int split, int splits) {
  const int count = last - first + 1;
  if (splits <= 1 || count <= 0) return {first, last};
  const int chunk = (count + splits - 1) / splits;
  const int lo = first + split * chunk;
  return {lo, lo + chunk - 1 < last ? lo + chunk - 1 : last};
}

}  // namespace gqattn::hopper
