// AVX-512F's Ops for attention.cpp: included once, inside its `avx512` namespace and target region (before
// attention_head.h, whose loops call them). attention.cpp's header comment says which bits they keep.

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
