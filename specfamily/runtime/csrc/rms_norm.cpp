// RMSNorm in one call for the stream kernel's module (stream_linear.cpp binds it; specfamily.runtime.kernel builds both).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace specfamily {

namespace {

constexpr int64_t kChains = 8;  // rows whose sums of squares advance together

// The sums of squares of `count` (<= kChains) rows of h floats, each summed in double in index order: one sequential
// chain a row, as a lone row sums it, so every row's sum is the same bits whatever rows it is normed with. The rows'
// chains advance together, element by element: a lone row's chain is bound by the latency of a double add (about
// four cycles an element); several rows' independent chains fill those cycles, so a pass of five rows sums them in
// about the time of one (a drafted pass's norms cost a plain pass's).
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

void sums_of_squares(const float* x, int64_t h, int64_t count, double* out) {
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
