// Attention for passes over a KV cache with few query rows (specfamily.runtime.attention builds this).
//
// A decode pass feeds one row, a verify pass a few (a chain, a tree); each layer's attention reads the whole cache
// of its key/value heads. Per key/value head this reads the keys and values in blocks of kBlock rows that stay in L1
// while every query row of the head's group (query heads x fed rows) uses them: the cache is read from memory once
// per layer, whatever the number of rows.
//
// Batch invariance (what keeps greedy text identical to plain decoding): a query row's output bits depend only on its
// own query and on the sequence of keys and values it sees, in cache order -- not on the other rows of the pass, nor
// on where those keys lie in the buffer (a tree node's ancestors are scattered there, contiguous in the plain pass
// that would have fed it). Every reduction is a function of a key's place in that sequence: the scores are one fixed
// chain per key (then times the scale); the softmax is two-pass (the row's exact maximum, then exp(s - max)), its
// sum over the sequence taken in 16 lanes by place mod 16, the lanes then added in order; the values accumulate in
// place order into two chains (even and odd places) added at the end, then divided by the sum. exp is one
// polynomial with its products and sums rounded one by one, the same bits in a vector lane or a scalar. Per
// instruction set (AVX-512F with fused multiply-adds, or the scalar loop where AVX-512 does not run or the head width
// is not a multiple of 16) a row's bits are fixed; the two sets differ from each other and from sdpa in the last bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__) && !defined(__clang__)
#define SF_X86_SIMD 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 32;  // keys per block (64-wide heads: 8 KiB of keys, 8 KiB of values)
constexpr int64_t kLanes = 16;  // the softmax sum's lanes
constexpr float kExpLow = -87.0f;  // exp below this is 0 (2^n would leave the normal range)

// One call: queries (heads, rows, dim), keys and values (kv heads, >= length, dim), each row of dim contiguous.
struct Problem {
  const float* query;
  int64_t q_head, q_row;  // strides
  const float* keys;
  const float* values;
  int64_t k_head, k_row, v_head, v_row;
  float* out;  // (rows, heads, dim) contiguous
  int64_t heads, kv_heads, groups, rows, dim, length;
  const int32_t* index;  // (rows, length): the keys each fed row sees, ascending; count[r] of them
  const int32_t* count;
  float scale;
};

// Per key/value head: scores, then probabilities, of its group's rows (groups * rows, padded to kLanes), the value
// accumulators (two chains per row), and the block cursors.
struct Work {
  std::vector<float> p, acc;
  std::vector<int64_t> cursor;
  int64_t pad;
};

// exp(x), x <= 0 (Cephes' expf: n = round(x / ln 2), a degree-6 polynomial on the remainder, times 2^n); every
// product and sum rounded on its own (no contraction), so a vector lane and a scalar give the same bits.
__attribute__((optimize("fp-contract=off"))) inline float exp_of(float x) {
  if (x < kExpLow) return 0.0f;
  const float t = x * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = (y * (r * r) + r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

// p[0, n) <- exp(s - max), p[n, pad) <- 0; returns the sum in kLanes lanes by place, the lanes added in order.
__attribute__((optimize("fp-contract=off"))) float softmax_row(float* p, int64_t n, int64_t pad) {
  float top = p[0];
  for (int64_t c = 1; c < n; ++c) top = std::max(top, p[c]);
  for (int64_t c = 0; c < n; ++c) p[c] = exp_of(p[c] - top);
  std::fill(p + n, p + pad, 0.0f);
  float lanes[kLanes] = {};
  for (int64_t c = 0; c < pad; c += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += p[c + k];
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

// The dot product and value accumulation of one instruction set.
struct ScalarOps {
  static float dot(const float* q, const float* k, int64_t dim) {
    float s = 0.0f;
    for (int64_t d = 0; d < dim; ++d) s += q[d] * k[d];
    return s;
  }
  static void accumulate(float* acc, float p, const float* v, int64_t dim) {
    for (int64_t d = 0; d < dim; ++d) acc[d] += p * v[d];
  }
};

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
struct Avx512Ops {  // dim a multiple of 16
  static float dot(const float* q, const float* k, int64_t dim) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int64_t d = 16; d < dim; d += 16) t = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), t);
    return _mm512_reduce_add_ps(t);
  }
  static void accumulate(float* acc, float p, const float* v, int64_t dim) {
    const __m512 pv = _mm512_set1_ps(p);
    for (int64_t d = 0; d < dim; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + d), _mm512_loadu_ps(acc + d)));
  }
};
#pragma GCC pop_options
#endif

// One key/value head: its group's rows against the keys each fed row sees (module comment).
template <class Ops>
void head(const Problem& pr, int64_t h, Work& w) {
  const int64_t rows = pr.groups * pr.rows, dim = pr.dim, pad = w.pad;
  const float* keys = pr.keys + h * pr.k_head;
  const float* values = pr.values + h * pr.v_head;
  auto query = [&](int64_t rr) { return pr.query + (h * pr.groups + rr / pr.rows) * pr.q_head + (rr % pr.rows) * pr.q_row; };
  std::fill(w.cursor.begin(), w.cursor.end(), 0);
  for (int64_t j0 = 0; j0 < pr.length; j0 += kBlock) {  // scores, a block of keys at a time
    const int64_t j1 = std::min(pr.length, j0 + kBlock);
    for (int64_t rr = 0; rr < rows; ++rr) {
      const int64_t r = rr % pr.rows, n = pr.count[r];
      const int32_t* index = pr.index + r * pr.length;
      const float* q = query(rr);
      float* s = w.p.data() + rr * pad;
      int64_t c = w.cursor[rr];
      for (; c < n && index[c] < j1; ++c) s[c] = Ops::dot(q, keys + index[c] * pr.k_row, dim) * pr.scale;
      w.cursor[rr] = c;
    }
  }
  std::vector<float> sums(rows);
  for (int64_t rr = 0; rr < rows; ++rr) sums[rr] = softmax_row(w.p.data() + rr * pad, pr.count[rr % pr.rows], pad);
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.cursor.begin(), w.cursor.end(), 0);
  for (int64_t j0 = 0; j0 < pr.length; j0 += kBlock) {  // values, the same blocks
    const int64_t j1 = std::min(pr.length, j0 + kBlock);
    for (int64_t rr = 0; rr < rows; ++rr) {
      const int64_t r = rr % pr.rows, n = pr.count[r];
      const int32_t* index = pr.index + r * pr.length;
      const float* p = w.p.data() + rr * pad;
      float* acc = w.acc.data() + rr * 2 * dim;  // place even, then odd
      int64_t c = w.cursor[rr];
      for (; c < n && index[c] < j1; ++c) Ops::accumulate(acc + (c & 1) * dim, p[c], values + index[c] * pr.v_row, dim);
      w.cursor[rr] = c;
    }
  }
  for (int64_t rr = 0; rr < rows; ++rr) {
    const float* acc = w.acc.data() + rr * 2 * dim;
    float* o = pr.out + ((rr % pr.rows) * pr.heads + h * pr.groups + rr / pr.rows) * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = (acc[d] + acc[dim + d]) / sums[rr];
  }
}

using HeadFn = void (*)(const Problem&, int64_t, Work&);

std::vector<std::string> supported_isas() {
  std::vector<std::string> isas;
#ifdef SF_X86_SIMD
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) isas.push_back("avx512");
#endif
  isas.push_back("scalar");
  return isas;
}

const std::string& best_isa() {
  static const std::string isa = supported_isas().front();
  return isa;
}

HeadFn head_for(const std::string& isa, int64_t dim) {
  const auto isas = supported_isas();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "attention: instruction set '", isa,
              "' is not supported on this CPU");
#ifdef SF_X86_SIMD
  if (isa == "avx512" && dim % 16 == 0) return head<Avx512Ops>;
#endif
  return head<ScalarOps>;
}

// The keys each fed row sees: (rows, length) ascending indices and their counts, from visible (rows, length) bool
// or, when None, every key for every row.
void visible_keys(const c10::optional<at::Tensor>& visible, int64_t rows, int64_t length, std::vector<int32_t>& index,
                  std::vector<int32_t>& count) {
  index.assign(rows * length, 0);
  count.assign(rows, 0);
  const bool* v = visible.has_value() ? visible->data_ptr<bool>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    int32_t n = 0;
    for (int64_t j = 0; j < length; ++j)
      if (v == nullptr || v[r * length + j]) index[r * length + n++] = static_cast<int32_t>(j);
    count[r] = n;
  }
}

void check(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
           const c10::optional<at::Tensor>& visible) {
  for (const at::Tensor* t : {&query, &key, &value})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->dim() == 4 && t->size(0) == 1 &&
                    t->stride(3) == 1, "attention: query, key and value must be float32 CPU (1, heads, rows, dim) "
                    "tensors with contiguous rows");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(3) == query.size(3) && query.size(1) % key.size(1) == 0,
              "attention: query ", query.sizes(), " does not fit key ", key.sizes(), " and value ", value.sizes());
  TORCH_CHECK(key.size(2) >= 1, "attention: no keys");
  if (visible.has_value())
    TORCH_CHECK(visible->scalar_type() == at::kBool && visible->is_contiguous() && visible->dim() == 2 &&
                    visible->size(0) == query.size(2) && visible->size(1) == key.size(2),
                "attention: visible must be a contiguous bool (rows, keys) = (", query.size(2), ", ", key.size(2),
                ") tensor, got ", visible->sizes());
}

// softmax(q k^T * scale, over the keys each row sees) v for query (1, heads, rows, dim) on key and value (1, kv heads,
// keys, dim); visible (rows, keys) bool or None (every key). Returns (1, rows, heads * dim).
at::Tensor attend_with(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const c10::optional<at::Tensor>& visible, double scale, const std::string& isa) {
  check(query, key, value, visible);
  const int64_t heads = query.size(1), rows = query.size(2), dim = query.size(3);
  const int64_t kv_heads = key.size(1), length = key.size(2);
  std::vector<int32_t> index, count;
  visible_keys(visible, rows, length, index, count);
  at::Tensor out = at::empty({1, rows, heads * dim}, query.options());
  const Problem pr{query.data_ptr<float>(), query.stride(1), query.stride(2), key.data_ptr<float>(),
                   value.data_ptr<float>(), key.stride(1), key.stride(2), value.stride(1), value.stride(2),
                   out.data_ptr<float>(), heads, kv_heads, heads / kv_heads, rows, dim, length, index.data(),
                   count.data(), static_cast<float>(scale)};
  const HeadFn fn = head_for(isa, dim);
  const int64_t group_rows = pr.groups * rows, pad = (length + kLanes - 1) / kLanes * kLanes;
  at::parallel_for(0, kv_heads, 1, [&](int64_t h0, int64_t h1) {
    Work w{std::vector<float>(group_rows * pad), std::vector<float>(group_rows * 2 * dim),
           std::vector<int64_t>(group_rows), pad};
    for (int64_t h = h0; h < h1; ++h) fn(pr, h, w);
  });
  return out;
}

at::Tensor attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const c10::optional<at::Tensor>& visible, double scale) {
  return attend_with(query, key, value, visible, scale, best_isa());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Batch-invariant attention over a KV cache for passes of few rows (specfamily.runtime.attention)";
  m.def("attend", &attend, "softmax(q k^T * scale over each row's visible keys) v -> (1, rows, heads * dim)",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("visible"), py::arg("scale"));
  m.def("attend_with", &attend_with, "attend on a named instruction set (tests)", py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("visible"), py::arg("scale"), py::arg("isa"));
  m.def("isa", &best_isa, "the instruction set attend uses on this CPU (for 16-multiple head widths)");
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  // attend's C++ entry point, for the native layer loop (native_layers.cpp) to call without Python
  m.attr("_attend_capsule") = py::capsule(reinterpret_cast<void*>(&attend), "specfamily.attention.v1");
}
