// The CPU backend's parallel loop, on a pool of threads started once and
// reused by every later call. Checked by tests/cpu/test_cpu_threads.cpp (the
// thread count is the caller's, the threads are reused), by the determinism
// tests in tests/cpu/ (two runs, same bits) and by running the whole CPU
// suite under ASan/UBSan.
#pragma once

#include <cstdint>
#include <functional>

namespace gqattn::cpu {

// The threads a call of `count` tasks uses: min(count, num_threads), where
// num_threads <= 0 means std::thread::hardware_concurrency() (Options::
// num_threads's default), and at least 1. The calling thread is one of them.
int64_t worker_count(int64_t count, int num_threads);

// Runs body(task, worker) for every task in [0, count) on worker_count(count,
// num_threads) threads: the caller (worker 0) and helpers from the pool
// (workers 1, 2, ...; the pool grows to the largest count asked for and
// never starts a thread again). A worker index is held by one thread for the
// whole call, so per-worker scratch needs no lock. Tasks are handed out in
// order from a shared counter, so which thread runs a task varies between
// runs; the results do not, because each task computes its outputs alone, in
// a fixed order, and writes elements no other task writes. The first
// exception a task throws stops the handing out of tasks and is rethrown here
// once every helper has left the call.
void parallel_for(int64_t count, int num_threads,
                  const std::function<void(int64_t task, int64_t worker)>& body);

// The same with the library's default thread count (the oracle).
void parallel_for(int64_t count, const std::function<void(int64_t task)>& body);

}  // namespace gqattn::cpu
