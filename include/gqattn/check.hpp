// Correctness checks against the f64 oracle: what `gqattn check` prints and
// what every correctness test asserts.
//
// run() draws fresh random inputs (normal with a non-zero mean, a few rows of
// large magnitude), rounds them to the I/O dtype, runs forward and backward on
// the backend with NaN-poisoned outputs, and compares o, lse, dq, dk, dv with
// the oracle run on the same rounded inputs.
//
// Problem::q_start is passed through as given (dense and varlen). A varlen
// batch (Problem::varlen) is checked on packed tensors and sequence offsets
// staged on the backend's device, against the oracle's per-sequence
// forward_varlen/backward_varlen; its sequence lengths are Config::varlen's,
// or drawn from the seed (see layout_of below).
//
// Error of a tensor = max |x - ref| / max |ref| (lse: over kept rows, with
// -inf required exactly where the oracle has -inf). Tolerances
// (docs/semantics.md, "How correctness is judged"), see tolerance() below:
//   every dtype: 2 x (error of the f32 CPU mirror on the same rounded inputs)
//                + one rounding of an output element (2^-24 f32, 2^-8 bf16,
//                  2^-11 f16)
//   bf16/f16:    + for o, dq, dk, dv one more rounding: the 16-bit P or dS
//                  operand of the tensor-core product that forms them (see
//                  check.cpp)
// (A fixed f32 bound such as 1e-5 fails the seed's own f32 algorithm on long
// rows: dq at T = 2048.)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gqattn/oracle.hpp"
#include "gqattn/types.hpp"

namespace gqattn::check {

// The sequences of a varlen check (Config::problem.varlen).
struct VarlenConfig {
  // Lengths of the B sequences, each at most problem.Tq (queries) or
  // problem.Tk (keys). Empty: drawn from Config::seed, each in [0, Tq] and
  // [0, Tk], lengths 0 and 1 drawn often (the edge cases of every kernel).
  std::vector<int32_t> seqlens_q, seqlens_k;
  // Keys used per sequence, each at most its key length. Empty: none,
  // unless draw_seqused_k, which draws each in [0, its key length].
  std::vector<int32_t> seqused_k;
  bool draw_seqused_k = false;
  // Options::check_offsets of the backend's calls (offsets on a CUDA device
  // are then not read on the host; the CPU always reads them).
  bool check_offsets = true;
};

struct Config {
  Problem problem;
  DType dtype = DType::bf16;
  Backend backend = Backend::Cpu;
  uint64_t seed = 1;
  bool backward = true;
  // Options::deterministic of the backend's calls. false lets it take a
  // non-deterministic path (cuda-flash: atomic dQ): the outputs are still
  // compared with the oracle, but the bitwise rerun below is skipped.
  bool deterministic = true;
  // Run once more and compare every output bit (only when deterministic).
  bool determinism = true;
  bool padded_strides = false;  // give every tensor non-packed strides
  // Rows of q with large magnitude (x4): exercise the softmax's max tracking.
  bool large_rows = true;
  VarlenConfig varlen;  // used when problem.varlen
  // For tests of the checker itself: changes the problem and offsets the
  // backend under test is given (not the oracle's nor the f32 mirror's;
  // the packed totals must stay), e.g. a q_start off by one, to prove that
  // a backend with that bug fails the check.
  std::function<void(Problem&, oracle::VarlenLayout&)> mislead_backend;
};

struct Metric {
  std::string name;    // "o", "lse", "dq", "dk", "dv"
  double error = 0.0;  // max |x - ref| / max |ref|
  double tolerance = 0.0;
  bool pass = false;  // error <= tolerance
  std::string note;   // e.g. "NaN at index 17", "unwritten (still poison)"
};

struct Report {
  Backend backend = Backend::Cpu;
  bool ran = false;     // false: the backend refused; see `skipped`
  std::string skipped;  // why it did not run
  // Why backward did not run while forward did (a forward-only backend).
  std::string backward_skipped;
  std::vector<Metric> metrics;
  // Bitwise equal across runs; true when not checked (Config::determinism
  // or Config::deterministic false).
  bool deterministic = true;
  // Ran, every metric passed, deterministic. A refused backward (see
  // backward_skipped) is not a failure: it is reported, not hidden.
  bool pass = false;
  double forward_ms = 0.0;  // wall time of one call, synchronised
  double backward_ms = 0.0;
};

Report run(const Config& config);

// The offsets a varlen check runs (config.problem.varlen): config.varlen's
// lengths, or those drawn from config.seed. Throws gqattn::Error naming the
// rule when the lengths do not fit the problem (count B, at most Tq and Tk,
// seqused_k at most the key length).
oracle::VarlenLayout layout_of(const Config& config);

// The tolerance of output `name` ("o", "lse", "dq", "dk", "dv") in `dtype`,
// given the error of the f32 CPU mirror against the f64 oracle on the same
// inputs. The one definition of the rule: run() and the tests use it.
double tolerance(DType dtype, const std::string& name, double mirror_error);

}  // namespace gqattn::check
