// RMSNorm in one call for the stream kernel's module (stream_linear.cpp binds it; specfamily.runtime.kernel builds both).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstdint>

namespace specfamily {

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
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = xp + r * h;
    double sum = 0.0;
    for (int64_t i = 0; i < h; ++i) sum += static_cast<double>(row[i]) * row[i];
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / h) + static_cast<float>(eps));
    for (int64_t i = 0; i < h; ++i) yp[r * h + i] = wp[i] * (row[i] * scale);
  }
  return y;
}

}  // namespace specfamily
