// Streaming few-row float32 products y = x W^T + b for 1..16 rows of x (specfamily.core.kernel builds this).
//
// A decode step or a verify pass multiplies a few rows by every weight matrix; the time is the time it takes to
// read the weights. Each thread takes a range of output rows (weight rows); a block of R weight rows is read once
// and multiplied by up to K rows of x at a time, the R x K dot products held in vector registers (x is small and
// stays in cache; a second K-block re-reads the weight block from L1, not from memory). The instruction set is
// chosen at run time: AVX-512F, AVX2 + FMA (GCC's target pragmas, so the file builds with baseline flags), or a
// portable scalar loop. Sums run in another float32 order than BLAS: results equal F.linear up to rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__) && !defined(__clang__)
#define SF_X86_SIMD 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kMaxRows = 16;     // more rows of x go to at::linear
constexpr int64_t kKBlock = 6;       // rows of x per register block
constexpr int64_t kGrainFloats = 1 << 15;  // weight elements per thread at least (smaller products run serially)

struct Problem {
  const float* x;  // (k, d) contiguous
  const float* w;  // (n, d) contiguous
  const float* b;  // (n,) or nullptr
  float* y;        // (k, n)
  int64_t k, d, n;
};

using RowsFn = void (*)(const Problem&, int64_t, int64_t);

// Output columns [n0, n1) for every row of x: one weight row at a time, k dot products.
void scalar_rows(const Problem& p, int64_t n0, int64_t n1) {
  float acc[kMaxRows];
  for (int64_t n = n0; n < n1; ++n) {
    const float* w = p.w + n * p.d;
    std::fill(acc, acc + p.k, 0.0f);
    for (int64_t t = 0; t < p.d; ++t) {
      const float wt = w[t];
      for (int64_t j = 0; j < p.k; ++j) acc[j] += wt * p.x[j * p.d + t];
    }
    const float bias = p.b ? p.b[n] : 0.0f;
    for (int64_t j = 0; j < p.k; ++j) p.y[j * p.n + n] = acc[j] + bias;
  }
}

// The k rows of x split into ceil(k / kKBlock) blocks of near-equal size.
inline int64_t k_block(int64_t k) {
  const int64_t blocks = (k + kKBlock - 1) / kKBlock;
  return (k + blocks - 1) / blocks;
}

#ifdef SF_X86_SIMD

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [t, t + 8) of rows [0, R) of w and [0, K) of x into acc; masked (the last, partial vector) or not.
template <int R, int K, bool Masked>
inline void step(__m256 (&acc)[R][K], const float* w, const float* x, int64_t d, int64_t t, __m256i mask) {
  __m256 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = Masked ? _mm256_maskload_ps(w + r * d + t, mask) : _mm256_loadu_ps(w + r * d + t);
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) {
    const __m256 xv = Masked ? _mm256_maskload_ps(x + j * d + t, mask) : _mm256_loadu_ps(x + j * d + t);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(wv[r], xv, acc[r][j]);
  }
}

// Rows [n0, n0 + R) of W times rows [j0, j0 + K) of x.
template <int R, int K>
void block(const Problem& p, int64_t n0, int64_t j0) {
  static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  __m256 acc[R][K];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) acc[r][j] = _mm256_setzero_ps();
  const float* w = p.w + n0 * p.d;
  const float* x = p.x + j0 * p.d;
  const __m256i all = _mm256_set1_epi32(-1);
  int64_t t = 0;
  for (; t + 8 <= p.d; t += 8) step<R, K, false>(acc, w, x, p.d, t, all);
  if (t < p.d) {
    const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 - (p.d - t)));
    step<R, K, true>(acc, w, x, p.d, t, mask);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {  // unrolled: constant indices keep acc in registers (no stores in the loop)
    const float bias = p.b ? p.b[n0 + r] : 0.0f;
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) p.y[(j0 + j) * p.n + n0 + r] = hsum(acc[r][j]) + bias;
  }
}

template <int R>
void rows_of(const Problem& p, int64_t n0, int64_t j0, int64_t kb) {
  switch (kb) {
    case 1: return block<R, 1>(p, n0, j0);
    case 2: return block<R, 2>(p, n0, j0);
    case 3: return block<R, 3>(p, n0, j0);
    case 4: return block<R, 4>(p, n0, j0);
    case 5: return block<R, 5>(p, n0, j0);
    default: return block<R, 6>(p, n0, j0);
  }
}

// 16 registers: 4 weight rows by up to 2 rows of x, else 2 weight rows by up to 6.
void rows(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t kb = p.k <= 2 ? p.k : k_block(p.k);
  const int64_t r_block = p.k <= 2 ? 4 : 2;
  int64_t n = n0;
  for (; n + r_block <= n1; n += r_block)
    for (int64_t j = 0; j < p.k; j += kb) {
      const int64_t size = std::min(kb, p.k - j);
      if (r_block == 4) rows_of<4>(p, n, j, size); else rows_of<2>(p, n, j, size);
    }
  for (; n < n1; ++n)
    for (int64_t j = 0; j < p.k; j += kb) rows_of<1>(p, n, j, std::min(kb, p.k - j));
}

}  // namespace avx2

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")

namespace avx512 {

inline __m256 halves(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// The four vectors' lane sums, in order.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(halves(a), halves(b)), _mm256_hadd_ps(halves(c), halves(d)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Lanes [t, t + 16) of rows [0, R) of w and [0, K) of x into acc, under a lane mask (all set but at the end).
template <int R, int K>
inline void step(__m512 (&acc)[R][K], const float* w, const float* x, int64_t d, int64_t t, __mmask16 mask) {
  __m512 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_ps(mask, w + r * d + t);
#pragma GCC unroll 8
  for (int j = 0; j < K; ++j) {
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + j * d + t);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
  }
}

// Rows [n0, n0 + R) of W times rows [j0, j0 + K) of x; the last partial vector by masked loads.
template <int R, int K>
void block(const Problem& p, int64_t n0, int64_t j0) {
  __m512 acc[R][K];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) acc[r][j] = _mm512_setzero_ps();
  const float* w = p.w + n0 * p.d;
  const float* x = p.x + j0 * p.d;
  int64_t t = 0;
  for (; t + 16 <= p.d; t += 16) step<R, K>(acc, w, x, p.d, t, static_cast<__mmask16>(0xFFFF));
  if (t < p.d) step<R, K>(acc, w, x, p.d, t, static_cast<__mmask16>((1u << (p.d - t)) - 1));
  if constexpr (R == 4) {  // 4 sums at once into 4 adjacent outputs (3 horizontal adds instead of 4 reductions)
    const __m128 bias = p.b ? _mm_loadu_ps(p.b + n0) : _mm_setzero_ps();
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j)
      _mm_storeu_ps(p.y + (j0 + j) * p.n + n0,
                    _mm_add_ps(sum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]), bias));
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {  // unrolled: constant indices keep acc in registers (no stores in the loop)
      const float bias = p.b ? p.b[n0 + r] : 0.0f;
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) p.y[(j0 + j) * p.n + n0 + r] = _mm512_reduce_add_ps(acc[r][j]) + bias;
    }
  }
}

template <int R>
void rows_of(const Problem& p, int64_t n0, int64_t j0, int64_t kb) {
  switch (kb) {
    case 1: return block<R, 1>(p, n0, j0);
    case 2: return block<R, 2>(p, n0, j0);
    case 3: return block<R, 3>(p, n0, j0);
    case 4: return block<R, 4>(p, n0, j0);
    case 5: return block<R, 5>(p, n0, j0);
    default: return block<R, 6>(p, n0, j0);
  }
}

// 32 registers: 4 weight rows by up to 6 rows of x (24 accumulators).
void rows(const Problem& p, int64_t n0, int64_t n1) {
  const int64_t kb = k_block(p.k);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    for (int64_t j = 0; j < p.k; j += kb) rows_of<4>(p, n, j, std::min(kb, p.k - j));
  for (; n < n1; ++n)
    for (int64_t j = 0; j < p.k; j += kb) rows_of<1>(p, n, j, std::min(kb, p.k - j));
}

}  // namespace avx512

#pragma GCC pop_options

#endif  // SF_X86_SIMD

// The instruction sets this CPU runs, best first (always ending with "scalar").
std::vector<std::string> supported_isas() {
  std::vector<std::string> isas;
#ifdef SF_X86_SIMD
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) isas.push_back("avx512");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back("avx2");
#endif
  isas.push_back("scalar");
  return isas;
}

RowsFn rows_for(const std::string& isa) {
  const auto isas = supported_isas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "stream_linear: instruction set '", isa,
              "' is not supported on this CPU (supported: ", c10::Join(", ", isas), ")");
#ifdef SF_X86_SIMD
  if (isa == "avx512") return avx512::rows;
  if (isa == "avx2") return avx2::rows;
#endif
  return scalar_rows;
}

const std::string& best_isa() {
  static const std::string isa = supported_isas().front();
  return isa;
}

void check_inputs(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2, "stream_linear: weight must be 2-D (out, in), got ", weight.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "stream_linear: x's last dimension must be the weight's ",
              weight.size(1), " input features, got x of shape ", x.sizes());
  for (const at::Tensor* t : {&x, &weight}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat,
                "stream_linear multiplies float32 tensors on the CPU, got ", t->scalar_type(), " on ", t->device());
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->numel() == weight.size(0),
                "stream_linear: bias must be float32 on the CPU with ", weight.size(0), " elements, got ",
                bias->scalar_type(), " of shape ", bias->sizes(), " on ", bias->device());
  }
}

at::Tensor linear_with(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       const std::string& isa) {
  check_inputs(x, weight, bias);
  const int64_t d = weight.size(1), n = weight.size(0);
  const int64_t k = d ? x.numel() / d : 0;
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (k == 0 || k > kMaxRows || n == 0 || grad || !weight.is_contiguous()) return at::linear(x, weight, bias);
  const RowsFn rows = rows_for(isa);
  const at::Tensor xc = x.contiguous();
  at::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  const Problem p{xc.data_ptr<float>(), weight.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr,
                  y.data_ptr<float>(), k, d, n};
  const int64_t blocks = (n + 3) / 4;  // threads split the output over blocks of 4 weight rows
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / (4 * std::max<int64_t>(d, 1)));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) { rows(p, 4 * b0, std::min(4 * b1, n)); });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  return linear_with(x, weight, bias, best_isa());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Streaming few-row float32 products y = x W^T + b (specfamily.core.kernel)";
  m.def("linear", &linear, "x @ weight^T + bias, x of 1..16 rows (more go to at::linear)", py::arg("x"),
        py::arg("weight"), py::arg("bias") = py::none());
  m.def("linear_with", &linear_with, "linear on a named instruction set (tests)", py::arg("x"), py::arg("weight"),
        py::arg("bias"), py::arg("isa"));
  m.def("isa", &best_isa, "the instruction set linear uses on this CPU");
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  m.attr("MAX_ROWS") = kMaxRows;
}
