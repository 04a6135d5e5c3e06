// The fused KV-cache path's plan (src/cuda/kv_cache/plan.hpp), without a
// GPU: the warp layout decoding and chunks take, the split-KV rule that
// fills an H200 (132 SMs) and the batch-invariant one that ignores the batch
// and the device, the workspace, and that every kernel's shared memory fits
// the H200's 227 KB per block. Built where cuda-flash or cuda-hopper is (the
// plan lives in the library's CUDA part); it needs no GPU.
#if defined(GQATTN_HAS_CUDA_FLASH) || defined(GQATTN_HAS_CUDA_HOPPER)
#include <gtest/gtest.h>

#include "cuda/kv_cache/plan.hpp"

namespace {

using gqattn::Problem;
namespace kv = gqattn::kv_cache;

// An H200 running a kernel 3 CTAs per SM (the d128 decoding kernel's
// shared memory allows 3).
constexpr kv::DeviceShape kH200{132, 3};
constexpr kv::DeviceShape kUnknown{};

Problem cache_problem(int64_t B, int64_t Tq, int64_t capacity, int64_t H, int64_t Hkv, int64_t d,
                      int64_t window = 0) {
  Problem p = gqattn::make_problem(B, Tq, capacity, H, Hkv, d, Tq > 1, window);
  p.kv_cache = true;
  p.kv_page_size = 16;
  return p;
}

TEST(KvCachePlan, DecodingPacksTheGroupIntoOneWarpTileAndSplitsKeysOverWarps) {
  const kv::Plan plan = kv::plan(cache_problem(8, 1, 32768, 32, 8, 128), kH200, false);
  EXPECT_EQ(plan.d, 128);
  EXPECT_EQ(plan.warps_m, 1);  // 4 rows: one m16 tile; the warps take quarters of each key tile
  EXPECT_EQ(plan.block_m, 16);
  EXPECT_EQ(plan.m_tiles, 1);
}

TEST(KvCachePlan, ChunksSpreadTheirRowsOverTheWarps) {
  // Tq 16, group 4: 64 rows, one tile; Tq 70: 280 rows, 5 tiles of 64.
  const kv::Plan chunk = kv::plan(cache_problem(4, 16, 8192, 32, 8, 128), kH200, false);
  EXPECT_EQ(chunk.warps_m, kv::kWarps);
  EXPECT_EQ(chunk.block_m, 64);
  EXPECT_EQ(chunk.m_tiles, 1);
  EXPECT_EQ(kv::plan(cache_problem(1, 70, 4096, 8, 2, 64), kH200, false).m_tiles, 5);
  // MQA decoding: 32 heads of one kv head are 32 rows: two warps over
  // rows, two over keys.
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 4096, 32, 1, 64), kH200, false).warps_m, 2);
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 4096, 32, 1, 64), kH200, false).block_m, 32);
}

TEST(KvCachePlan, DefaultSplitsFillOneWaveOrRunInFixedLengths) {
  // B1 Hkv 8: 8 CTAs; one wave is 132 * 3 = 396, so 49 splits of the 512
  // key tiles (~11 tiles each), 392 CTAs.
  const kv::Plan one = kv::plan(cache_problem(1, 1, 32768, 32, 8, 128), kH200, false);
  EXPECT_EQ(one.num_splits, 49);
  EXPECT_EQ(one.tiles_per_split, 0);
  EXPECT_EQ(one.workspace_floats, int64_t(49) * 1 * 32 * 1 * (128 + 1));
  // B8: 64 CTAs, 6 splits (384 CTAs: 7 would spill into a second wave).
  EXPECT_EQ(kv::plan(cache_problem(8, 1, 8192, 32, 8, 128), kH200, false).num_splits, 6);
  // B32: 256 CTAs are more than half a wave: runs of 1024 keys, 8 of 8k.
  const kv::Plan b32 = kv::plan(cache_problem(32, 1, 8192, 32, 8, 128), kH200, false);
  EXPECT_EQ(b32.num_splits, 8);
  EXPECT_EQ(b32.tiles_per_split, kv::kInvariantTilesPerSplit);
  // B128 Hkv 8: 1024 CTAs already fill it: runs of 1024 keys too, 32 of 32k.
  const kv::Plan full = kv::plan(cache_problem(128, 1, 32768, 32, 8, 128), kH200, false);
  EXPECT_EQ(full.num_splits, 32);
  EXPECT_EQ(full.tiles_per_split, kv::kInvariantTilesPerSplit);
  // ... but not 2048 keys or fewer (32 tiles): no split.
  const kv::Plan short_cache = kv::plan(cache_problem(128, 1, 2048, 32, 8, 128), kH200, false);
  EXPECT_EQ(short_cache.num_splits, 1);
  EXPECT_EQ(short_cache.workspace_floats, 0);
  // Short caches keep at least kMinTilesPerSplit tiles a split: 1024 keys
  // are 16 tiles, 4 splits.
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 1024, 32, 8, 128), kH200, false).num_splits, 4);
  // No device known: no split.
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 32768, 32, 8, 128), kUnknown, false).num_splits, 1);
  // At most kMaxSplits.
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 1 << 24, 8, 1, 64), kH200, false).num_splits,
            kv::kMaxSplits);
}

TEST(KvCachePlan, BatchInvariantSplitsDependOnTheCapacityOnlyAndHaveFixedLength) {
  for (int64_t B : {1, 7, 128})
    for (kv::DeviceShape device : {kUnknown, kv::DeviceShape{78, 2}, kH200}) {
      const int sms = device.multiprocessors;
      const kv::Plan plan = kv::plan(cache_problem(B, 1, 32768, 32, 8, 128), device, true);
      EXPECT_EQ(plan.tiles_per_split, kv::kInvariantTilesPerSplit) << B << " " << sms;
      EXPECT_EQ(plan.num_splits, 32768 / 64 / kv::kInvariantTilesPerSplit) << B << " " << sms;
    }
  // Not capped: a cap would tie a sequence's split to the capacity.
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 1 << 24, 8, 1, 64), kH200, true).num_splits,
            (1 << 24) / 64 / kv::kInvariantTilesPerSplit);
}

TEST(KvCachePlan, AWindowBoundsTheKeyTilesACtaVisits) {
  // Window 100 over 32k keys, decoding: at most 100 + 1 keys, 2 tiles; the
  // 8 CTAs split them at most 2 / kMinTilesPerSplit -> 1 way.
  const kv::Plan plan = kv::plan(cache_problem(1, 1, 32768, 32, 8, 128, 100), kH200, false);
  EXPECT_EQ(plan.num_splits, 1);
}

TEST(KvCachePlan, PaddedHeadDimsRunTheNextKernelAndEverySharedMemoryFitsAnH200) {
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 64, 8, 2, 80), kH200, false).d, 128);
  EXPECT_EQ(kv::plan(cache_problem(1, 1, 64, 8, 2, 192), kH200, false).d, 256);
  for (int d : {64, 128, 256})
    for (int warps_m : {1, 2, kv::kWarps}) EXPECT_LE(kv::smem_bytes(d, warps_m), 227u * 1024) << d;
  EXPECT_EQ(kv::smem_bytes(128, 1), 16u * 128 * 2 + 2u * 2 * 64 * 128 * 2 + 4u * 16 * 4);
}

}  // namespace
#endif
