// AVX-512F's loops for attention.cpp: included once, inside its `avx512` namespace and target region. Scores take
// four query rows to a vector, lanes 4b + m holding row b's partial sum over d = m mod 4, against a key's four
// floats at a time broadcast to the four rows (no shuffle per FMA); each score is then ((m0 + m1) + (m2 + m3)) * scale,
// the same ops whatever the row's or key's slot. A plain pass's 3 query rows of a head take one vector (16 FMAs a
// key of 64 wide), a chain's 15 four. The softmax and the values are attention_head.h's loops (Ops below).
// attention.cpp's header comment says which bits they keep.

// exp_of (attention_head.h) on 16 lanes, op for op. The build contracts its products and sums into fused
// multiply-adds (-ffp-contract=fast, GCC's default; exp_of itself is built with contraction off), so its bits
// can differ from the scalar function's in the last place; every row and slot of this path takes exp16 (tails
// masked), so a row's bits still depend only on its own scores.
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

struct Ops {  // dim a multiple of 16, at most kMaxChunks chunks (the softmax and the values)
  static constexpr int kMaxChunks = 8;

  // softmax_row (attention_head.h), sixteen places at a time: the same values.
  static float softmax(float* p, int64_t n, int64_t pad) {
    // the maximum in four independent chains (one chain waited on each masked load and max: ~half the softmax at
    // 5 fed rows); a maximum is exact in any order
    const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 top[4] = {low, low, low, low};
    int64_t c = 0;
    for (; c + 64 <= n; c += 64)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) top[i] = _mm512_max_ps(top[i], _mm512_loadu_ps(p + c + 16 * i));
    for (; c < n; c += 16) top[0] = _mm512_max_ps(top[0], _mm512_mask_loadu_ps(low, tail(n - c), p + c));
    const __m512 most = _mm512_set1_ps(
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(top[0], top[1]), _mm512_max_ps(top[2], top[3]))));
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
        __m512 vv = _mm512_loadu_ps(v + 16 * i);
        __asm__("" : "+v"(vv));  // one load for the G rows, not G loads folded into the FMAs (-11% at 5 fed rows)
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

// Partial sums of Q quads of query rows against K keys: acc[q * K + k]'s lane 4b + m = sum over t of quad q's lane
// 4b + m at step t (row b's q[4t + m]) times key k's float 4t + m, one chain of FMAs in order of t; each key's
// broadcast shared by the quads. Key after key, each key's floats in address order: from memory (a pass's caches)
// that read 1 row's keys as fast as the dot-product loop did; step-major order (t outer, keys inner) was 10% slower
// there at 1 row, though faster with the keys in L2.
template <int Q, int K, int NT>
inline void quad_partials(const float* qt, const float* const* key, __m512* acc) {
#pragma GCC unroll 16
  for (int i = 0; i < Q * K; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k)
#pragma GCC unroll 32
    for (int t = 0; t < NT; ++t) {
      const __m512 kv = _mm512_broadcast_f32x4(_mm_loadu_ps(key[k] + 4 * t));
#pragma GCC unroll 2
      for (int i = 0; i < Q; ++i)
        acc[i * K + k] = _mm512_fmadd_ps(_mm512_loadu_ps(qt + (i * NT + t) * 16), kv, acc[i * K + k]);
    }
}

// Four keys' partial sums -> their scores before the scale, lane 4b + k: row b's score of key k, (m0 + m1) + (m2 + m3).
inline __m512 quad_sums(const __m512* a) {
  // a0m0 a1m0 a0m1 a1m1 and a0m2 a1m2 a0m3 a1m3 per 128 bits, then the same of a2, a3
  const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
  const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
  const __m512 m0 = _mm512_shuffle_ps(t0, t2, 0x44), m1 = _mm512_shuffle_ps(t0, t2, 0xEE);  // a0mi a1mi a2mi a3mi
  const __m512 m2 = _mm512_shuffle_ps(t1, t3, 0x44), m3 = _mm512_shuffle_ps(t1, t3, 0xEE);
  return _mm512_add_ps(_mm512_add_ps(m0, m1), _mm512_add_ps(m2, m3));
}

// p[b][j] = row b's score of key j for j in [j0, j1), rows b < rows of Q quads (qt: NT steps of 16 lanes a quad).
template <int Q, int NT>
void quad_scores_of(const float* qt, const float* keys, int64_t k_row, int64_t j0, int64_t j1, float scale,
                    float* const* p, int rows) {
  for (int64_t j = j0; j < j1; j += 8) {
    const int64_t n = std::min<int64_t>(8, j1 - j);
    const float* key[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) key[k] = keys + (j + std::min<int64_t>(k, n - 1)) * k_row;
    __m512 acc[Q * 8];
    quad_partials<Q, 8, NT>(qt, key, acc);
    alignas(64) float out[2 * Q][16];  // [quad * 2 + half]: lane 4b + k, key j + 4 * half + k
#pragma GCC unroll 4
    for (int i = 0; i < 2 * Q; ++i)
      _mm512_store_ps(out[i], _mm512_mul_ps(quad_sums(acc + 4 * i), _mm512_set1_ps(scale)));
    for (int b = 0; b < rows; ++b)
      for (int half = 0; half < 2; ++half) {
        const float* o = out[b / 4 * 2 + half] + 4 * (b % 4);
        const int64_t c = j + 4 * half, live = std::min<int64_t>(4, n - 4 * half);
        if (live == 4)
          _mm_storeu_ps(p[b] + c, _mm_load_ps(o));
        else
          for (int64_t k = 0; k < live; ++k) p[b][c + k] = o[k];
      }
  }
}

template <int NT>
void quad_scores_q(const float* qt, const float* keys, int64_t k_row, int64_t j0, int64_t j1, float scale,
                   float* const* p, int rows) {
  if (rows > 4) return quad_scores_of<2, NT>(qt, keys, k_row, j0, j1, scale, p, rows);
  quad_scores_of<1, NT>(qt, keys, k_row, j0, j1, scale, p, rows);
}

// Up to 8 rows (two quads).
inline void quad_scores(const float* qt, const float* keys, int64_t k_row, int64_t j0, int64_t j1, int64_t dim,
                        float scale, float* const* p, int rows) {
  switch (dim / 16) {
    case 1: return quad_scores_q<4>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 2: return quad_scores_q<8>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 3: return quad_scores_q<12>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 4: return quad_scores_q<16>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 5: return quad_scores_q<20>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 6: return quad_scores_q<24>(qt, keys, k_row, j0, j1, scale, p, rows);
    case 7: return quad_scores_q<28>(qt, keys, k_row, j0, j1, scale, p, rows);
    default: return quad_scores_q<32>(qt, keys, k_row, j0, j1, scale, p, rows);
  }
}

// The query rows of fed rows [r0, r1): slot s = (fed row - r0) * groups + its head's place in the group; its scores
// and probabilities at w.p + s * pad, its value accumulator at w.acc + s * dim; qt: four slots a quad, dim / 4 steps.
struct Rows {
  std::vector<int64_t> fed, head;
  std::vector<float*> p;
  int64_t n;
};

Rows lay_out(const Problem& pr, int64_t h, int64_t r0, int64_t r1, Work& w) {
  Rows rows{{}, {}, {}, pr.groups * (r1 - r0)};
  w.qt.assign((rows.n + 3) / 4 * 4 * pr.dim, 0.0f);
  for (int64_t s = 0; s < rows.n; ++s) {
    const int64_t r = r0 + s / pr.groups, qh = h * pr.groups + s % pr.groups;
    rows.fed.push_back(r);
    rows.head.push_back(qh);
    rows.p.push_back(w.p.get() + s * w.pad);
    const float* q = pr.query + qh * pr.q_head + r * pr.q_row;
    float* qt = w.qt.data() + s / 4 * 4 * pr.dim + 4 * (s % 4);
    for (int64_t d = 0; d < pr.dim; ++d) qt[d / 4 * 16 + d % 4] = q[d];
  }
  return rows;
}

// How many of a row's n visible places are keys 0, 1, ... (index[c] == c): the indices ascend without repeats, so
// index[c] == c holds exactly for c below the first key the row skips; found by halving. A tree node sees the whole
// cache and a few of the fed keys, so its scores need forwarding only past the cache (tens of places, not hundreds).
inline int64_t seen_prefix(const int32_t* index, int64_t n) {
  int64_t lo = 0, hi = n;  // index[c] == c for c < lo; index[c] > c for c >= hi
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (index[mid] == mid)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Key/value head h for fed rows [r0, r1): every key's scores, four query rows at a time a block of kBlock keys at a
// time (the block stays in L1 across the quads), key by key; a row that does not see a prefix of the keys (a tree
// node) gathers its own into place order; then attention_head.h's softmax and values per tile.
void head(const Problem& pr, int64_t h, int64_t r0, int64_t r1, Work& w) {
  const int64_t dim = pr.dim;
  const float* keys = pr.keys + h * pr.k_head;
  const Rows rows = lay_out(pr, h, r0, r1, w);
  for (int64_t j0 = 0; j0 < pr.length; j0 += kBlock)
    for (int64_t s = 0; s < rows.n; s += 8)
      quad_scores(w.qt.data() + s * dim, keys, pr.k_row, j0, std::min(pr.length, j0 + kBlock), dim, pr.scale,
                  rows.p.data() + s, static_cast<int>(std::min<int64_t>(8, rows.n - s)));
  std::vector<float> sums(rows.n);
  for (int64_t s = 0; s < rows.n; ++s) {
    const int32_t* index = pr.index + rows.fed[s] * pr.length;
    const int64_t n = pr.count[rows.fed[s]];
    if (n > 0 && index[n - 1] != n - 1)  // not a prefix: index[c] >= c, so forward in place past the prefix it has
      for (int64_t c = seen_prefix(index, n); c < n; ++c) rows.p[s][c] = rows.p[s][index[c]];
    sums[s] = Ops::softmax(rows.p[s], n, w.pad);
  }
  // the values: tiles of up to kTileRows query heads of one fed row, a block of keys at a time
  std::vector<Tile> tiles;
  for (int64_t s = 0; s < rows.n; ++s) {
    if (s % pr.groups == 0 || tiles.back().rows == kTileRows) tiles.push_back(Tile{});
    Tile& t = tiles.back();
    t.p[t.rows] = rows.p[s];
    t.acc[t.rows] = w.acc.get() + s * dim;
    t.head[t.rows] = s;  // the slot
    std::fill(t.acc[t.rows], t.acc[t.rows] + dim, 0.0f);
    ++t.rows;
  }
  const float* values = pr.values + h * pr.v_head;
  std::vector<int64_t> cursor(tiles.size(), 0);
  for (int64_t j0 = 0; j0 < pr.length; j0 += kBlock) {
    const int64_t j1 = std::min(pr.length, j0 + kBlock);
    for (size_t i = 0; i < tiles.size(); ++i) {
      const int64_t fed = rows.fed[tiles[i].head[0]];
      const int32_t* index = pr.index + fed * pr.length;
      const int64_t c0 = cursor[i], c1 = run_end(index, c0, pr.count[fed], j1);
      Ops::values(tiles[i], values, pr.v_row, index, c0, c1, dim);
      cursor[i] = c1;
    }
  }
  for (int64_t s = 0; s < rows.n; ++s) {
    float* o = pr.out + (rows.fed[s] * pr.heads + rows.head[s]) * dim;
    const float* a = w.acc.get() + s * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = a[d] / sums[s];
  }
}
