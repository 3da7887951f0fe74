// An emulated decode pass, to ask what overlapping the serial work with weight streaming could save (issue 32's plain
// pass: docs/pass-goals.md, "Session 28"). Per layer four one-row products over smollm2-135M's float32 weight sizes
// (q/k/v, o, gate+up, down) with serial gaps on the main thread before each (norm; rope + attention reading a KV
// share; add + norm; SiLU * up), 30 layers. Arms (one a process; alternate them, the host is noisy):
//   0 omp: each product an OpenMP region split in halves (what the stream kernel does today);
//   1 pool: a persistent spinning worker instead of OpenMP's fork and join;
//   2 pool + prefetch: while the main thread works serially the worker loads the start of its next share, and the
//     next split hands it that much more (both threads then bring equal bytes from memory);
//   3 omp + tail: OpenMP regions, a thread done with its share loads the start of its next one while the other works.
// Build and run:  g++ -O3 -mavx512f -mfma -fopenmp -std=c++17 pass_overlap.cpp -o /tmp/pass_overlap
//                 for m in 0 1 2 3; do OMP_NUM_THREADS=2 /tmp/pass_overlap 307200 1048576 1 $m; done
// Arguments: KV bytes a layer's attention reads (307200: L=200), prefetch budget (bytes), gap scale, arm, layers (30).
#include <immintrin.h>
#include <omp.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
using clk = std::chrono::steady_clock;
static double now() { return std::chrono::duration<double>(clk::now().time_since_epoch()).count(); }

struct Region { const float* w; long bytes; };
static float sink_f;

// one-row product over [a, b) bytes of w: 16-float FMAs against a broadcast x (like K=1 panels)
static float gemv(const float* w, long a, long b) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0001f);
  const float* p = w + a / 4; const float* e = w + b / 4;
  for (; p + 64 <= e; p += 64) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(p), x, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(p + 16), x, acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(p + 32), x, acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(p + 48), x, acc3);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

static std::vector<char> kv;  // the serial part reads some "KV" like attention does
static void serial(double us, long kv_bytes) {
  double t0 = now();
  volatile float s = 0;
  if (kv_bytes) s += gemv(reinterpret_cast<const float*>(kv.data()), 0, kv_bytes);
  while ((now() - t0) * 1e6 < us) {}
  sink_f += s;
}

struct Pool {
  std::atomic<long> job{0};      // region index + 1 posted (the worker runs it once)
  std::atomic<long> done{0};     // last region the worker finished
  std::atomic<long> halt{0};     // main: stop prefetching after region `halt`
  std::atomic<long> ack{0};      // worker: prefetch after region `ack` stopped, tally published
  std::atomic<long> prefetched{0};
  std::atomic<bool> stop{false};
  const std::vector<Region>* regions = nullptr;
  std::vector<long> split;
  long cap = 0;
  std::thread th;
  void worker() {
    long seen = 0;
    while (!stop.load(std::memory_order_acquire)) {
      long j = job.load(std::memory_order_acquire);
      if (j == seen || j <= 0) { seen = j; _mm_pause(); continue; }
      seen = j;
      const Region& r = (*regions)[j - 1];
      sink_f += gemv(r.w, split[j - 1], r.bytes);
      long got = 0;
      if (cap > 0 && j < (long)regions->size()) {
        const Region& n = (*regions)[j];
        long start = n.bytes / 2 / 256 * 256;
        done.store(j, std::memory_order_release);
        while (got < cap && start + got < n.bytes && halt.load(std::memory_order_acquire) != j) {
          long step = std::min<long>(4096, n.bytes - start - got);
          sink_f += gemv(n.w, start + got, start + got + step);
          got += step;
        }
        while (halt.load(std::memory_order_acquire) != j) _mm_pause();
        prefetched.store(got, std::memory_order_relaxed);
        ack.store(j, std::memory_order_release);
      } else {
        prefetched.store(0, std::memory_order_relaxed);
        ack.store(j, std::memory_order_release);
        done.store(j, std::memory_order_release);
      }
    }
  }
};

int main(int argc, char** argv) {
  const long kvb = argc > 1 ? atol(argv[1]) : 307200;
  const long cap = argc > 2 ? atol(argv[2]) : 1 << 20;
  const int layers = argc > 5 ? atoi(argv[5]) : 30;
  const double gap_scale = argc > 3 ? atof(argv[3]) : 1.0;
  const long sizes[4] = {2211840, 1327104, 7077888, 3538944};  // qkv, o, gate+up, down (bytes, smollm2-135M f32)
  const double gaps[4] = {8, 30, 8, 6};  // us of serial work before each region (norm; rope+attention; add+norm; silu*mul)
  std::vector<std::vector<float>> store; std::vector<Region> regions;
  for (int l = 0; l < layers; ++l) for (int i = 0; i < 4; ++i) { store.emplace_back(sizes[i] / 4, 0.5f); }
  for (auto& s : store) regions.push_back({s.data(), (long)s.size() * 4});
  kv.assign(kvb * layers + 64, 1);
  omp_set_num_threads(2);
  auto pass_omp = [&]() {
    for (size_t r = 0; r < regions.size(); ++r) {
      serial(gaps[r % 4] * gap_scale, (r % 4 == 1) ? kvb : 0);
      const Region& g = regions[r];
      #pragma omp parallel num_threads(2)
      { int t = omp_get_thread_num(); long h = g.bytes / 2 / 256 * 256; sink_f += t == 0 ? gemv(g.w, 0, h) : gemv(g.w, h, g.bytes); }
    }
  };
  Pool pool; pool.regions = &regions; pool.split.assign(regions.size(), 0); pool.cap = cap;
  const int mode = argc > 4 ? atoi(argv[4]) : 0;  // 0: omp, 1: pool, 2: pool + prefetch
  if (mode == 1 || mode == 2) pool.th = std::thread([&] { pool.worker(); });
  auto run_pool = [&](long budget) {
    pool.cap = budget;
    for (size_t r = 0; r < regions.size(); ++r) {
      serial(gaps[r % 4] * gap_scale, (r % 4 == 1) ? kvb : 0);
      const Region& g = regions[r];
      long half = g.bytes / 2 / 256 * 256, pre = 0;
      if (r > 0 && budget > 0) {
        pool.halt.store((long)r, std::memory_order_release);
        while (pool.ack.load(std::memory_order_acquire) != (long)r) _mm_pause();
        pre = pool.prefetched.load(std::memory_order_relaxed);
      }
      long split = budget > 0 ? std::max(0L, (g.bytes - pre) / 2 / 256 * 256) : half;
      split = std::min(split, half);
      pool.split[r] = split;
      pool.job.store(r + 1, std::memory_order_release);
      sink_f += gemv(g.w, 0, split);
      while (pool.done.load(std::memory_order_acquire) != (long)r + 1) _mm_pause();
    }
    // the last region's worker: no prefetch (j == size) -> acked; reset for the next pass
    pool.job.store(0, std::memory_order_release);
    pool.done.store(0); pool.ack.store(0); pool.halt.store(0);
  };
  auto timed = [&](auto f) { double t = now(); f(); return (now() - t) * 1e3; };
  // mode 3: OpenMP regions; a thread done with its share loads the start of its next share while the other works,
  // and the next split evens the bytes each still has to bring from memory
  std::vector<long> pre0(regions.size() + 1, 0), pre1(regions.size() + 1, 0);
  auto pass_omp_pf = [&]() {
    std::fill(pre0.begin(), pre0.end(), 0); std::fill(pre1.begin(), pre1.end(), 0);
    for (size_t r = 0; r < regions.size(); ++r) {
      serial(gaps[r % 4] * gap_scale, (r % 4 == 1) ? kvb : 0);
      const Region& g = regions[r];
      const long half = g.bytes / 2 / 256 * 256;
      // main prefetched [0, p0), worker [half, half + p1): even the uncached bytes
      long split = (g.bytes + pre0[r] - pre1[r]) / 2 / 256 * 256;
      split = std::max(pre0[r], std::min(split, half + pre1[r]));
      std::atomic<int> finished{0};
      const Region* next = r + 1 < regions.size() ? &regions[r + 1] : nullptr;
      #pragma omp parallel num_threads(2)
      {
        int t = omp_get_thread_num();
        sink_f += t == 0 ? gemv(g.w, 0, split) : gemv(g.w, split, g.bytes);
        finished.fetch_add(1);
        if (next) {
          long start = t == 0 ? 0 : next->bytes / 2 / 256 * 256, got = 0;
          while (finished.load(std::memory_order_relaxed) < 2 && got < cap && start + got < next->bytes) {
            long step = std::min<long>(4096, next->bytes - start - got);
            sink_f += gemv(next->w, start + got, start + got + step);
            got += step;
          }
          (t == 0 ? pre0 : pre1)[r + 1] = got;
        }
      }
    }
  };
  auto one = [&] { if (mode == 3) { pass_omp_pf(); return; } if (mode == 0) pass_omp(); else run_pool(mode == 2 ? cap : 0); };
  for (int w = 0; w < 3; ++w) one();
  std::vector<double> a;
  for (int i = 0; i < 21; ++i) a.push_back(timed(one));
  std::sort(a.begin(), a.end());
  double bytes = 0; for (auto& r : regions) bytes += r.bytes;
  const char* names[4] = {"omp", "pool", "pool+prefetch", "omp+tail"};
  printf("kv %ld cap %ld gaps x%.1f  %.0f MB  %-14s min %.2f  median %.2f ms\n", kvb, cap, gap_scale, bytes / 1e6,
         names[mode], a[0], a[10]);
  if (mode == 1 || mode == 2) { pool.stop = true; pool.th.join(); }
  return (int)sink_f & 0;
}
