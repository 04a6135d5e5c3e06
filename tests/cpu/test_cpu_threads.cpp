// The CPU backend's threads (src/cpu/parallel.*): the count is the caller's
// (Options::num_threads), the pool's threads are started once and reused,
// and the thread count changes no bit of any result.
#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_test_util.hpp"
#include "cpu/parallel.hpp"

namespace gqattn::test {
namespace {

long this_tid() { return static_cast<long>(syscall(SYS_gettid)); }

// The threads of this process now (Linux: /proc/self/task).
std::set<long> live_threads() {
  std::set<long> out;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir))
    if (e->d_name[0] != '.') out.insert(std::strtol(e->d_name, nullptr, 10));
  closedir(dir);
  return out;
}

// Runs `count` short tasks on `threads` threads; the thread ids that ran one.
std::set<long> tids_of_call(int threads, int64_t count = 400) {
  std::mutex m;
  std::set<long> tids;
  cpu::parallel_for(count, threads, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard<std::mutex> lock(m);
    tids.insert(this_tid());
  });
  return tids;
}

TEST(CpuThreads, CountIsTheCallers) {
  EXPECT_EQ(tids_of_call(1), std::set<long>{this_tid()});
  EXPECT_LE(tids_of_call(3).size(), 3u);
  EXPECT_EQ(cpu::worker_count(1000, 5), 5);
  EXPECT_EQ(cpu::worker_count(2, 5), 2);
  EXPECT_GE(cpu::worker_count(1000, 0), 1);
}

TEST(CpuThreads, ThreadsAreReused) {
  tids_of_call(4);  // starts the pool's helpers (if not already there)
  const std::set<long> after_first = live_threads();
  for (int call = 0; call < 3; ++call) {
    const std::set<long> tids = tids_of_call(4);
    EXPECT_GT(tids.size(), 1u) << "no helper thread ran a task";
    for (long tid : tids)
      EXPECT_TRUE(after_first.count(tid)) << "call " << call << " ran on a new thread " << tid;
  }
}

TEST(CpuThreads, WorkerIndexIsHeldByOneThread) {
  std::mutex m;
  std::vector<std::set<long>> seen(4);
  cpu::parallel_for(500, 4, [&](int64_t, int64_t worker) {
    ASSERT_LT(worker, 4);
    std::lock_guard<std::mutex> lock(m);
    seen[static_cast<std::size_t>(worker)].insert(this_tid());
  });
  for (const auto& s : seen) EXPECT_LE(s.size(), 1u);
}

TEST(CpuThreads, FirstExceptionIsRethrownAfterEveryHelperLeft) {
  std::atomic<int> running{0};
  EXPECT_THROW(cpu::parallel_for(100, 4,
                                 [&](int64_t task, int64_t) {
                                   ++running;
                                   std::this_thread::sleep_for(std::chrono::microseconds(100));
                                   --running;
                                   if (task == 10) throw std::runtime_error("task 10");
                                 }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 0);
}

// Any thread count gives the bits of one thread, forward and backward.
TEST(CpuThreads, ThreadCountChangesNoBit) {
  const Problem p = make_problem(3, 7, 9, 4, 2, 5, true, 4, 6.0f);
  const Inputs in = random_inputs(p, 51);
  const Outputs one = run_cpu(in, DType::f32, Layout::packed, /*num_threads=*/1);
  for (int threads : {2, 3, 7, 0}) {
    SCOPED_TRACE("num_threads = " + std::to_string(threads));
    expect_same_bits(run_cpu(in, DType::f32, Layout::packed, threads), one);
  }
}

}  // namespace
}  // namespace gqattn::test
