// cuda-hopper: warpgroup-level register reallocation (setmaxnreg, PTX ISA
// 8.0+, sm_90a) and the small index helpers of warp-specialised kernels.
// Checked by compiling: ptxas warns C7508 and ignores setmaxnreg when the
// kernel's register count at entry is unknown, which the build must never
// show (the kernel carries __launch_bounds__(threads, 1)).
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

// Every warp of the warpgroup must execute these with the same immediate,
// a multiple of 8 in [24, 256]; new registers have undefined contents.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg immediate");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg immediate");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The same value in every lane, and known to be so by the compiler (a
// warp-uniform warpgroup index lets it branch without divergence).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

}  // namespace gqattn::hopper::ptx
