// A minimal deterministic parallel loop for the CPU backend and the oracle.
// Checked by the determinism tests in tests/cpu/ (two runs, same bits) and
// by running the whole CPU suite under ASan/UBSan.
#pragma once

#include <cstdint>
#include <functional>

namespace gqattn::cpu {

// Runs body(task) for every task in [0, count) on up to
// std::thread::hardware_concurrency() threads. Tasks are handed out in order
// from a shared counter, so which thread runs a task varies between runs; the
// results do not, because each task computes its outputs alone, in a fixed
// order, and writes elements no other task writes. The first exception a task
// throws is rethrown here after every thread has joined.
void parallel_for(int64_t count, const std::function<void(int64_t)>& body);

}  // namespace gqattn::cpu
