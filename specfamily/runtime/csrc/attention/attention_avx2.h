// AVX2 + FMA's Ops for attention.cpp: included once, inside its `avx2` namespace and target region (before
// attention_head.h, whose loops call them). attention.cpp's header comment says which bits they keep.

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
