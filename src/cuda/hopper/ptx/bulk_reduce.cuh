// cuda-hopper: the 1-D bulk reduce-add and bulk store shared -> global (PTX
// ISA "cp.reduce.async.bulk", "cp.async.bulk", sm_90) with their bulk-group
// completion, the proxy
// fences that order ordinary memory accesses against it, and the gpu-scope
// acquire load / release add of the semaphores that order the adds of the
// fused dQ (backward_dkdv_kernel.cuh). Checked by compiling for sm_90a and by
// tests/gpu/test_hopper_backward.cpp (a missing fence shows as wrong or
// non-reproducible dq there).
//
// Requirements (PTX ISA): `dst` and `src` 16-byte aligned, `bytes` a
// multiple of 16. The add is element-wise f32, performed at L2 by the async
// proxy; two reduce-adds into one element from different CTAs commute only
// up to rounding, so a reproducible sum needs them in a fixed order.
#pragma once

#include <cstdint>

namespace gqattn::hopper::ptx {

// dst[i] += src[i] for the bytes / 4 floats at `dst` (global) from `src`
// (shared); tracked by the issuing thread's bulk async-group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

// dst[i] = src[i] for the bytes / 4 floats: the same transfer as
// bulk_reduce_add_f32 without reading dst (the first of an ordered series of
// adds, so the destination needs no zeroing); same bulk async-group.
__device__ __forceinline__ void bulk_store(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Every committed bulk group of this thread has finished reading its shared
// memory source (the source may be overwritten).
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Every committed bulk group of this thread has completed, its writes made
// visible to this thread.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Ordinary (generic proxy) writes to shared memory before it, by this
// thread, are seen by async-proxy reads (wgmma, bulk copies) after it.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The same between the generic and the async proxy for global memory: an
// async reduce-add completed before it is ordered before this thread's
// later ordinary accesses (a release), and an acquire before it is ordered
// before later async-proxy accesses.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n"
               : "=r"(v)
               : "l"(reinterpret_cast<uint64_t>(p))
               : "memory");
  return v;
}

__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(p)),
               "r"(v)
               : "memory");
}

}  // namespace gqattn::hopper::ptx
