// RMSNorm in one call for the stream kernel's module (stream_linear.cpp binds it; specfamily.runtime.kernel builds both).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_isa.h"

namespace specfamily {

namespace {

constexpr int64_t kChains = 8;  // rows whose sums of squares advance together

// The sums of squares of `count` (<= kChains) rows of h floats, each summed in double in index order: one sequential
// chain a row, as a lone row sums it, so every row's sum is the same bits whatever rows it is normed with. The rows'
// chains advance together, element by element: a lone row's chain is bound by the latency of a double add (about
// four cycles an element); several rows' chains fill those cycles (here as scalar chains side by side; with AVX2,
// sums_avx2, as the lanes of two vectors), so a pass of five rows sums them in about the time of one.
template <int64_t N>
void sums_of_squares(const float* x, int64_t h, double* out) {
  double sum[N] = {};
  for (int64_t i = 0; i < h; ++i)
    for (int64_t r = 0; r < N; ++r) {
      const double v = x[r * h + i];
      sum[r] += v * v;  // v * v is exact in double: a fused multiply-add rounds the same sum
    }
  for (int64_t r = 0; r < N; ++r) out[r] = sum[r];
}

void sums_scalar(const float* x, int64_t h, int64_t count, double* out) {
  switch (count) {
    case 1: return sums_of_squares<1>(x, h, out);
    case 2: return sums_of_squares<2>(x, h, out);
    case 3: return sums_of_squares<3>(x, h, out);
    case 4: return sums_of_squares<4>(x, h, out);
    case 5: return sums_of_squares<5>(x, h, out);
    case 6: return sums_of_squares<6>(x, h, out);
    case 7: return sums_of_squares<7>(x, h, out);
    default: return sums_of_squares<kChains>(x, h, out);
  }
}

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2")
// The squares of 4 consecutive floats of 4 rows (rows[r] + i), in double, transposed: t[k] lane r = rows[r][i + k]^2.
inline void squares_4x4(const float* const* rows, int64_t i, __m256d t[4]) {
  __m256d s[4];
  for (int r = 0; r < 4; ++r) {
    const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(rows[r] + i));
    s[r] = _mm256_mul_pd(v, v);  // exact: a float's square fits a double
  }
  const __m256d a = _mm256_unpacklo_pd(s[0], s[1]), b = _mm256_unpackhi_pd(s[0], s[1]);
  const __m256d c = _mm256_unpacklo_pd(s[2], s[3]), d = _mm256_unpackhi_pd(s[2], s[3]);
  t[0] = _mm256_permute2f128_pd(a, c, 0x20);
  t[1] = _mm256_permute2f128_pd(b, d, 0x20);
  t[2] = _mm256_permute2f128_pd(a, c, 0x31);
  t[3] = _mm256_permute2f128_pd(b, d, 0x31);
}

// sums_scalar's sums with each row in a lane of two 4-double vectors: every lane adds its row's squares in index
// order (the same adds, the same bits); the two vectors' chains run side by side. Rows past `count` re-read the last
// row (their lanes are dropped).
void sums_avx2(const float* x, int64_t h, int64_t count, double* out) {
  const float* rows[kChains];
  for (int64_t r = 0; r < kChains; ++r) rows[r] = x + std::min(r, count - 1) * h;
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  const int64_t whole = h - h % 4;
  __m256d t[4], u[4];
  for (int64_t i = 0; i < whole; i += 4) {
    squares_4x4(rows, i, t);
    squares_4x4(rows + 4, i, u);
    for (int k = 0; k < 4; ++k) {
      low = _mm256_add_pd(low, t[k]);
      high = _mm256_add_pd(high, u[k]);
    }
  }
  double sums[kChains];
  _mm256_storeu_pd(sums, low);
  _mm256_storeu_pd(sums + 4, high);
  for (int64_t r = 0; r < count; ++r) {
    double sum = sums[r];
    for (int64_t i = whole; i < h; ++i) sum += static_cast<double>(rows[r][i]) * rows[r][i];
    out[r] = sum;
  }
}
#pragma GCC pop_options
#endif

void sums_of_squares(const float* x, int64_t h, int64_t count, double* out) {
#ifdef SF_X86_SIMD
  static const bool avx2 = specfamily::cpu_sets().avx2_fma;
  if (avx2 && count > 1) return sums_avx2(x, h, count, out);
#endif
  sums_scalar(x, h, count, out);
}

}  // namespace

// RMSNorm as the Llama families compute it, weight * (x * rsqrt(mean(x^2) + eps)), in one call instead of seven
// small ops (a decode step runs 61 of them on SmolLM2); the mean of squares is summed in double. Float32 CPU rows
// without autograd only; anything else takes the op-for-op path.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t h = x.dim() ? x.size(-1) : 0;
  const bool plain = x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
                     weight.dim() == 1 && weight.size(0) == h && h > 0 &&
                     !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()));
  if (!plain) {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
    return weight * normed.to(x.scalar_type());
  }
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const float *xp = xc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t rows = xc.numel() / h;
  double sums[kChains];
  for (int64_t first = 0; first < rows; first += kChains) {
    const int64_t count = std::min(kChains, rows - first);
    sums_of_squares(xp + first * h, h, count, sums);
    for (int64_t r = first; r < first + count; ++r) {
      const float* row = xp + r * h;
      const float scale = 1.0f / std::sqrt(static_cast<float>(sums[r - first] / h) + static_cast<float>(eps));
      for (int64_t i = 0; i < h; ++i) yp[r * h + i] = wp[i] * (row[i] * scale);
    }
  }
  return y;
}

}  // namespace specfamily
