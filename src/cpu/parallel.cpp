// The CPU backend's parallel loop and its thread pool (see parallel.hpp).
// Checked by tests/cpu/test_cpu_threads.cpp, the determinism tests in
// tests/cpu/ and the sanitizer build. Helpers and the caller share a job's
// task counter and error slot; everything else of a job is read or written
// under the pool's mutex.
#include "cpu/parallel.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace gqattn::cpu {
namespace {

// More helper threads than this are never started, whatever is asked.
constexpr int64_t kMaxThreads = 256;

struct Job {
  const std::function<void(int64_t, int64_t)>* body = nullptr;
  int64_t count = 0;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  // Under the pool's mutex:
  int64_t tickets = 0;      // helper places not yet taken
  int64_t next_worker = 1;  // the index the next helper gets
  int64_t active = 0;       // helpers inside run()
  bool closed = false;      // the caller is done: no helper may enter
  std::condition_variable helpers_left;
};

void run(Job& job, int64_t worker) {
  for (;;) {
    if (job.failed.load()) return;
    const int64_t task = job.next.fetch_add(1);
    if (task >= job.count) return;
    try {
      (*job.body)(task, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.failed.store(true);
    }
  }
}

class Pool {
 public:
  void run_job(int64_t count, int64_t workers, const std::function<void(int64_t, int64_t)>& body) {
    auto job = std::make_shared<Job>();
    job->body = &body;
    job->count = count;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      start_threads(workers - 1);
      job->tickets = workers - 1;
      queue_.push_back(job);
    }
    wake_.notify_all();
    run(*job, 0);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      job->closed = true;
      queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
      job->helpers_left.wait(lock, [&] { return job->active == 0; });
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  // Under mutex_. Fewer threads than asked for (the system refused one) still
  // finish every task: the caller works too.
  void start_threads(int64_t wanted) {
    wanted = std::min(wanted, kMaxThreads);
    while (threads_ < wanted) {
      try {
        std::thread([this] { loop(); }).detach();
      } catch (const std::system_error&) {
        return;
      }
      ++threads_;
    }
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !queue_.empty(); });
      std::shared_ptr<Job> job = queue_.front();
      const int64_t worker = job->next_worker++;
      if (--job->tickets == 0) queue_.pop_front();
      ++job->active;
      lock.unlock();
      run(*job, worker);
      lock.lock();
      if (--job->active == 0 && job->closed) job->helpers_left.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;  // jobs with tickets left
  int64_t threads_ = 0;
};

// Never destroyed: detached helpers wait on it until the process exits. A
// forked child has none of the parent's helpers, so it starts a pool afresh.
std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool.store(new Pool);
    pthread_atfork(nullptr, nullptr, [] { g_pool.store(new Pool); });
  });
  return *g_pool.load();
}

}  // namespace

int64_t worker_count(int64_t count, int num_threads) {
  const int64_t wanted =
      num_threads > 0 ? num_threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  return std::max<int64_t>(1, std::min({wanted, count, kMaxThreads + 1}));
}

void parallel_for(int64_t count, int num_threads,
                  const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  const int64_t workers = worker_count(count, num_threads);
  if (workers == 1) {
    for (int64_t task = 0; task < count; ++task) body(task, 0);
    return;
  }
  pool().run_job(count, workers, body);
}

void parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
  parallel_for(count, 0, [&](int64_t task, int64_t) { body(task); });
}

}  // namespace gqattn::cpu
