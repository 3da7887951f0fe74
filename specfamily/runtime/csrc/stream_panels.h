// The stream kernel's panel loops' shared types (stream_linear.cpp runs them; stream_small.cpp holds the scalar and
// AVX2 loops, stream_linear.cpp the AVX-512 ones).

#pragma once

#include <cstdint>

#include "cpu_isa.h"
#include "stream_pack.h"

namespace specfamily::stream {

constexpr int64_t kMaxRows = 16;           // rows of x one call of the instruction set's panels multiplies

// One product's rows: y = x packed^T + b.
struct Problem {
  const float* x;  // (k, d) contiguous
  const float* w;  // (panels, d, kPanel) packed
  const float* b;  // (n,) or nullptr
  float* y;        // (k, n)
  int64_t k, d, n;
};

using PanelsFn = void (*)(const Problem&, int64_t, int64_t);

// Panels [q0, q1) for every row of x, one loop an instruction set (stream_small.cpp).
void scalar_panels(const Problem& p, int64_t q0, int64_t q1);
#ifdef SF_X86_SIMD
namespace avx2 {
void panels(const Problem& p, int64_t q0, int64_t q1);
}  // namespace avx2
#endif

}  // namespace specfamily::stream
