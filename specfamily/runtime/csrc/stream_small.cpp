// The stream kernel's scalar and AVX2 panel loops (stream_linear.cpp's header says what a panel is and why).

#include <algorithm>
#include <cstdint>

#include "stream_panels.h"

namespace specfamily::stream {

// Panels [q0, q1) for every row of x.
void scalar_panels(const Problem& p, int64_t q0, int64_t q1) {
  float acc[kMaxRows][kPanel];
  for (int64_t q = q0; q < q1; ++q) {
    const float* w = p.w + q * p.d * kPanel;
    for (int64_t j = 0; j < p.k; ++j) std::fill(acc[j], acc[j] + kPanel, 0.0f);
    for (int64_t t = 0; t < p.d; ++t)
      for (int64_t j = 0; j < p.k; ++j) {
        const float xt = p.x[j * p.d + t];
        for (int64_t c = 0; c < kPanel; ++c) acc[j][c] += w[t * kPanel + c] * xt;
      }
    const int64_t cols = std::min(kPanel, p.n - q * kPanel);
    for (int64_t j = 0; j < p.k; ++j)
      for (int64_t c = 0; c < cols; ++c) p.y[j * p.n + q * kPanel + c] = acc[j][c] + (p.b ? p.b[q * kPanel + c] : 0.0f);
  }
}

#ifdef SF_X86_SIMD

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace avx2 {

constexpr int kRowBlock = 6;  // 2 halves x 6 rows = 12 accumulators of 16 registers

// The first `count` (0..8) lanes set.
inline __m256i lanes(int64_t count) {
  static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - std::clamp<int64_t>(count, 0, 8)));
}

// Panel q times rows [j0, j0 + K) of x: each 16-lane panel row as two 8-lane halves.
template <int K>
void block(const Problem& p, int64_t q, int64_t j0) {
  __m256 acc[2][K];
#pragma GCC unroll 16
  for (int j = 0; j < K; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
  const float* w = p.w + q * p.d * kPanel;
  const float* x = p.x + j0 * p.d;
  for (int64_t t = 0; t < p.d; ++t) {
    const __m256 lo = _mm256_loadu_ps(w + t * kPanel), hi = _mm256_loadu_ps(w + t * kPanel + 8);
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      const __m256 xt = _mm256_broadcast_ss(x + j * p.d + t);
      acc[0][j] = _mm256_fmadd_ps(lo, xt, acc[0][j]);
      acc[1][j] = _mm256_fmadd_ps(hi, xt, acc[1][j]);
    }
  }
  const int64_t col = q * kPanel, cols = std::min(kPanel, p.n - col);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m256i mask = lanes(cols - 8 * h);
    const __m256 bias = p.b ? _mm256_maskload_ps(p.b + col + 8 * h, mask) : _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j)
      _mm256_maskstore_ps(p.y + (j0 + j) * p.n + col + 8 * h, mask, _mm256_add_ps(acc[h][j], bias));
  }
}

void panels(const Problem& p, int64_t q0, int64_t q1) {
  for (int64_t q = q0; q < q1; ++q)
    for (int64_t j = 0; j < p.k; j += kRowBlock) {
      switch (std::min<int64_t>(kRowBlock, p.k - j)) {
        case 1: block<1>(p, q, j); break;
        case 2: block<2>(p, q, j); break;
        case 3: block<3>(p, q, j); break;
        case 4: block<4>(p, q, j); break;
        case 5: block<5>(p, q, j); break;
        default: block<6>(p, q, j); break;
      }
    }
}

}  // namespace avx2

#pragma GCC pop_options

#endif  // SF_X86_SIMD

}  // namespace specfamily::stream
