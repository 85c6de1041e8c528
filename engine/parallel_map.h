// ParallelMap: fn(i) for every i in [0, n) on several threads, results in
// index order. Work is handed out in small blocks from a shared counter, so
// uneven items (long and short examples) still keep every thread busy.
// Header-only and torch-free.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace trainerd::engine {

// The number of threads "use all cores" means: the hardware's, at least 1.
inline int AllCores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Returns {fn(0), ..., fn(n-1)}. `threads` <= 0 means AllCores(); no more
// threads than blocks are started, and n below one block runs on the caller's
// thread. fn must be safe to call concurrently and must not throw. T must be
// default-constructible and movable.
template <typename T, typename Fn>
std::vector<T> ParallelMap(size_t n, int threads, Fn fn) {
  std::vector<T> out(n);
  constexpr size_t kBlock = 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  const size_t workers = std::min<size_t>(threads > 0 ? threads : AllCores(), blocks);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
      const size_t end = std::min(n, (b + 1) * kBlock);
      for (size_t i = b * kBlock; i < end; ++i) out[i] = fn(i);
    }
  };
  if (workers <= 1) {
    work();
    return out;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return out;
}

}  // namespace trainerd::engine
