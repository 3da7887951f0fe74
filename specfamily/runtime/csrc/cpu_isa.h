// The x86 instruction-set detection every C++ kernel shares (stream_linear.cpp, attention/, int8/): SF_X86_SIMD where
// GCC on x86-64 compiles the vector paths (each in a target pragma's region, so the files build with baseline flags),
// and which of those sets this CPU runs. Each kernel's supported_isas() orders them as its own measurements say.

#pragma once

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__) && !defined(__clang__)
#define SF_X86_SIMD 1
#include <immintrin.h>
#endif

namespace specfamily {

// What this CPU runs of the sets the kernels have loops for (all false without SF_X86_SIMD).
struct CpuSets {
  bool avx512f = false;   // AVX-512F
  bool avx2_fma = false;  // AVX2 and FMA
  bool vnni = false;      // AVX-512 VNNI, VBMI and BW (the int8 kernel's 16-bit activation path)
};

inline CpuSets cpu_sets() {
  CpuSets sets;
#ifdef SF_X86_SIMD
  __builtin_cpu_init();
  sets.avx512f = __builtin_cpu_supports("avx512f");
  sets.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  sets.vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
              __builtin_cpu_supports("avx512bw");
#endif
  return sets;
}

}  // namespace specfamily
