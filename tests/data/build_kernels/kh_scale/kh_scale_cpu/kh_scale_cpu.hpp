#pragma once

#include <cstdint>

// Tier entry points: raw pointers and sizes only, so the SIMD units need no torch headers.
namespace kh_scale_cpu {
void scale_avx2(const float* x, float* out, int64_t n, float alpha);
void scale_avx512(const float* x, float* out, int64_t n, float alpha);
int omp_threads_avx512();
}  // namespace kh_scale_cpu
