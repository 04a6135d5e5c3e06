// The CPU backend's parallel loop (see parallel.hpp). Checked by the
// determinism tests in tests/cpu/ and by the sanitizer build (TSan-free by
// construction: tasks share only the atomic counter and the error slot).
#include "cpu/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gqattn::cpu {

void parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::min(hardware, count);
  if (workers == 1) {
    for (int64_t task = 0; task < count; ++task) body(task);
    return;
  }

  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&]() {
    for (;;) {
      if (failed.load()) return;
      const int64_t task = next.fetch_add(1);
      if (task >= count) return;
      try {
        body(task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers - 1));
  for (int64_t t = 0; t + 1 < workers; ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads than asked for still finish every task
    }
  }
  work();  // the calling thread works too
  for (std::thread& thread : threads) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace gqattn::cpu
