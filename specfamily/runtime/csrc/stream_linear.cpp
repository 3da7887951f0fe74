// Streaming float32 products y = x W^T + b, any number of rows of x (specfamily.runtime.kernel builds this).
//
// A decode step or a verify pass multiplies a few rows by every weight matrix; the time is the time it takes to
// read the weights. At 8-16 rows a kernel that takes dot products of weight rows with x rows runs out of loads and
// registers before it runs out of memory bandwidth, so the weight is multiplied in a packed layout instead, made
// once per weight on first use and kept beside it (packed_for): panels of 16 output rows, stored input-major,
// (ceil(n / 16), d, 16), zero-padded past n. One 16-lane load of a panel feeds one FMA per row of x (x[j][t]
// broadcast), the 16 outputs of every row of x accumulate in registers (no horizontal sums), each panel is one
// sequential stream read once per call, and x (16 x d floats at a time) stays in L1/L2. Each thread takes a range of
// panels; past 16 rows, chunks of them stay in L2 while each block of 16 rows passes. The instruction set is chosen
// at run time: AVX-512F, AVX2 + FMA (GCC's target pragmas, so the file builds with baseline flags), or a scalar loop.
//
// Batch invariance: on every path and for every number of rows (no BLAS past some count), each output is one chain
// acc = w[t] * x[t] + acc over t = 0..d-1 from zero, then + bias: a row's bits do not depend on the rows multiplied
// with it nor on its place among them (per instruction set: AVX-512 and AVX2 fuse the multiply-add, the scalar loop
// may round twice). Sums run in another float32 order than BLAS: results equal F.linear up to rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_isa.h"
#include "pass_marks.h"
#include "stream_pack.h"
#include "stream_panels.h"

namespace {

constexpr int64_t kChunkBytes = 192 << 10;  // past kMaxRows rows: packed bytes each block of rows reuses in L2
constexpr int64_t kMinChunk = 2;           // panels per chunk at least
constexpr int64_t kGrainFloats = 1 << 15;  // weight elements per thread at least (smaller products run serially)
using specfamily::stream::kPackedAttr;
using specfamily::stream::kPanel;
using specfamily::stream::pack;
using specfamily::stream::packed_of;
using specfamily::stream::Weight;
using specfamily::stream::kMaxRows;
using specfamily::stream::PanelsFn;
using specfamily::stream::Problem;
using specfamily::stream::scalar_panels;

#ifdef SF_X86_SIMD

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")

namespace avx512 {

// Panels [q, q + P) times all K rows of x: P x K accumulators (at most 24 of 32 registers), P loads per input, each
// panel's line Ahead inputs on prefetched (0: none). Span: inputs [t0, t1) only, the accumulators taken from `kept`
// and, unless t1 is the last input, put back there (the outputs written after the last span).
template <int P, int K, int Ahead, bool Span = false>
void block(const Problem& p, int64_t q, int64_t t0 = 0, int64_t t1 = 0, __m512* kept = nullptr) {
  __m512 acc[P][K];
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) acc[r][j] = Span ? kept[r * K + j] : _mm512_setzero_ps();
  const int64_t stride = p.d * kPanel, end = Span ? t1 : p.d;
  const float* w = p.w + q * stride;
  for (int64_t t = Span ? t0 : 0; t < end; ++t) {
    __m512 wv[P];
#pragma GCC unroll 16
    for (int r = 0; r < P; ++r) {
      const float* line = w + r * stride + t * kPanel;  // one 64-byte line: 16 outputs' weights for input t
      if constexpr (Ahead > 0) _mm_prefetch(reinterpret_cast<const char*>(line + Ahead * kPanel), _MM_HINT_T0);
      wv[r] = _mm512_loadu_ps(line);
      // At 2-3 rows, in a register, loaded once: GCC would otherwise fold the load into each of the line's K FMAs
      // (K loads of one line, seen in the disassembly), and the load ports would set the pace. Elsewhere GCC's own
      // choice measured as fast or faster (1 row: one FMA per line; 4 rows on: registers; docs/bandwidth-smollm2.md).
      if constexpr (K == 2 || K == 3) asm("" : "+v"(wv[r]));
    }
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      const __m512 xt = _mm512_set1_ps(p.x[j * p.d + t]);
#pragma GCC unroll 16
      for (int r = 0; r < P; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xt, acc[r][j]);
    }
  }
  if (Span && end < p.d) {
#pragma GCC unroll 16
    for (int r = 0; r < P; ++r)
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j) kept[r * K + j] = acc[r][j];
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < P; ++r) {
    const int64_t col = (q + r) * kPanel, cols = std::min(kPanel, p.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const __m512 bias = p.b ? _mm512_maskz_loadu_ps(mask, p.b + col) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) _mm512_mask_storeu_ps(p.y + j * p.n + col, mask, _mm512_add_ps(acc[r][j], bias));
  }
}

// Panels [q0, q1) in groups of P (the last ones alone): 4 panels at once up to 6 rows (4 x 6: 24 accumulators), 3
// up to 8 (4 x 8 would spill); each weight load and x broadcast feeds more FMAs the more panels go at once. From 2
// rows on the FMAs hold up each line's load, and the more rows, the further ahead the next lines are fetched (what
// the choices gained and cost where they were measured: docs/bandwidth-smollm2.md).
template <int K>
void panels_of(const Problem& p, int64_t q0, int64_t q1) {
  constexpr int P = K <= 6 ? 4 : 3;
  constexpr int Ahead = K <= 1 ? 0 : (K <= 4 ? 16 : 32);  // inputs (64-byte lines of each panel) fetched ahead
  int64_t q = q0;
  for (; q + P <= q1; q += P) block<P, K, Ahead>(p, q);
  for (; q < q1; ++q) block<1, K, Ahead>(p, q);
}

// Panels [q, q + P) times rows a (KA of them) and b (KB): the two blocks take turns over spans of kSpan inputs, the
// accumulators kept in memory between turns (each output still one FMA chain over the inputs in order), so the
// second reads each span's lines (P x 4 KB) from L1 just after the first brought them in; while it does, it fetches
// the first block's next span.
template <int P, int KA, int KB>
void group(const Problem& a, const Problem& b, int64_t q) {
  constexpr int64_t kSpan = 64;
  __m512 kept_a[P * KA], kept_b[P * KB];
  for (auto& v : kept_a) v = _mm512_setzero_ps();
  for (auto& v : kept_b) v = _mm512_setzero_ps();
  for (int64_t t0 = 0; t0 < a.d; t0 += kSpan) {
    const int64_t t1 = std::min(a.d, t0 + kSpan);
    block<P, KA, 32, true>(a, q, t0, t1, kept_a);
    block<P, KB, kSpan, true>(b, q, t0, t1, kept_b);
  }
}

// 9-16 rows: two blocks of at most 8 rows (the first ceil(K / 2), then the rest) over each group of P panels, a span
// of inputs at a time (group), so each weight line comes from memory once and from L1 once. One block of 9-16 rows
// took two panels at a time up to 12 rows and one past (16 rows x 2 panels would fill all 32 registers), spilled its
// row pointers to the stack and, in L2, took ~2.6x 8 rows' time at 16 (docs/bandwidth-smollm2.md, "9-16 rows").
template <int K>
void halves_of(const Problem& p, int64_t q0, int64_t q1) {
  constexpr int KA = (K + 1) / 2, KB = K / 2;
  constexpr int P = KA <= 6 ? 4 : 3;  // the first block's choice; the second has as many rows or one fewer
  const Problem rest{p.x + KA * p.d, p.w, p.b, p.y + KA * p.n, KB, p.d, p.n};
  int64_t q = q0;
  for (; q + P <= q1; q += P) group<P, KA, KB>(p, rest, q);
  for (; q < q1; ++q) group<1, KA, KB>(p, rest, q);
}

void panels(const Problem& p, int64_t q0, int64_t q1) {
  switch (p.k) {
    case 1: return panels_of<1>(p, q0, q1);
    case 2: return panels_of<2>(p, q0, q1);
    case 3: return panels_of<3>(p, q0, q1);
    case 4: return panels_of<4>(p, q0, q1);
    case 5: return panels_of<5>(p, q0, q1);
    case 6: return panels_of<6>(p, q0, q1);
    case 7: return panels_of<7>(p, q0, q1);
    case 8: return panels_of<8>(p, q0, q1);
    case 9: return halves_of<9>(p, q0, q1);
    case 10: return halves_of<10>(p, q0, q1);
    case 11: return halves_of<11>(p, q0, q1);
    case 12: return halves_of<12>(p, q0, q1);
    case 13: return halves_of<13>(p, q0, q1);
    case 14: return halves_of<14>(p, q0, q1);
    case 15: return halves_of<15>(p, q0, q1);
    default: return halves_of<16>(p, q0, q1);
  }
}

}  // namespace avx512

#pragma GCC pop_options

#endif  // SF_X86_SIMD

// The instruction sets this CPU runs, best first (always ending with "scalar").
std::vector<std::string> supported_isas() {
  std::vector<std::string> isas;
  const specfamily::CpuSets cpu = specfamily::cpu_sets();
  if (cpu.avx512f) isas.push_back("avx512");
  if (cpu.avx2_fma) isas.push_back("avx2");
  isas.push_back("scalar");
  return isas;
}

PanelsFn panels_for(const std::string& isa) {
  const auto isas = supported_isas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "stream_linear: instruction set '", isa,
              "' is not supported on this CPU (supported: ", c10::Join(", ", isas), ")");
#ifdef SF_X86_SIMD
  if (isa == "avx512") return avx512::panels;
  if (isa == "avx2") return specfamily::stream::avx2::panels;
#endif
  return scalar_panels;
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

// One product of linear_many: its packed weight, bias and output.
struct Part {
  at::Tensor packed, bias, y;
  int64_t n;
};

// Products of the same x (k rows of d) in one parallel region: the panels of every weight, first to last, as one
// range the threads split. Each chunk of panels multiplies every block of at most kMaxRows rows (past kMaxRows rows,
// chunks of about kChunkBytes of packed weight stay in L2 while the blocks pass over them), and every output is one
// FMA chain over the inputs in order, then + bias, whatever the block, thread or part it falls in: a row's result
// depends neither on the rows beside it nor on the other products of the call. One part is linear; several are one
// fork and join for all of them (linear_many), the small products' panels (a layer's k and v) shared out with the
// large ones' instead of each splitting its few panels alone.
void run_parts(const at::Tensor& xc, int64_t d, std::vector<Part>& parts, PanelsFn panels) {
  const int64_t k = xc.numel() / d;
  std::vector<int64_t> first{0};  // parts[i]'s panels are [first[i], first[i + 1]) of the shared range
  for (const Part& part : parts) first.push_back(first.back() + part.packed.size(0));
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / (kPanel * std::max<int64_t>(d, 1)));
  const int64_t panel_bytes = kPanel * static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(d, 1);
  const float* xp = xc.data_ptr<float>();
  SF_MARK("region start");
  at::parallel_for(0, first.back(), grain, [&](int64_t g0, int64_t g1) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t q0 = std::max(g0, first[i]) - first[i], q1 = std::min(g1, first[i + 1]) - first[i];
      if (q0 >= q1) continue;
      const Part& part = parts[i];
      const int64_t total = part.packed.size(0), n = part.n;
      const int64_t chunk = k <= kMaxRows ? total : std::max<int64_t>(kMinChunk, kChunkBytes / panel_bytes);
      const float* wp = part.packed.data_ptr<float>();
      const float* bp = part.bias.defined() ? part.bias.data_ptr<float>() : nullptr;
      float* yp = part.y.data_ptr<float>();
      for (int64_t c0 = q0; c0 < q1; c0 += chunk) {
        const int64_t c1 = std::min(q1, c0 + chunk);
        for (int64_t r0 = 0; r0 < k; r0 += kMaxRows) {
          const Problem p{xp + r0 * d, wp, bp, yp + r0 * n, std::min(kMaxRows, k - r0), d, n};
          panels(p, c0, c1);
        }
      }
    }
  });
  SF_MARK("region end");
}

// The weight object as a tensor (the packed copy is kept on the object), its inputs checked.
at::Tensor weight_of(const at::Tensor& x, const py::handle& weight_obj, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(THPVariable_Check(weight_obj.ptr()), "stream_linear: weight must be a tensor, got ",
              py::str(py::type::handle_of(weight_obj).attr("__name__")).cast<std::string>());
  at::Tensor weight = weight_obj.cast<at::Tensor>();
  check_inputs(x, weight, bias);
  return weight;
}

// Whether the product is left to at::linear: no rows, an empty weight, or gradients wanted.
bool declined(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                   (bias.has_value() && bias->defined() && bias->requires_grad()));
  return x.numel() == 0 || weight.size(0) == 0 || grad;
}

// One product of x (run_parts): the weight's packed copy, its bias and a fresh output.
Part part_of(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight,
             const c10::optional<at::Tensor>& bias) {
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return Part{packed, bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor(),
              at::empty(sizes, x.options()), weight.size(0)};
}

// x @ w.tensor^T + w.bias for every w on a named instruction set, in one parallel region (run_parts): every output
// one FMA chain over the inputs in order, then + bias, whatever the block of rows or the product it falls in. Where
// the kernel would not run for one of them (no rows, an empty weight, gradients), each product is on its own.
std::vector<at::Tensor> products_with(const at::Tensor& x, const std::vector<Weight*>& weights,
                                      const std::string& isa) {
  SF_MARK("products");
  bool each = false;
  for (const Weight* w : weights) {
    check_inputs(x, w->tensor, w->bias);
    each = each || declined(x, w->tensor, w->bias);
  }
  std::vector<at::Tensor> out;
  if (each && weights.size() > 1) {
    for (Weight* w : weights) out.push_back(products_with(x, {w}, isa)[0]);
    return out;
  }
  if (each) return {at::linear(x, weights[0]->tensor, weights[0]->bias)};
  const PanelsFn panels = panels_for(isa);
  SF_MARK("checks");
  std::vector<Part> parts;
  for (Weight* w : weights) {
    const at::Tensor& packed = packed_of(*w);
    SF_MARK("packed copy");
    parts.push_back(part_of(x, packed, w->tensor, w->bias));
    SF_MARK("output");
    out.push_back(parts.back().y);
  }
  run_parts(x.contiguous(), x.size(-1), parts, panels);
  SF_MARK("products done");
  return out;
}

std::vector<at::Tensor> products(const at::Tensor& x, const std::vector<Weight*>& weights) {
  return products_with(x, weights, best_isa());
}

// A weight object as products takes it, for one call (its packed copy looked up on the object: packed_for).
Weight record_of(const at::Tensor& x, const py::handle& weight_obj, const c10::optional<at::Tensor>& bias) {
  return Weight{py::reinterpret_borrow<py::object>(weight_obj), weight_of(x, weight_obj, bias), bias};
}

// y = x weight^T + b on a named instruction set (products_with).
at::Tensor linear_with(const at::Tensor& x, const py::handle& weight_obj, const c10::optional<at::Tensor>& bias,
                       const std::string& isa) {
  Weight w = record_of(x, weight_obj, bias);
  return products_with(x, {&w}, isa)[0];
}

at::Tensor linear(const at::Tensor& x, const py::handle& weight, const c10::optional<at::Tensor>& bias) {
  return linear_with(x, weight, bias, best_isa());
}

// linear(x, weights[i], biases[i]) for every i, bit for bit, in one parallel region (products_with): the products a
// layer makes of one input (q, k and v; gate and up).
std::vector<at::Tensor> linear_many_with(const at::Tensor& x, const std::vector<py::handle>& weights,
                                         const std::vector<c10::optional<at::Tensor>>& biases,
                                         const std::string& isa) {
  TORCH_CHECK(weights.size() == biases.size(), "stream_linear.linear_many: ", weights.size(), " weights need as many "
              "biases (None or a tensor), got ", biases.size());
  std::vector<Weight> records;
  records.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) records.push_back(record_of(x, weights[i], biases[i]));
  std::vector<Weight*> pointers;
  for (Weight& w : records) pointers.push_back(&w);
  return products_with(x, pointers, isa);
}

std::vector<at::Tensor> linear_many(const at::Tensor& x, const std::vector<py::handle>& weights,
                                    const std::vector<c10::optional<at::Tensor>>& biases) {
  return linear_many_with(x, weights, biases, best_isa());
}

}  // namespace

namespace specfamily {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);  // in rms_norm.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Streaming float32 products y = x W^T + b, batch-invariant (specfamily.runtime.kernel)";
  m.def("linear", &linear, "x @ weight^T + bias, any number of rows, each row's result independent of the others",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("linear_with", &linear_with, "linear on a named instruction set (tests)", py::arg("x"), py::arg("weight"),
        py::arg("bias"), py::arg("isa"));
  m.def("linear_many", &linear_many, "linear(x, weights[i], biases[i]) for every i, bit for bit, in one parallel "
        "region", py::arg("x"), py::arg("weights"), py::arg("biases"));
  m.def("linear_many_with", &linear_many_with, "linear_many on a named instruction set (tests)", py::arg("x"),
        py::arg("weights"), py::arg("biases"), py::arg("isa"));
  m.def(
      "pack", [](const at::Tensor& weight) { return pack(weight, false); },
      "the weight (n, d) as panels (ceil(n / PANEL), d, PANEL), zero-padded past n", py::arg("weight"));
  m.def("rms_norm", &specfamily::rms_norm, "weight * (x * rsqrt(mean(x^2, -1) + eps)), one call (float32 CPU rows)",
        py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("isa", &best_isa, "the instruction set linear uses on this CPU");
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  m.attr("ROWS_PER_BLOCK") = kMaxRows;
  SF_EXPORT_MARKS(m);
  m.attr("PANEL") = kPanel;
  m.attr("PACKED_ATTR") = kPackedAttr;
  // products and rms_norm's C++ entry points, for another extension to call without Python (native_layers.cpp);
  // the names carry the signatures' version
  m.attr("_products_capsule") =
      py::capsule(reinterpret_cast<void*>(&products), specfamily::stream::kProductsCapsule);
  m.attr("_norm_capsule") = py::capsule(reinterpret_cast<void*>(&specfamily::rms_norm), "specfamily.rms_norm.v1");
}
