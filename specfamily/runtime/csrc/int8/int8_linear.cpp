// Int8 weight-only products y = (x Q^T) * s + b for a few rows of float32 x (specfamily.runtime.int8_matmul builds
// this).
//
// An 8-bit draft's step is a few rows times every weight matrix, and its time is the time it takes to read the
// weights: int8 weights are a quarter of float32's bytes. Q is the weight quantized per output row (symmetric, int8,
// scale s), packed as the stream kernel packs float weights: panels of 16 output rows stored input-major,
// (ceil(n / 16), d, 16), zero-padded past n, so one 16-byte line of a panel holds input t's weight for 16 outputs.
// Each line is widened int8 -> int32 -> float in registers and feeds one FMA per row of x (x[j][t] broadcast); the
// 16 outputs of every row accumulate in float32 registers, several panels at once (independent FMA chains), and are
// scaled once at the end: y[j][c] = s[c] * sum_t Q[t][c] x[j][t] + b[c]. Activations stay float32 (no activation
// quantization). Each thread takes a range of panels; rows go 16 at a time. The instruction set is chosen at run
// time: AVX2 + FMA, AVX-512F (GCC's target pragmas, the file builds with baseline flags), or a scalar loop; an
// AVX-512 VNNI path (activations rounded to 16-bit integers per row) runs when asked for by name.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../cpu_isa.h"

namespace {

constexpr int64_t kMaxRows = 16;          // rows of x one call of the panels multiplies
constexpr int64_t kPanel = 16;            // output rows per packed panel
constexpr int64_t kGrainBytes = 1 << 16;  // packed bytes per thread at least (smaller products run serially)

struct Problem {
  const float* x;   // (k, d) contiguous
  const int8_t* w;  // (panels, d, kPanel) packed
  const float* s;   // (n,) per-output scales
  const int32_t* wsum;  // (n,) sum_t Q[t][c] (the VNNI path's offset)
  const float* b;   // (n,) or nullptr
  float* y;         // (k, n)
  int64_t k, d, n;
};

using PanelsFn = void (*)(const Problem&, int64_t, int64_t);

// Panels [q0, q1) for every row of x.
void scalar_panels(const Problem& p, int64_t q0, int64_t q1) {
  float acc[kMaxRows][kPanel];
  for (int64_t q = q0; q < q1; ++q) {
    const int8_t* w = p.w + q * p.d * kPanel;
    for (int64_t j = 0; j < p.k; ++j) std::fill(acc[j], acc[j] + kPanel, 0.0f);
    for (int64_t t = 0; t < p.d; ++t)
      for (int64_t j = 0; j < p.k; ++j) {
        const float xt = p.x[j * p.d + t];
        for (int64_t c = 0; c < kPanel; ++c) acc[j][c] += static_cast<float>(w[t * kPanel + c]) * xt;
      }
    const int64_t col = q * kPanel, cols = std::min(kPanel, p.n - col);
    for (int64_t j = 0; j < p.k; ++j)
      for (int64_t c = 0; c < cols; ++c)
        p.y[j * p.n + col + c] = acc[j][c] * p.s[col + c] + (p.b ? p.b[col + c] : 0.0f);
  }
}

#ifdef SF_X86_SIMD

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace avx2 {

// The first `count` (0..8) lanes set.
inline __m256i lanes(int64_t count) {
  static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - std::clamp<int64_t>(count, 0, 8)));
}

// 8 int8 weights at `w` as 8 floats.
inline __m256 widen(const int8_t* w) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}

// Panels [q, q + P) times rows [j0, j0 + K): each 16-lane panel line as two 8-lane halves, 2 P K accumulators.
template <int P, int K>
void block(const Problem& p, int64_t q, int64_t j0) {
  __m256 acc[P][2][K];
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) acc[r][0][j] = acc[r][1][j] = _mm256_setzero_ps();
  const int64_t stride = p.d * kPanel;
  const int8_t* w = p.w + q * stride;
  const float* x = p.x + j0 * p.d;
  for (int64_t t = 0; t < p.d; ++t) {
#pragma GCC unroll 16
    for (int r = 0; r < P; ++r) {
      const int8_t* line = w + r * stride + t * kPanel;
      const __m256 lo = widen(line), hi = widen(line + 8);
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j) {
        const __m256 xt = _mm256_broadcast_ss(x + j * p.d + t);
        acc[r][0][j] = _mm256_fmadd_ps(lo, xt, acc[r][0][j]);
        acc[r][1][j] = _mm256_fmadd_ps(hi, xt, acc[r][1][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r) {
    const int64_t col = (q + r) * kPanel, cols = std::min(kPanel, p.n - col);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i mask = lanes(cols - 8 * h);
      const __m256 scale = _mm256_maskload_ps(p.s + col + 8 * h, mask);
      const __m256 bias = p.b ? _mm256_maskload_ps(p.b + col + 8 * h, mask) : _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j)
        _mm256_maskstore_ps(p.y + (j0 + j) * p.n + col + 8 * h, mask, _mm256_fmadd_ps(acc[r][h][j], scale, bias));
    }
  }
}

// Panels [q0, q1) for rows [j0, j0 + K), P panels at a time (enough independent FMA chains at one or two rows).
template <int K>
void rows_of(const Problem& p, int64_t q0, int64_t q1, int64_t j0) {
  constexpr int P = K == 1 ? 4 : (K == 2 ? 3 : (K == 3 ? 2 : 1));
  int64_t q = q0;
  for (; q + P <= q1; q += P) block<P, K>(p, q, j0);
  for (; q < q1; ++q) block<1, K>(p, q, j0);
}

void panels(const Problem& p, int64_t q0, int64_t q1) {
  for (int64_t j = 0; j < p.k; j += 6) {
    switch (std::min<int64_t>(6, p.k - j)) {
      case 1: rows_of<1>(p, q0, q1, j); break;
      case 2: rows_of<2>(p, q0, q1, j); break;
      case 3: rows_of<3>(p, q0, q1, j); break;
      case 4: rows_of<4>(p, q0, q1, j); break;
      case 5: rows_of<5>(p, q0, q1, j); break;
      default: rows_of<6>(p, q0, q1, j); break;
    }
  }
}

}  // namespace avx2

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")

namespace avx512 {

// Panels [q, q + P) times rows [j0, j0 + K): one 16-lane register per panel line, P K accumulators.
template <int P, int K>
void block(const Problem& p, int64_t q, int64_t j0) {
  __m512 acc[P][K];
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t stride = p.d * kPanel;
  const int8_t* w = p.w + q * stride;
  const float* x = p.x + j0 * p.d;
  for (int64_t t = 0; t < p.d; ++t) {
    __m512 wv[P];
#pragma GCC unroll 16
    for (int r = 0; r < P; ++r)
      wv[r] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * stride + t * kPanel))));
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      const __m512 xt = _mm512_set1_ps(x[j * p.d + t]);
#pragma GCC unroll 16
      for (int r = 0; r < P; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xt, acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r) {
    const int64_t col = (q + r) * kPanel, cols = std::min(kPanel, p.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const __m512 scale = _mm512_maskz_loadu_ps(mask, p.s + col);
    const __m512 bias = p.b ? _mm512_maskz_loadu_ps(mask, p.b + col) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j)
      _mm512_mask_storeu_ps(p.y + (j0 + j) * p.n + col, mask, _mm512_fmadd_ps(acc[r][j], scale, bias));
  }
}

// Panels [q0, q1) for rows [j0, j0 + K), P panels at a time: P K accumulators stay at most 24 of 32 registers.
template <int K>
void rows_of(const Problem& p, int64_t q0, int64_t q1, int64_t j0) {
  constexpr int P = K <= 2 ? 4 : (K <= 4 ? 3 : (K <= 8 ? 2 : 1));
  int64_t q = q0;
  for (; q + P <= q1; q += P) block<P, K>(p, q, j0);
  for (; q < q1; ++q) block<1, K>(p, q, j0);
}

void panels(const Problem& p, int64_t q0, int64_t q1) {
  switch (p.k) {
    case 1: return rows_of<1>(p, q0, q1, 0);
    case 2: return rows_of<2>(p, q0, q1, 0);
    case 3: return rows_of<3>(p, q0, q1, 0);
    case 4: return rows_of<4>(p, q0, q1, 0);
    case 5: return rows_of<5>(p, q0, q1, 0);
    case 6: return rows_of<6>(p, q0, q1, 0);
    case 7: return rows_of<7>(p, q0, q1, 0);
    case 8: return rows_of<8>(p, q0, q1, 0);
    default:  // 9..16 rows: two blocks of rows over the same panels (the second pass finds them in cache or not)
      rows_of<8>(p, q0, q1, 0);
      switch (p.k - 8) {
        case 1: return rows_of<1>(p, q0, q1, 8);
        case 2: return rows_of<2>(p, q0, q1, 8);
        case 3: return rows_of<3>(p, q0, q1, 8);
        case 4: return rows_of<4>(p, q0, q1, 8);
        case 5: return rows_of<5>(p, q0, q1, 8);
        case 6: return rows_of<6>(p, q0, q1, 8);
        case 7: return rows_of<7>(p, q0, q1, 8);
        default: return rows_of<8>(p, q0, q1, 8);
      }
  }
}

}  // namespace avx512

#pragma GCC pop_options


#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma")

namespace vnni {
#include "int8_vnni.h"  // Rows, split_rows, block, rows_of, panels
}  // namespace vnni

#pragma GCC pop_options

#endif  // SF_X86_SIMD

// The instruction sets this CPU runs, best first (always ending with "scalar"). The widening (int8 -> int32 ->
// float) is the bound, not the loads: where both ran (one thread, SmolLM2's head shapes) AVX2 was faster than AVX-512
// from 4 rows and AVX-512 about a tenth faster at 1-2 (best_isa_for); VNNI (16-bit activations) was no faster at the
// memory-bound head, so it is last of the vector paths and runs only when asked for by name.
std::vector<std::string> supported_isas() {
  std::vector<std::string> isas;
  const specfamily::CpuSets cpu = specfamily::cpu_sets();
  if (cpu.avx2_fma) isas.push_back("avx2");
  if (cpu.avx512f) isas.push_back("avx512");
  if (cpu.vnni) isas.push_back("vnni");
  isas.push_back("scalar");
  return isas;
}

PanelsFn panels_for(const std::string& isa) {
  const auto isas = supported_isas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "int8_linear: instruction set '", isa,
              "' is not supported on this CPU (supported: ", c10::Join(", ", isas), ")");
#ifdef SF_X86_SIMD
  if (isa == "vnni") return vnni::panels;
  if (isa == "avx512") return avx512::panels;
  if (isa == "avx2") return avx2::panels;
#endif
  return scalar_panels;
}

const std::string& best_isa() {
  static const std::string isa = supported_isas().front();
  return isa;
}

// The path linear takes for k rows: best_isa, or AVX-512 at 1-2 rows where both it and AVX2 run.
const std::string& best_isa_for(int64_t k) {
  static const std::string avx512 = "avx512";
  static const bool both = best_isa() == "avx2" && supported_isas()[1] == avx512;
  return both && k <= 2 ? avx512 : best_isa();
}

void check_inputs(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& sums,
                  int64_t n, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(sums.scalar_type() == at::kInt && sums.device().is_cpu() && sums.numel() == n && sums.is_contiguous(),
              "int8_linear: sums must be contiguous int32 on the CPU with ", n, " elements, got ", sums.scalar_type(),
              " of shape ", sums.sizes());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.scalar_type() == at::kChar &&
                  packed.device().is_cpu() && packed.is_contiguous(),
              "int8_linear: packed must be contiguous int8 panels (panels, d, ", kPanel, ") on the CPU, got ",
              packed.scalar_type(), " of shape ", packed.sizes());
  TORCH_CHECK(n > (packed.size(0) - 1) * kPanel && n <= packed.size(0) * kPanel, "int8_linear: ", packed.size(0),
              " panels cannot hold ", n, " outputs");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == packed.size(1) && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "int8_linear: x must be float32 on the CPU with ", packed.size(1), " features last, got ",
              x.scalar_type(), " of shape ", x.sizes());
  for (const at::Tensor* t : {&scales, bias.has_value() && bias->defined() ? &*bias : &scales}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->numel() == n,
                "int8_linear: scales and bias must be float32 on the CPU with ", n, " elements, got ",
                t->scalar_type(), " of shape ", t->sizes());
  }
}

at::Tensor linear_with(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& sums,
                       int64_t n, const c10::optional<at::Tensor>& bias, const std::string& isa) {
  check_inputs(x, packed, scales, sums, n, bias);
  const PanelsFn panels = panels_for(isa);
  const int64_t d = packed.size(1), total = packed.size(0);
  const int64_t k = d ? x.numel() / d : 0;
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  if (k == 0 || n == 0) return y;
  if (d == 0) return y.zero_().add_(bias.has_value() && bias->defined() ? *bias : at::zeros({n}, x.options()));
  const at::Tensor xc = x.contiguous(), sc = scales.contiguous();
  at::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->contiguous();
  const float *xp = xc.data_ptr<float>(), *sp = sc.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const int8_t* wp = packed.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / (kPanel * d));
  at::parallel_for(0, total, grain, [&](int64_t q0, int64_t q1) {
    for (int64_t r0 = 0; r0 < k; r0 += kMaxRows) {
      const Problem p{xp + r0 * d, wp, sp, sums.data_ptr<int32_t>(), bp, yp + r0 * n, std::min(kMaxRows, k - r0), d, n};
      panels(p, q0, q1);
    }
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& sums,
                  int64_t n, const c10::optional<at::Tensor>& bias) {
  const int64_t d = packed.dim() == 3 ? packed.size(1) : 0;
  return linear_with(x, packed, scales, sums, n, bias, best_isa_for(d ? x.numel() / d : 0));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Int8 weight-only products y = (x Q^T) * scales + bias, float32 x (specfamily.runtime.int8_matmul)";
  m.def("linear", &linear, "x @ (Q * scales)^T + bias from packed int8 panels, any number of rows", py::arg("x"),
        py::arg("packed"), py::arg("scales"), py::arg("sums"), py::arg("n"), py::arg("bias") = py::none());
  m.def("linear_with", &linear_with, "linear on a named instruction set (tests)", py::arg("x"), py::arg("packed"),
        py::arg("scales"), py::arg("sums"), py::arg("n"), py::arg("bias"), py::arg("isa"));
  m.def("isa", &best_isa, "the instruction set linear uses on this CPU (past 2 rows)");
  m.def("isa_for", &best_isa_for, "the instruction set linear uses for k rows", py::arg("k"));
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  m.attr("PANEL") = kPanel;
  m.attr("ROWS_PER_BLOCK") = kMaxRows;
}
