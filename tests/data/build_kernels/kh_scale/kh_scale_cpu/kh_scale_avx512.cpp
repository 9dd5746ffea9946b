// AVX512 tier: no torch headers.
#include <immintrin.h>
#include <omp.h>

#include "kh_scale_cpu.hpp"

namespace kh_scale_cpu {
void scale_avx512(const float* x, float* out, int64_t n, float alpha) {
  const __m512 a = _mm512_set1_ps(alpha);
  const int64_t full = n / 16 * 16;
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < full; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), a));
  }
  if (full < n) {  // masked tail
    const __mmask16 m = static_cast<__mmask16>((1u << (n - full)) - 1u);
    _mm512_mask_storeu_ps(out + full, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + full), a));
  }
}

// Returns the thread count seen INSIDE a parallel region, so a test can check that
// torch.set_num_threads governs this library's OpenMP runtime too.
int omp_threads_avx512() {
  int seen = 0;
#pragma omp parallel
  {
#pragma omp single
    seen = omp_get_num_threads();
  }
  return seen;
}
}  // namespace kh_scale_cpu
