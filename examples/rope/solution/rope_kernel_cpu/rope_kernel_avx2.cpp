// rope (avx2 tier): write the compute body here. Every pointer and size is
// unpacked below; the vocabulary of this unit (V, W, load, load_tail, store,
// store_tail, vfmadd, hsum, vexp, ...) is defined above. Keep the arithmetic in fp32
// and let store() round once to the output dtype; handle the tail (a last dimension
// that is not a multiple of W) with load_tail/store_tail.
//   q: [q_size0, q_size1, q_size2] T (bf16/fp32), contiguous
//   cos: [cos_size0, cos_size1] fp32, contiguous
//   sin: [sin_size0, sin_size1] fp32, contiguous
//   out: shape of q, T (dtype of q)
// rope: n (<= W) pairs from i: y1 = x1 c - x2 s, y2 = x2 c + x1 s. Computed in double:
// both products are exact there (bf16/fp32 times fp32 needs at most 48 bits), so each
// result is rounded once, to double then float then the dtype — the float64
// reference's own path, bit for bit.
inline __m256d lo_pd(V v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
inline __m256d hi_pd(V v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
inline V join_ps(__m256d lo, __m256d hi) { return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)); }

template <typename T>
inline void rope_block(const T* x, T* y, const float* c, const float* s, int64_t half, int64_t i, int64_t n) {
  const bool full = n == W;
  const V x1 = full ? load(x + i) : load_tail(x + i, n);
  const V x2 = full ? load(x + half + i) : load_tail(x + half + i, n);
  const V cv = full ? load(c + i) : load_tail(c + i, n);
  const V sv = full ? load(s + i) : load_tail(s + i, n);
  const __m256d a1 = lo_pd(x1), b1 = hi_pd(x1), a2 = lo_pd(x2), b2 = hi_pd(x2);
  const __m256d ac = lo_pd(cv), bc = hi_pd(cv), as = lo_pd(sv), bs = hi_pd(sv);
  const V y1 = join_ps(_mm256_fmsub_pd(a1, ac, _mm256_mul_pd(a2, as)), _mm256_fmsub_pd(b1, bc, _mm256_mul_pd(b2, bs)));
  const V y2 = join_ps(_mm256_fmadd_pd(a2, ac, _mm256_mul_pd(a1, as)), _mm256_fmadd_pd(b2, bc, _mm256_mul_pd(b1, bs)));
  if (full) {
    store(y + i, y1);
    store(y + half + i, y2);
  } else {
    store_tail(y + i, y1, n);
    store_tail(y + half + i, y2, n);
  }
}

template <typename T>
static void rope_body(T* out, const T* q, int64_t q_size0, int64_t q_size1, int64_t q_size2, const float* cos, int64_t cos_size0, int64_t cos_size1, const float* sin, int64_t sin_size0, int64_t sin_size1) {
  if (cos_size1 * 2 != q_size2 || sin_size1 != cos_size1) {
    throw std::invalid_argument("rope: cos and sin must have q.size(2) / 2 columns");
  }
  const int64_t half = cos_size1;
  const int64_t rows = q_size0 * q_size1;  // (position, head) pairs, one row of D each
  const bool parallel = rows > 1 && rows * q_size2 >= kParallelMinElements;
  const int64_t run = row_run(rows, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, run) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / q_size1;
    const T* x = q + r * q_size2;
    T* y = out + r * q_size2;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    int64_t i = 0;
    for (; i + W <= half; i += W) rope_block(x, y, c, s, half, i, W);
    if (i < half) rope_block(x, y, c, s, half, i, half - i);
  }
}

void rope(DType dt_, void* out, const void* q, int64_t q_size0, int64_t q_size1, int64_t q_size2, const float* cos, int64_t cos_size0, int64_t cos_size1, const float* sin, int64_t sin_size0, int64_t sin_size1) {
  KERNEL_DISPATCH_DTYPE(dt_, rope_body<T>(static_cast<T*>(out), static_cast<const T*>(q), q_size0, q_size1, q_size2, cos, cos_size0, cos_size1, sin, sin_size0, sin_size1));
}

}  // namespace avx2
}  // namespace rope_kernel_cpu
