// AVX2 tier: no torch headers.
#include <immintrin.h>

#include "kh_scale_cpu.hpp"

namespace kh_scale_cpu {
void scale_avx2(const float* x, float* out, int64_t n, float alpha) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), a));
  }
  for (; i < n; ++i) out[i] = x[i] * alpha;  // tail
}
}  // namespace kh_scale_cpu
