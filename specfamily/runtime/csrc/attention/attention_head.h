// One key/value head of attention.cpp's pass, included once per instruction set inside its namespace (and target
// region), after that set's `Ops`: the loops and the softmax, whose bits depend only on each key's place in the row's
// visible sequence (attention.cpp's comment says why that is batch-invariant).

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
// (The scalar loop; AVX-512's Ops::softmax computes the same values sixteen places at a time.)
__attribute__((optimize("fp-contract=off"))) inline float softmax_row(float* p, int64_t n, int64_t pad) {
  float top = p[0];
  for (int64_t c = 1; c < n; ++c) top = std::max(top, p[c]);
  for (int64_t c = 0; c < n; ++c) p[c] = exp_of(p[c] - top);
  std::fill(p + n, p + pad, 0.0f);
  float lanes[kLanes] = {};
  for (int64_t c = 0; c < pad; c += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] += p[c + k];
  return lane_sum(lanes);
}

// Key/value head h for fed rows [r0, r1): for each fed row (its visible keys) and each tile of up to kTileRows of the
// group's query heads, a block of kBlock keys at a time (the block stays in L1 across the fed rows and tiles), scores
// then values. A tile's bits do not depend on the other tiles, so the fed rows may be split among threads.
void head(const Problem& pr, int64_t h, int64_t r0, int64_t r1, Work& w) {
  const int64_t dim = pr.dim, pad = w.pad;
  const float* keys = pr.keys + h * pr.k_head;
  const float* values = pr.values + h * pr.v_head;
  std::vector<Tile> tiles;
  std::vector<int64_t> fed;  // each tile's fed row
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t g0 = 0; g0 < pr.groups; g0 += kTileRows) {
      Tile t{};
      t.rows = static_cast<int>(std::min<int64_t>(kTileRows, pr.groups - g0));
      for (int g = 0; g < t.rows; ++g) {
        const int64_t slot = r * pr.groups + g0 + g;  // the row's place in the work buffers
        t.head[g] = h * pr.groups + g0 + g;
        t.q[g] = pr.query + (h * pr.groups + g0 + g) * pr.q_head + r * pr.q_row;
        t.p[g] = w.p.get() + slot * pad;
        t.acc[g] = w.acc.get() + slot * dim;
        std::fill(t.acc[g], t.acc[g] + dim, 0.0f);
      }
      tiles.push_back(t);
      fed.push_back(r);
    }
  std::vector<int64_t> cursor(tiles.size());
  std::vector<float> sums(tiles.size() * kTileRows);
  for (int pass = 0; pass < 2; ++pass) {  // 0: scores, then the softmax; 1: values
    std::fill(cursor.begin(), cursor.end(), 0);
    for (int64_t j0 = 0; j0 < pr.length; j0 += kBlock) {
      const int64_t j1 = std::min(pr.length, j0 + kBlock);
      for (size_t i = 0; i < tiles.size(); ++i) {
        const int32_t* index = pr.index + fed[i] * pr.length;
        const int64_t c0 = cursor[i], c1 = run_end(index, c0, pr.count[fed[i]], j1);
        if (pass == 0)
          Ops::scores(tiles[i], keys, pr.k_row, index, c0, c1, dim, pr.scale);
        else
          Ops::values(tiles[i], values, pr.v_row, index, c0, c1, dim);
        cursor[i] = c1;
      }
    }
    if (pass == 0)
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int g = 0; g < tiles[i].rows; ++g)
          sums[i * kTileRows + g] = Ops::softmax(tiles[i].p[g], pr.count[fed[i]], pad);
  }
  for (size_t i = 0; i < tiles.size(); ++i)
    for (int g = 0; g < tiles[i].rows; ++g) {
      float* o = pr.out + (fed[i] * pr.heads + tiles[i].head[g]) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = tiles[i].acc[g][d] / sums[i * kTileRows + g];
    }
}
