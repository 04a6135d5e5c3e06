// cuda-hopper: programmatic dependent launch's two device-side instructions
// (PTX ISA "griddepcontrol", sm_90): a primary kernel says its dependent
// grid may be scheduled, and a dependent grid waits until its prerequisite
// grids have completed and their memory operations are visible. Without
// the launch attribute (cudaLaunchAttributeProgrammaticStreamSerialization)
// both are no-ops in effect: the dependent grid then starts after the
// primary has completed anyway. Checked by tests/gpu/test_hopper_backward.cpp
// (the fused dQ's conversion kernel is launched that way).
#pragma once

namespace gqattn::hopper::ptx {

// The dependent grid may be scheduled once every CTA of this grid has
// executed this (or exited). Repeats have no further effect.
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Blocks until every prerequisite grid has completed and its memory
// operations are performed and visible to this grid.
__device__ __forceinline__ void wait_on_prerequisites() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

}  // namespace gqattn::hopper::ptx
