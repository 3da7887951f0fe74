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
// that would have fed it). Every reduction is a function of a key's place in that sequence: a score is one fixed
// tree per key (AVX2 and scalar: the head's chunks fused in order into one vector, then the same tree of adds across
// its lanes for every key, whichever slot of a tile it takes; AVX-512: four chains of FMAs over d = m mod 4, then
// (m0 + m1) + (m2 + m3), whichever lanes the row and the key take; then times the scale); the softmax is two-pass
// (the row's exact maximum, then exp(s - max)), its sum taken in 16 lanes by place mod 16, the lanes then added in
// order; the values accumulate in place order, one chain per row, then are divided by the sum. exp is one polynomial
// (AVX2 and scalar: its products and sums rounded one by one; AVX-512's 16-lane copy is contracted into fused
// multiply-adds by the compiler, the same for every lane and row). Per instruction set and
// head width (AVX-512F for widths that are multiples of 16 up to 128, AVX2 + FMA for multiples of 8 up to 128, else
// the scalar loop) a row's bits are fixed; the sets differ from each other and from sdpa in the last bits. A process
// attends on one set (the best this CPU runs), so its plain and drafted passes take the same path.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../cpu_isa.h"

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

// Per key/value head: scores, then probabilities, of its group's rows (groups * rows, each padded to kLanes places),
// their value accumulators (dim each); AVX-512's queries four rows to a vector.
struct Work {
  std::unique_ptr<float[]> p, acc;
  int64_t pad;
  std::vector<float> qt = {};
};

// A tile: up to kTileRows query heads of one group, all fed row r (the same keys seen), against a run of places.
constexpr int kTileRows = 4;
struct Tile {
  const float* q[kTileRows];  // each row's query (dim)
  float* p[kTileRows];        // each row's scores / probabilities by place
  float* acc[kTileRows];      // each row's value accumulator (dim)
  int64_t head[kTileRows];    // each row's query head
  int rows;
};

// The lanes of the softmax's sum, added in order.
inline float lane_sum(const float* lanes) {
  float sum = 0.0f;
  for (int64_t k = 0; k < kLanes; ++k) sum += lanes[k];
  return sum;
}

// The end (exclusive) of the run of a row's visible places from `c` whose keys lie below `j1`.
inline int64_t run_end(const int32_t* index, int64_t c, int64_t n, int64_t j1) {
  if (c >= n || index[c] >= j1) return c;
  // The common case in one look: every key from index[c] to j1 - 1 seen (the indices ascend without repeats, so
  // j1 - index[c] of them ending at j1 - 1 are exactly those keys).
  const int64_t full = c + (j1 - index[c]);
  if (full <= n && index[full - 1] == j1 - 1) return full;
  while (c < n && index[c] < j1) ++c;
  return c;
}

// The score and value loops of one instruction set: ``attention_head.h`` included once per set (scalar and AVX2),
// each time in the set's target region (so its intrinsics inline), after that set's Ops: a tile's dot products with a
// run of keys, its softmax, and its accumulation of a run of values, each row's values one chain in place order.
// AVX-512 has a head of its own (attention_avx512.h: the scores four query rows to a vector, key by key, then the
// same softmax and values loops).

namespace scalar {
struct Ops {
  // p[c] = dot(q, keys[index[c]]) * scale for c in [c0, c1), every row of the tile: one sequential sum per key.
  static void scores(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim, float scale) {
    for (int g = 0; g < t.rows; ++g)
      for (int64_t c = c0; c < c1; ++c) {
        const float* k = keys + index[c] * k_row;
        float s = 0.0f;
        for (int64_t d = 0; d < dim; ++d) s += t.q[g][d] * k[d];
        t.p[g][c] = s * scale;
      }
  }
  static float softmax(float* p, int64_t n, int64_t pad);  // softmax_row (attention_head.h)
  // acc += p[c] * values[index[c]] for c in [c0, c1), every row of the tile.
  static void values(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim) {
    for (int g = 0; g < t.rows; ++g)
      for (int64_t c = c0; c < c1; ++c) {
        const float* v = values + index[c] * v_row;
        for (int64_t d = 0; d < dim; ++d) t.acc[g][d] += t.p[g][c] * v[d];
      }
  }
};
#include "attention_head.h"
float Ops::softmax(float* p, int64_t n, int64_t pad) { return softmax_row(p, n, pad); }
}  // namespace scalar

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace avx512 {
#include "attention_avx512.h"  // Ops, head
}  // namespace avx512
#pragma GCC pop_options
#endif

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "attention_avx2.h"  // Ops
#include "attention_head.h"
float Ops::softmax(float* p, int64_t n, int64_t pad) { return softmax_row(p, n, pad); }
}  // namespace avx2
#pragma GCC pop_options
#endif

using HeadFn = void (*)(const Problem&, int64_t, int64_t, int64_t, Work&);

std::vector<std::string> supported_isas() {
  std::vector<std::string> isas;
  const specfamily::CpuSets cpu = specfamily::cpu_sets();
  if (cpu.avx512f) isas.push_back("avx512");
  if (cpu.avx2_fma) isas.push_back("avx2");
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
  if (isa == "avx512" && dim % 16 == 0 && dim <= 16 * avx512::Ops::kMaxChunks) return avx512::head;
  if (isa != "scalar" && dim % 8 == 0 && dim <= 8 * avx2::Ops::kMaxChunks) return avx2::head;  // AVX-512 CPUs run AVX2
#endif
  return scalar::head;
}

// One row's visible places (length bools) as ascending key indices into out (length entries) from key `from` on,
// after the n already there; returns the new count. Branch-free: every key is written at the next free place, which
// moves on only when the key is seen (n <= j: in bounds).
inline int32_t row_keys(const bool* v, int64_t from, int64_t length, int32_t* out, int32_t n) {
  for (int64_t j = from; j < length; ++j) {
    out[n] = static_cast<int32_t>(j);
    n += v[j] ? 1 : 0;
  }
  return n;
}

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx512f")
// row_keys sixteen keys at a time: the seen bytes as a mask (SSE2's compare and movemask), their indices compressed
// into place; the same indices and count. A drafted pass's 5 rows over 800 keys: ~0.4 us a layer, ~2.5 with a
// branch per key (the index is rebuilt in every layer's call: it grows with the fed rows).
int32_t row_keys_avx512(const bool* v, int64_t length, int32_t* out) {
  __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int32_t n = 0;
  int64_t j = 0;
  for (; j + 16 <= length; j += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j));
    const auto seen = static_cast<__mmask16>(~_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128())));
    _mm512_mask_compressstoreu_epi32(out + n, seen, ids);
    n += __builtin_popcount(seen);
    ids = _mm512_add_epi32(ids, step);
  }
  return row_keys(v, j, length, out, n);
}
#pragma GCC pop_options
#endif

// The keys each fed row sees: (rows, length) ascending indices and their counts, from visible (rows, length) bool
// or, when None, every key for every row. `vector`: AVX-512F's loop where this CPU runs it (the same result).
void visible_keys(const c10::optional<at::Tensor>& visible, int64_t rows, int64_t length, std::vector<int32_t>& index,
                  std::vector<int32_t>& count, bool vector = true) {
  index.assign(rows * length, 0);
  count.assign(rows, 0);
  const bool* v = visible.has_value() ? visible->data_ptr<bool>() : nullptr;
  static const bool avx512 = specfamily::cpu_sets().avx512f;
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* out = index.data() + r * length;
    if (v == nullptr) {
      for (int64_t j = 0; j < length; ++j) out[j] = static_cast<int32_t>(j);
      count[r] = static_cast<int32_t>(length);
      continue;
    }
#ifdef SF_X86_SIMD
    if (vector && avx512) {
      count[r] = row_keys_avx512(v + r * length, length, out);
      continue;
    }
#endif
    count[r] = row_keys(v + r * length, 0, length, out, 0);
  }
}

// visible_keys as tensors (tests): index (rows, length) int32, each row's first count[r] entries its keys (the rest
// 0), and count (rows,) int32.
std::tuple<at::Tensor, at::Tensor> keys_of(const at::Tensor& visible, bool vector) {
  TORCH_CHECK(visible.scalar_type() == at::kBool && visible.is_contiguous() && visible.dim() == 2,
              "attention: visible must be a contiguous 2-D bool tensor, got ", visible.sizes());
  const int64_t rows = visible.size(0), length = visible.size(1);
  std::vector<int32_t> index, count;
  visible_keys(visible, rows, length, index, count, vector);
  at::Tensor idx = at::zeros({rows, length}, at::kInt), cnt = at::empty({rows}, at::kInt);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(idx.data_ptr<int32_t>() + r * length, index.data() + r * length, sizeof(int32_t) * count[r]);
    cnt.data_ptr<int32_t>()[r] = count[r];
  }
  return {idx, cnt};
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
  // Threads take runs of (key/value head, fed row) units, heads first: at 3 heads and 5 fed rows two threads take 8
  // and 7 units, not 2 heads and 1 (a head split between two threads is read by both).
  at::parallel_for(0, kv_heads * rows, 1, [&](int64_t u0, int64_t u1) {
    Work w{std::unique_ptr<float[]>(new float[group_rows * pad]), std::unique_ptr<float[]>(new float[group_rows * dim]),
           pad};  // every place written before it is read
    for (int64_t h = u0 / rows; h * rows < u1; ++h)
      fn(pr, h, std::max(u0, h * rows) - h * rows, std::min(u1, (h + 1) * rows) - h * rows, w);
  });
  return out;
}

at::Tensor attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const c10::optional<at::Tensor>& visible, double scale) {
  RECORD_FUNCTION("specfamily::attention", std::vector<c10::IValue>());  // named to the profiler (a flag test when off)
  return attend_with(query, key, value, visible, scale, best_isa());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Batch-invariant attention over a KV cache for passes of few rows (specfamily.runtime.attention)";
  m.def("attend", &attend, "softmax(q k^T * scale over each row's visible keys) v -> (1, rows, heads * dim)",
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("visible"), py::arg("scale"));
  m.def("attend_with", &attend_with, "attend on a named instruction set (tests)", py::arg("query"), py::arg("key"),
        py::arg("value"), py::arg("visible"), py::arg("scale"), py::arg("isa"));
  m.def("visible_keys", &keys_of, "(index, count): the keys each row of visible sees (tests; vector: AVX-512F's loop)",
        py::arg("visible"), py::arg("vector") = true);
  m.def("isa", &best_isa, "the instruction set attend uses on this CPU (for 16-multiple head widths)");
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  // attend's C++ entry point, for the native layer loop (native_layers.cpp) to call without Python
  m.attr("_attend_capsule") = py::capsule(reinterpret_cast<void*>(&attend), "specfamily.attention.v1");
}
