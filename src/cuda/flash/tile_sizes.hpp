// cuda-flash: tile shapes per head dimension for the three kernels, and the
// shared memory each needs (the backend's why_not compares the largest with
// the device's opt-in limit). Plain C++ so the host side can use it; the
// kernels static_assert the shapes they rely on. Checked by compiling and by
// the kernels' tests (tests/gpu/test_flash_*.cpp cover d 64, 128, 256).
//
// Choices (FlashAttention-2's sm80 shapes, adjusted to keep every
// accumulator in registers without spills):
// - forward: a CTA owns kBlockM query rows, kWarps warps of kBlockM/kWarps
//   rows each (d64: two m16 tiles per warp, so each K/V fragment loaded from
//   shared memory feeds two mma; d128: one m16 tile per warp, because two
//   (O 128 + S 64 f32 registers) spill; d256: one); key tiles of kBlockN, K
//   and V single-buffered and staggered (V(n) loads during S = Q K^T, K(n-1)
//   during softmax and P V).
// - dK/dV: a CTA owns kBlockN keys of one kv head; warps are a kWarpsN x
//   kWarpsD grid, each warp 16 keys x (d / kWarpsD) columns of dK and dV;
//   query tiles of kBlockM double-buffered. With kWarpsD == 1 P^T and dS^T
//   stay in registers as the A operand of dV += P^T dO and dK += dS^T Q;
//   with kWarpsD == 2 (d = 256, where 16 x 256 x 2 accumulators would not fit)
//   they go through shared memory.
// - dQ: a CTA owns kBlockM query rows, 16 per warp; key tiles of kBlockN
//   double-buffered.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gqattn::flash {

constexpr int kElemBytes = 2;  // bf16 and f16
constexpr int kRowsPerMmaTile = 16;

template <int kD>
struct ForwardTile;
template <>
struct ForwardTile<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4;
};
template <>
struct ForwardTile<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8;
};
template <>
struct ForwardTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4;
};

template <int kD>
struct DkdvTile;
template <>
struct DkdvTile<64> {
  static constexpr int kBlockN = 128, kBlockM = 64, kWarpsN = 8, kWarpsD = 1;
};
template <>
struct DkdvTile<128> {
  static constexpr int kBlockN = 128, kBlockM = 64, kWarpsN = 8, kWarpsD = 1;
};
template <>
struct DkdvTile<256> {
  static constexpr int kBlockN = 64, kBlockM = 64, kWarpsN = 4, kWarpsD = 2;
};

template <int kD>
struct DqTile;
template <>
struct DqTile<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8;
};
template <>
struct DqTile<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8;
};
template <>
struct DqTile<256> {
  static constexpr int kBlockM = 64, kBlockN = 32, kWarps = 4;
};

constexpr int kQueryStages = 2;  // dK/dV: Q, dO, lse2, D double-buffered
constexpr int kKeyStages = 2;    // dQ: K, V double-buffered

// Shared memory of each kernel, in bytes.
template <int kD>
constexpr std::size_t forward_smem_bytes() {
  using T = ForwardTile<kD>;
  return std::size_t(T::kBlockM + 2 * T::kBlockN) * kD * kElemBytes;
}
template <int kD>
constexpr std::size_t dkdv_smem_bytes() {
  using T = DkdvTile<kD>;
  const std::size_t kv = std::size_t(2) * T::kBlockN * kD * kElemBytes;
  const std::size_t q_do = std::size_t(kQueryStages) * 2 * T::kBlockM * kD * kElemBytes;
  const std::size_t p_ds =
      T::kWarpsD > 1 ? std::size_t(2) * T::kBlockN * T::kBlockM * kElemBytes : 0;
  const std::size_t rows = std::size_t(kQueryStages) * 2 * T::kBlockM * sizeof(float);
  return kv + q_do + p_ds + rows;
}
template <int kD>
constexpr std::size_t dq_smem_bytes() {
  using T = DqTile<kD>;
  return std::size_t(2) * T::kBlockM * kD * kElemBytes +
         std::size_t(kKeyStages) * 2 * T::kBlockN * kD * kElemBytes;
}
template <int kD>
constexpr std::size_t max_smem_bytes() {
  return std::max({forward_smem_bytes<kD>(), dkdv_smem_bytes<kD>(), dq_smem_bytes<kD>()});
}

// The preprocessing kernel: kPreprocessLanesPerRow lanes share one row's
// dot product do . o.
constexpr int kPreprocessThreads = 128;
constexpr int kPreprocessLanesPerRow = 8;
constexpr int kPreprocessRowsPerBlock = kPreprocessThreads / kPreprocessLanesPerRow;

// The workspace rows of the backward are padded to this many queries (a
// multiple of every kBlockM, so whole query tiles load without bounds checks).
constexpr int kWorkspaceRowAlign = 128;

}  // namespace gqattn::flash
