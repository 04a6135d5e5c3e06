// The shared fused layer: the qualifier of functions that run on the host
// (tests, plans, TMA maps) and in kernels alike.
#pragma once

#if defined(__CUDACC__)
#define GQATTN_HD __host__ __device__ __forceinline__
#else
#define GQATTN_HD inline
#endif
