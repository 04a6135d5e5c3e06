// cuda-hopper: split-KV in the forward, where a problem has too few work
// tiles to fill the GPU (decoding, short chunks of a long context): each
// work tile's key tiles are divided into `splits` contiguous ranges, one
// CTA task each; every task writes its rows' normalised f32 O and lse
// (natural log) to a workspace (epilogue.cuh store_split_partial), and a
// second kernel (split_combine.cuh), launched dependent on the forward so
// that its launch latency hides under the forward's tail, merges the splits of each row in a
// fixed order (lse = log sum exp of the splits' lse, O weighted by exp(lse_s
// - lse)), so the result stays deterministic. A split whose range holds no
// kept key of a row contributes lse -inf, weight 0. The split count
// depends on the problem and the device's SM count only: the same call on
// the same GPU model gives the same bits; on another model it may round
// differently (within the oracle's tolerance either way).
// The plan (plan.cpp) takes the rule's count; the rule and the range
// arithmetic are plain C++ (host and device), so
// tests/cpu/test_hopper_split_kv.cpp checks them; the kernels are checked
// by tests/gpu/test_hopper_forward.cpp (every case with the rule and with
// 1 and 3 splits forced). Why these bounds:
// docs/decisions/hopper-forward-split-kv.md.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/fused/host_device.hpp"

namespace gqattn::hopper {

// A task walks at least this many key tiles: a shorter range would spend
// more on its pipeline's fill, its epilogue and the combine than it saves.
constexpr int kSplitKvMinKeyTiles = 4;
// At most this many splits (the combine reads each row's partials in turn).
constexpr int kSplitKvMaxSplits = 16;

// Splits per work tile by the rule: only where the work tiles fill at most
// half the SMs, as many as fill them in one wave, each of at least
// kSplitKvMinKeyTiles of the problem's key tiles. 1: not split.
constexpr int split_kv_rule(int64_t work_tiles, int64_t key_tiles, int sms) {
  if (work_tiles <= 0 || 2 * work_tiles > sms) return 1;
  const int64_t by_sms = sms / work_tiles;
  const int64_t by_keys = key_tiles / kSplitKvMinKeyTiles;
  const int64_t splits = std::min({by_sms, by_keys, int64_t(kSplitKvMaxSplits)});
  return splits >= 2 ? int(splits) : 1;
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
