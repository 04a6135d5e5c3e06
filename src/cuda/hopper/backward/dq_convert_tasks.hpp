// cuda-hopper: which accumulator blocks each CTA of the fused dQ's
// conversion kernel (dq_convert.cuh) converts, in its persistent grid
// (docs/decisions/hopper-backward-dq-convert-overlap.md): CTA i takes the tasks i + k ctas,
// k < dq_convert_tasks(blocks, ctas, i); task j is the block
// dq_convert_block(j, ...). Plain integer code for host and device, so that
// tests/cpu/test_hopper_dq_convert_tasks.cpp checks on the CPU that the CTAs
// cover every block exactly once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/fused/host_device.hpp"

namespace gqattn::hopper::bwd {

// The block (b h, query tile) index, (b H + h) tiles + m, of task j: query
// tiles from the last down, every (b, h) of one query tile in a row (the
// order only decides which blocks a CTA polls together).
GQATTN_HD int64_t dq_convert_block(int64_t j, int64_t tiles, int64_t bh_count) {
  const int64_t m = tiles - 1 - j / bh_count;
  return (j % bh_count) * tiles + m;
}

// Tasks of CTA `cta` of `ctas` over `blocks` blocks (0 < ctas <= blocks).
GQATTN_HD int64_t dq_convert_tasks(int64_t blocks, int64_t ctas, int64_t cta) {
  return cta < blocks ? (blocks - cta + ctas - 1) / ctas : 0;
}

// Tasks per poll: one per lane of the polling warp.
constexpr int kDqConvertChunk = 32;
// The dynamic shared memory of the pending-task bits: one 32-bit word per
// chunk of the CTA with the most tasks (CTA 0).
inline std::size_t dq_convert_pending_bytes(int64_t blocks, int64_t ctas) {
  return std::size_t((dq_convert_tasks(blocks, ctas, 0) + kDqConvertChunk - 1) / kDqConvertChunk) *
         sizeof(uint32_t);
}

}  // namespace gqattn::hopper::bwd
