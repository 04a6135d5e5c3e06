// cuda-flash: whether a device's shared memory per block takes a pass's
// kernels (the forward's; the backward's with its smallest dK/dV tile), and
// the reason when it does not. Plain C++: the backend passes the device's
// opt-in limit, so refusals an H200 never gives are checked on the CPU by
// tests/cpu/test_flash_tile_choice.cpp.
#pragma once

#include <cstddef>
#include <string>

#include "cuda/flash/tile_sizes.hpp"

namespace gqattn::flash {

// Shared memory per block the kernels of one pass need at head dimension d
// (64, 128 or 256): the forward's, or the backward's on its smallest dK/dV
// tile (backward_min_smem_bytes).
inline std::size_t smem_needed(int d, bool backward) {
  switch (d) {
    case 64: return backward ? backward_min_smem_bytes<64>() : forward_smem_bytes<64>();
    case 128: return backward ? backward_min_smem_bytes<128>() : forward_smem_bytes<128>();
    default: return backward ? backward_min_smem_bytes<256>() : forward_smem_bytes<256>();
  }
}

// A need in KB for messages: rounded up (a limit is rounded down).
inline std::size_t kb_rounded_up(std::size_t bytes) {
  constexpr std::size_t kKB = 1024;
  return (bytes + kKB - 1) / kKB;
}

// "" when a device allowing optin_smem bytes per block runs the pass; else
// the reason, with both figures in KB.
inline std::string why_too_little_smem(int d, bool backward, std::size_t optin_smem) {
  const std::size_t need = smem_needed(d, backward);
  if (need <= optin_smem) return "";
  return std::string("not supported: cuda-flash's ") + (backward ? "backward" : "forward") +
         " at d=" + std::to_string(d) + " needs " + std::to_string(kb_rounded_up(need)) +
         " KB of shared memory per block, the device allows " + std::to_string(optin_smem / 1024) +
         " KB";
}

}  // namespace gqattn::flash
