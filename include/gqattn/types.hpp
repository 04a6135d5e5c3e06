// gqattn public types: the problem description, tensor references and options.
//
// Everything a caller passes to forward()/backward() is described here. The
// semantics every backend meets are in docs/semantics.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace gqattn {

enum class DType { f32, bf16, f16 };
enum class Device { cpu, cuda };

// Backends. Auto picks the fastest compiled-in backend that supports the
// problem; an explicit backend that cannot run a problem fails with the reason.
enum class Backend { Auto, Cpu, CudaUnfused, CudaFlash, CudaHopper };

// A backend may support one pass and not the other (a forward-only backend).
enum class Pass { forward, backward };

// A view of caller-owned memory. Strides are in elements; the last dimension
// must be contiguous (stride 1), the others are free.
//   q, o, do, dq : rank 4, [B, Tq, H, d]
//   k, v, dk, dv : rank 4, [B, Tk, Hkv, d]
//   lse          : rank 3, [B, H, Tq], always f32
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// A tensor with default (row-major, packed) strides. For q this is the seed's
// packed layout [B, T, H*d].
TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2);
TensorRef contiguous(void* data, DType dtype, Device device, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3);

struct Problem {
  int64_t B = 1;
  int64_t Tq = 1;
  int64_t Tk = 1;
  int64_t H = 1;
  int64_t Hkv = 1;
  int64_t d = 64;
  bool causal = false;
  int64_t window = 0;          // keys kept per query, self included; 0 = no window
  float softcap = 0.0f;        // s = softcap * tanh(s / softcap) when > 0; 0 = off
  std::optional<float> scale;  // default 1/sqrt(d)

  float effective_scale() const;
  // (query, key) pairs that the mask keeps in one (batch, head), exactly
  // (docs/semantics.md): the FLOP count of a pass is proportional to it.
  int64_t kept_pairs() const;
  // The window as the mask uses it: 0 (no window) when window == 0 or
  // window >= Tk, else window. An identity of the mask rule, not a new rule:
  // key j is kept iff j >= i + Tk - Tq - window + 1, and i + Tk - Tq <= Tk - 1
  // for every query i, so a window of Tk or more keeps every key on the left,
  // as no window does. Every backend and the oracle read the window through
  // this, which also keeps pos - window + 1 far from overflow (a window near
  // INT64_MAX, e.g. Python's sys.maxsize for "no window", becomes 0).
  int64_t effective_window() const;
};

// A problem of B sequences of Tq queries and Tk keys, H query heads over
// Hkv key/value heads of dimension d, with the given mask and softcap (scale
// left to its default, 1/sqrt(d)).
Problem make_problem(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t d,
                     bool causal = false, int64_t window = 0, float softcap = 0.0f);

struct Options {
  Backend backend = Backend::Auto;
  void* stream = nullptr;  // cudaStream_t for CUDA backends; ignored on the CPU
  // Same bits on every run (the default). false permits a faster
  // non-deterministic path where a backend has one (cuda-flash's backward
  // then adds the dQ partials with atomics in hardware order,
  // docs/backends/cuda-flash.md):
  // results stay within the same tolerances but may differ in the last bits
  // from run to run. Backends and passes without such a path ignore it and
  // stay deterministic (cuda-hopper: its ordered dQ adds measured faster
  // than unordered ones, docs/backends/cuda-hopper.md).
  bool deterministic = true;
  // Threads of the CPU backend (and the oracle): 0 = the library's default
  // (std::thread::hardware_concurrency()); n > 0 = at most n threads, the
  // caller's included. The torch op fills it from torch.get_num_threads().
  // The threads are started once and reused by later calls. CUDA backends
  // ignore it.
  int num_threads = 0;
};

}  // namespace gqattn
