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
// tree per key (the head's chunks fused in order into one vector, then the same tree of adds across its lanes for
// every key, whichever slot of a tile it takes; then times the scale); the softmax is two-pass (the row's exact
// maximum, then exp(s - max)), its sum taken in 16 lanes by place mod 16, the lanes then added in order; the values
// accumulate in place order, one chain per row, then are divided by the sum. exp is one polynomial with its products
// and sums rounded one by one, the same bits in a vector lane or a scalar. Per instruction set and head width (AVX-512F
// for widths that are multiples of 16 up to 128, AVX2 + FMA for multiples of 8 up to 128, else the scalar loop) a
// row's bits are fixed; the sets differ from each other and from sdpa in the last bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
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

// Per key/value head: scores, then probabilities, of its group's rows (groups * rows, each padded to kLanes places),
// their value accumulators (dim each).
struct Work {
  std::unique_ptr<float[]> p, acc;
  int64_t pad;
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

// The score and value loops of one instruction set: ``attention_head.h`` included once per set, each time in the
// set's target region (so its intrinsics inline), after that set's Ops: a tile's dot products with a run of keys,
// its softmax, and its accumulation of a run of values, each row's values one chain in place order.

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
// Sixteen partial sums t[0..15] (each a 16-lane vector: one row's products with one key) -> their 16 sums, t[k]'s in
// lane k: the same tree of adds for every vector whatever its slot ((l + l+8) + (l+4 + l+12), then pairs within 128
// bits), so a score does not depend on the rows or keys beside it in a tile.
inline __m512 sum16(const __m512 t[16]) {
  __m512 w[8], x[4], y[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per vector: lanes i + (i + 8), i < 8; two per result
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per vector: 4 lanes; four per result
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // per vector: 2 lanes; eight per result
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44), _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  // z's lane 4j + m holds t[4m + j]: put t[k] in lane k
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, z);
}

// exp_of (attention_head.h) on 16 lanes, op for op: the same bits as the scalar function.
inline __m512 exp16(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(t, magic), magic);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(c));
  y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __mmask16 low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLow), _CMP_LT_OQ);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~low), y, _mm512_castsi512_ps(bits));
}

// The first `count` lanes (all past 16, none below 1).
inline __mmask16 tail(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << std::max<int64_t>(count, 0)) - 1);
}

struct Ops {  // dim a multiple of 16, at most kMaxChunks chunks
  static constexpr int kMaxChunks = 8;

  // G rows x (16 / G) keys per sum16: each key loaded once per chunk for the G rows; slots past the run stay zero.
  template <int G, int NC>
  static void scores_of(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0,
                        int64_t c1, float scale) {
    constexpr int K = 16 / G;
    for (int64_t c = c0; c < c1; c += K) {
      const int64_t n = std::min<int64_t>(K, c1 - c);
      __m512 acc[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
      const float* rows[K];
#pragma GCC unroll 16
      for (int k = 0; k < K; ++k) rows[k] = keys + index[c + std::min<int64_t>(k, n - 1)] * k_row;
#pragma GCC unroll 8
      for (int d = 0; d < NC; ++d) {
        __m512 q[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) q[g] = _mm512_loadu_ps(t.q[g] + 16 * d);
#pragma GCC unroll 16
        for (int k = 0; k < K; ++k) {
          const __m512 kv = _mm512_loadu_ps(rows[k] + 16 * d);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[g * K + k] = _mm512_fmadd_ps(q[g], kv, acc[g * K + k]);
        }
      }
      const __m512 sums = _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale));  // lane g * K + k
      alignas(64) float out[16];
      _mm512_store_ps(out, sums);
      for (int g = 0; g < G; ++g)
        for (int64_t k = 0; k < n; ++k) t.p[g][c + k] = out[g * K + k];
    }
  }

  template <int G>
  static void scores_g(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0, int64_t c1,
                       int64_t dim, float scale) {
    switch (dim / 16) {
      case 1: return scores_of<G, 1>(t, keys, k_row, index, c0, c1, scale);
      case 2: return scores_of<G, 2>(t, keys, k_row, index, c0, c1, scale);
      case 3: return scores_of<G, 3>(t, keys, k_row, index, c0, c1, scale);
      case 4: return scores_of<G, 4>(t, keys, k_row, index, c0, c1, scale);
      case 5: return scores_of<G, 5>(t, keys, k_row, index, c0, c1, scale);
      case 6: return scores_of<G, 6>(t, keys, k_row, index, c0, c1, scale);
      case 7: return scores_of<G, 7>(t, keys, k_row, index, c0, c1, scale);
      default: return scores_of<G, 8>(t, keys, k_row, index, c0, c1, scale);
    }
  }

  static void scores(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim, float scale) {
    switch (t.rows) {
      case 1: return scores_g<1>(t, keys, k_row, index, c0, c1, dim, scale);
      case 2: return scores_g<2>(t, keys, k_row, index, c0, c1, dim, scale);
      case 3: return scores_g<3>(t, keys, k_row, index, c0, c1, dim, scale);
      default: return scores_g<4>(t, keys, k_row, index, c0, c1, dim, scale);
    }
  }

  // softmax_row (attention_head.h), sixteen places at a time: the same values.
  static float softmax(float* p, int64_t n, int64_t pad) {
    __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < n; c += 16) top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, tail(n - c), p + c));
    const __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 lanes = _mm512_setzero_ps();
    for (int64_t c = 0; c < pad; c += 16) {
      const __mmask16 live = tail(n - c);
      const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, p + c), most)));
      _mm512_storeu_ps(p + c, e);
      lanes = _mm512_add_ps(lanes, e);
    }
    alignas(64) float out[16];
    _mm512_store_ps(out, lanes);
    return lane_sum(out);
  }

  // Each value row loaded once per tile: G rows x NC chunks of accumulators in registers over the run.
  template <int G, int NC>
  static void values_of(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0,
                        int64_t c1) {
    __m512 a[G][NC];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) a[g][i] = _mm512_loadu_ps(t.acc[g] + 16 * i);
    for (int64_t c = c0; c < c1; ++c) {
      const float* v = values + index[c] * v_row;
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) {
        const __m512 vv = _mm512_loadu_ps(v + 16 * i);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) a[g][i] = _mm512_fmadd_ps(_mm512_set1_ps(t.p[g][c]), vv, a[g][i]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) _mm512_storeu_ps(t.acc[g] + 16 * i, a[g][i]);
  }

  template <int G>
  static void values_g(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0, int64_t c1,
                       int64_t dim) {
    switch (dim / 16) {
      case 1: return values_of<G, 1>(t, values, v_row, index, c0, c1);
      case 2: return values_of<G, 2>(t, values, v_row, index, c0, c1);
      case 3: return values_of<G, 3>(t, values, v_row, index, c0, c1);
      case 4: return values_of<G, 4>(t, values, v_row, index, c0, c1);
      case 5: return values_of<G, 5>(t, values, v_row, index, c0, c1);
      case 6: return values_of<G, 6>(t, values, v_row, index, c0, c1);
      case 7: return values_of<G, 7>(t, values, v_row, index, c0, c1);
      default: return values_of<G, 8>(t, values, v_row, index, c0, c1);
    }
  }

  static void values(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim) {
    switch (t.rows) {
      case 1: return values_g<1>(t, values, v_row, index, c0, c1, dim);
      case 2: return values_g<2>(t, values, v_row, index, c0, c1, dim);
      case 3: return values_g<3>(t, values, v_row, index, c0, c1, dim);
      default: return values_g<4>(t, values, v_row, index, c0, c1, dim);
    }
  }
};
#include "attention_head.h"
}  // namespace avx512
#pragma GCC pop_options
#endif

#ifdef SF_X86_SIMD
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
// Eight partial sums t[0..7] (8-lane vectors) -> their 8 sums, t[k]'s in lane k: the same tree for every slot
// ((l + l+4), then (0 + 2) + (1 + 3)).
inline __m256 sum8(const __m256 t[8]) {
  __m256 w[4], x[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per vector: lanes i + (i + 4); two per result
    w[i] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * i], t[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(t[2 * i], t[2 * i + 1], 0x31));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // per vector: 2 lanes; four per result
    x[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44), _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], 0x88), _mm256_shuffle_ps(x[0], x[1], 0xDD));
  // z's lanes hold t[0], t[2], t[4], t[6], t[1], t[3], t[5], t[7]: put t[k] in lane k
  return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

struct Ops {  // dim a multiple of 8, at most 8 * kMaxChunks
  static constexpr int kMaxChunks = 16;

  // G rows x (8 / G) keys per sum8 (G = 3: two keys, six slots); slots past the run stay zero.
  template <int G, int NC>
  static void scores_of(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0,
                        int64_t c1, float scale) {
    constexpr int K = 8 / G;
    for (int64_t c = c0; c < c1; c += K) {
      const int64_t n = std::min<int64_t>(K, c1 - c);
      __m256 acc[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      const float* rows[K];
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) rows[k] = keys + index[c + std::min<int64_t>(k, n - 1)] * k_row;
#pragma GCC unroll 16
      for (int d = 0; d < NC; ++d) {
        __m256 q[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) q[g] = _mm256_loadu_ps(t.q[g] + 8 * d);
#pragma GCC unroll 8
        for (int k = 0; k < K; ++k) {
          const __m256 kv = _mm256_loadu_ps(rows[k] + 8 * d);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[g * K + k] = _mm256_fmadd_ps(q[g], kv, acc[g * K + k]);
        }
      }
      const __m256 sums = _mm256_mul_ps(sum8(acc), _mm256_set1_ps(scale));  // lane g * K + k
      alignas(32) float out[8];
      _mm256_store_ps(out, sums);
      for (int g = 0; g < G; ++g)
        for (int64_t k = 0; k < n; ++k) t.p[g][c + k] = out[g * K + k];
    }
  }

  template <int G>
  static void scores_g(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0, int64_t c1,
                       int64_t dim, float scale) {
    switch (dim / 8) {
      case 1: return scores_of<G, 1>(t, keys, k_row, index, c0, c1, scale);
      case 2: return scores_of<G, 2>(t, keys, k_row, index, c0, c1, scale);
      case 3: return scores_of<G, 3>(t, keys, k_row, index, c0, c1, scale);
      case 4: return scores_of<G, 4>(t, keys, k_row, index, c0, c1, scale);
      case 5: return scores_of<G, 5>(t, keys, k_row, index, c0, c1, scale);
      case 6: return scores_of<G, 6>(t, keys, k_row, index, c0, c1, scale);
      case 7: return scores_of<G, 7>(t, keys, k_row, index, c0, c1, scale);
      case 8: return scores_of<G, 8>(t, keys, k_row, index, c0, c1, scale);
      case 9: return scores_of<G, 9>(t, keys, k_row, index, c0, c1, scale);
      case 10: return scores_of<G, 10>(t, keys, k_row, index, c0, c1, scale);
      case 11: return scores_of<G, 11>(t, keys, k_row, index, c0, c1, scale);
      case 12: return scores_of<G, 12>(t, keys, k_row, index, c0, c1, scale);
      case 13: return scores_of<G, 13>(t, keys, k_row, index, c0, c1, scale);
      case 14: return scores_of<G, 14>(t, keys, k_row, index, c0, c1, scale);
      case 15: return scores_of<G, 15>(t, keys, k_row, index, c0, c1, scale);
      default: return scores_of<G, 16>(t, keys, k_row, index, c0, c1, scale);
    }
  }

  static void scores(const Tile& t, const float* keys, int64_t k_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim, float scale) {
    switch (t.rows) {
      case 1: return scores_g<1>(t, keys, k_row, index, c0, c1, dim, scale);
      case 2: return scores_g<2>(t, keys, k_row, index, c0, c1, dim, scale);
      case 3: return scores_g<3>(t, keys, k_row, index, c0, c1, dim, scale);
      default: return scores_g<4>(t, keys, k_row, index, c0, c1, dim, scale);
    }
  }

  static float softmax(float* p, int64_t n, int64_t pad);  // softmax_row (attention_head.h): the same values

  // Each value row loaded once per tile, 32 floats of it at a time: G rows x up to 4 chunks in registers.
  template <int G>
  static void values_g(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0, int64_t c1,
                       int64_t dim) {
    for (int64_t d0 = 0; d0 < dim; d0 += 32) {
      const int chunks = static_cast<int>(std::min<int64_t>(4, (dim - d0) / 8));
      __m256 a[G][4];
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < chunks; ++i) a[g][i] = _mm256_loadu_ps(t.acc[g] + d0 + 8 * i);
      for (int64_t c = c0; c < c1; ++c) {
        const float* v = values + index[c] * v_row + d0;
        for (int i = 0; i < chunks; ++i) {
          const __m256 vv = _mm256_loadu_ps(v + 8 * i);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) a[g][i] = _mm256_fmadd_ps(_mm256_set1_ps(t.p[g][c]), vv, a[g][i]);
        }
      }
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < chunks; ++i) _mm256_storeu_ps(t.acc[g] + d0 + 8 * i, a[g][i]);
    }
  }

  static void values(const Tile& t, const float* values, int64_t v_row, const int32_t* index, int64_t c0, int64_t c1,
                     int64_t dim) {
    switch (t.rows) {
      case 1: return values_g<1>(t, values, v_row, index, c0, c1, dim);
      case 2: return values_g<2>(t, values, v_row, index, c0, c1, dim);
      case 3: return values_g<3>(t, values, v_row, index, c0, c1, dim);
      default: return values_g<4>(t, values, v_row, index, c0, c1, dim);
    }
  }
};
#include "attention_head.h"
float Ops::softmax(float* p, int64_t n, int64_t pad) { return softmax_row(p, n, pad); }
}  // namespace avx2
#pragma GCC pop_options
#endif

using HeadFn = void (*)(const Problem&, int64_t, Work&);

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
    Work w{std::unique_ptr<float[]>(new float[group_rows * pad]), std::unique_ptr<float[]>(new float[group_rows * dim]),
           pad};  // every place written before it is read
    for (int64_t h = h0; h < h1; ++h) fn(pr, h, w);
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
  m.def("isa", &best_isa, "the instruction set attend uses on this CPU (for 16-multiple head widths)");
  m.def("supported_isas", &supported_isas, "every instruction set this CPU runs, best first");
  // attend's C++ entry point, for the native layer loop (native_layers.cpp) to call without Python
  m.attr("_attend_capsule") = py::capsule(reinterpret_cast<void*>(&attend), "specfamily.attention.v1");
}
