// cuda-hopper: programmatic dependent launch's two device-side instructions
// (PTX ISA "griddepcontrol", sm_90): a primary kernel says its dependent
// grid may be scheduled, and a dependent grid waits until its prerequisite
// grids have completed and their memory operations are visible. Without
// the launch attribute (cudaLaunchAttributeProgrammaticStreamSerialization)
// both are no-ops in effect: the dependent grid then starts after the
// primary has completed anyway. Below sm_90 (no such launch) both compile
// to nothing, so kernels built for every architecture may call them.
// Checked by tests/gpu/test_hopper_backward.cpp (the fused dQ's conversion
// kernel is launched that way) and tests/gpu/test_hopper_forward.cpp (the
// split-KV combine kernel).
#pragma once

namespace gqattn::hopper::ptx {

// The dependent grid may be scheduled once every CTA of this grid has
// executed this (or exited). Repeats have no further effect.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Blocks until every prerequisite grid has completed and its memory
// operations are performed and visible to this grid.
__device__ __forceinline__ void wait_on_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace gqattn::hopper::ptx
