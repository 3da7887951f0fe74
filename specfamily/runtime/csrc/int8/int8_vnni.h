// The AVX-512 VNNI path of int8_linear.cpp: included once, inside its `vnni` namespace and target region (after
// Problem and kPanel, which it uses).

// AVX-512 VNNI on the same packed panels, the activations as 16-bit integers: row j is x_j ~ a_j * v_j with
// a_j = max_t |x_j[t]| / 32767 and v_j = round(x_j / a_j), written v + 32768 = 256 hi + lo (hi, lo bytes), so
// sum_t Q[t][c] v[t] = 256 (sum_t Q hi - 128 sum_t Q) + sum_t Q lo: two vpdpbusd per 64 weights (4 inputs x 16
// outputs, a panel's 64-byte line put output-major by one vpermb) and per row, exact int32 sums. The rows' rounding
// to 16 bits (2^-16 of each row's largest magnitude) is the only departure from float32 activations.
struct Rows {
  std::vector<uint8_t> hi, lo;  // (k, d4 * 4): the bytes of v + 32768; inputs past d hold v = 0 (0x80, 0)
  std::vector<float> a;         // (k,) the rows' scales
  int64_t d4;                   // ceil(d / 4)
};

Rows split_rows(const float* x, int64_t k, int64_t d) {
  Rows r{std::vector<uint8_t>(k * ((d + 3) / 4) * 4, 0x80), std::vector<uint8_t>(k * ((d + 3) / 4) * 4, 0),
         std::vector<float>(k), (d + 3) / 4};
  for (int64_t j = 0; j < k; ++j) {
    float peak = 0.0f;
    for (int64_t t = 0; t < d; ++t) peak = std::max(peak, std::abs(x[j * d + t]));
    const float a = peak > 0.0f ? peak / 32767.0f : 1.0f;
    r.a[j] = a;
    for (int64_t t = 0; t < d; ++t) {
      const int32_t u = static_cast<int32_t>(std::nearbyint(x[j * d + t] / a)) + 32768;
      r.hi[j * r.d4 * 4 + t] = static_cast<uint8_t>(u >> 8);
      r.lo[j * r.d4 * 4 + t] = static_cast<uint8_t>(u & 255);
    }
  }
  return r;
}

// Panels [q, q + P) times rows [j0, j0 + K) (software prefetching measured no faster here).
template <int P, int K>
void block(const Problem& p, const Rows& r, int64_t q, int64_t j0) {
  __m512i hi[P][K], lo[P][K];
  const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 16
  for (int i = 0; i < P; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) hi[i][j] = lo[i][j] = zero;
  // output-major: byte 4 c + i of the result is byte 16 i + c of the line (input t + i, output c)
  alignas(64) static const uint8_t order[64] = {
      0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54,
      7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61,
      14, 30, 46, 62, 15, 31, 47, 63};
  const __m512i perm = _mm512_load_si512(order);
  const int64_t stride = p.d * kPanel, groups = p.d / 4, rest = p.d - groups * 4;
  const int8_t* w = p.w + q * stride;
  for (int64_t g = 0; g <= groups; ++g) {
    if (g == groups && rest == 0) break;
    __m512i wv[P];
    const __mmask64 mask = g < groups ? ~__mmask64{0} : (__mmask64{1} << (rest * kPanel)) - 1;
#pragma GCC unroll 16
    for (int i = 0; i < P; ++i) {
      const int8_t* line = w + i * stride + g * 4 * kPanel;
      wv[i] = _mm512_permutexvar_epi8(perm, _mm512_maskz_loadu_epi8(mask, line));
    }
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      int32_t h4, l4;
      std::memcpy(&h4, r.hi.data() + (j0 + j) * r.d4 * 4 + g * 4, 4);
      std::memcpy(&l4, r.lo.data() + (j0 + j) * r.d4 * 4 + g * 4, 4);
      const __m512i hv = _mm512_set1_epi32(h4), lv = _mm512_set1_epi32(l4);
#pragma GCC unroll 16
      for (int i = 0; i < P; ++i) {
        hi[i][j] = _mm512_dpbusd_epi32(hi[i][j], hv, wv[i]);
        lo[i][j] = _mm512_dpbusd_epi32(lo[i][j], lv, wv[i]);
      }
    }
  }
  // y = a_j s_c (256 (hi - 128 sum_t Q) + lo) + b
  for (int i = 0; i < P; ++i) {
    const int64_t col = (q + i) * kPanel, cols = std::min(kPanel, p.n - col);
    const __mmask16 m16 = static_cast<__mmask16>((1u << cols) - 1);
    const __m512 scale = _mm512_maskz_loadu_ps(m16, p.s + col);
    const __m512 bias = p.b ? _mm512_maskz_loadu_ps(m16, p.b + col) : _mm512_setzero_ps();
    const __m512i offset = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m16, p.wsum + col), 7);  // 128 sum_t Q
#pragma GCC unroll 16
    for (int j = 0; j < K; ++j) {
      const __m512 h = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi[i][j], offset));
      const __m512 v = _mm512_fmadd_ps(h, _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(lo[i][j]));
      const __m512 a = _mm512_mul_ps(scale, _mm512_set1_ps(r.a[j0 + j]));
      _mm512_mask_storeu_ps(p.y + (j0 + j) * p.n + col, m16, _mm512_fmadd_ps(v, a, bias));
    }
  }
}

// Panels [q0, q1) for rows [j0, j0 + K), P panels at a time: 2 P K accumulators, at most 24 of 32 registers.
template <int K>
void rows_of(const Problem& p, const Rows& r, int64_t q0, int64_t q1, int64_t j0) {
  constexpr int P = K <= 2 ? 4 : (K <= 6 ? 2 : 1);
  int64_t q = q0;
  for (; q + P <= q1; q += P) block<P, K>(p, r, q, j0);
  for (; q < q1; ++q) block<1, K>(p, r, q, j0);
}

void panels(const Problem& p, int64_t q0, int64_t q1) {
  const Rows r = split_rows(p.x, p.k, p.d);
  for (int64_t j = 0; j < p.k; j += 8) {
    switch (std::min<int64_t>(8, p.k - j)) {
      case 1: rows_of<1>(p, r, q0, q1, j); break;
      case 2: rows_of<2>(p, r, q0, q1, j); break;
      case 3: rows_of<3>(p, r, q0, q1, j); break;
      case 4: rows_of<4>(p, r, q0, q1, j); break;
      case 5: rows_of<5>(p, r, q0, q1, j); break;
      case 6: rows_of<6>(p, r, q0, q1, j); break;
      case 7: rows_of<7>(p, r, q0, q1, j); break;
      default: rows_of<8>(p, r, q0, q1, j); break;
    }
  }
}

