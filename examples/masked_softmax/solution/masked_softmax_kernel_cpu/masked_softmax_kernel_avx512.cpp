// masked_softmax (avx512 tier): write the compute body here. Every pointer and size is
// unpacked below; the vocabulary of this unit (V, W, load, load_tail, store,
// store_tail, vfmadd, hsum, vexp, ...) is defined above. Keep the arithmetic in fp32
// and let store() round once to the output dtype; handle the tail (a last dimension
// that is not a multiple of W) with load_tail/store_tail.
//   x: [x_size0, x_size1, x_size2, x_size3] T (bf16/fp32), contiguous
//   mask: [mask_size0, mask_size1, mask_size2, mask_size3] bool, contiguous
//   out: shape of x, T (dtype of x)
// ---- double vectors for masked_softmax (8 doubles: half a V) ----
using DV = __m512d;
inline DV dv_set1(double a) { return _mm512_set1_pd(a); }
inline DV dv_add(DV a, DV b) { return _mm512_add_pd(a, b); }
inline DV dv_sub(DV a, DV b) { return _mm512_sub_pd(a, b); }
inline DV dv_mul(DV a, DV b) { return _mm512_mul_pd(a, b); }
inline DV dv_max(DV a, DV b) { return _mm512_max_pd(a, b); }
inline DV dv_fmadd(DV a, DV b, DV c) { return _mm512_fmadd_pd(a, b, c); }
inline DV dv_fnmadd(DV a, DV b, DV c) { return _mm512_fnmadd_pd(a, b, c); }
inline DV dv_round(DV a) { return _mm512_roundscale_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline DV dv_load(const double* p) { return _mm512_loadu_pd(p); }
inline void dv_store(double* p, DV v) { _mm512_storeu_pd(p, v); }
inline double dv_hmax(DV a) { return _mm512_reduce_max_pd(a); }
inline double dv_hsum(DV a) { return _mm512_reduce_add_pd(a); }
// 2^n for integral n in [-1010, 0], through the exponent bits
inline DV dv_pow2(DV n) {
  const DV magic = dv_set1(6755399441055744.0);  // 1.5 * 2^52: n's integer lands in the low bits
  const __m512i ni = _mm512_sub_epi64(_mm512_castpd_si512(_mm512_add_pd(n, magic)), _mm512_castpd_si512(magic));
  return _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(ni, _mm512_set1_epi64(1023)), 52));
}
inline DV dv_keep_ge(DV x, double lo, DV v) {
  return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(x, dv_set1(lo), _CMP_GE_OQ), v);
}
inline DV dv_blend(DV mask, DV a, DV b) { return _mm512_mask_blend_pd(_mm512_movepi64_mask(_mm512_castpd_si512(mask)), b, a); }
inline DV lo_pd(V v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline DV hi_pd(V v) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }
inline V join_ps(DV lo, DV hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1); }
// the kept lanes of n (<= W) mask bytes, as all-ones double lanes
inline void mask_pair(const bool* m, int64_t n, DV& lo, DV& hi) {
  alignas(16) uint8_t bytes[16] = {};
  std::memcpy(bytes, m, static_cast<size_t>(n));
  const __mmask16 k = _mm_cmpneq_epi8_mask(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes)), _mm_setzero_si128());
  lo = _mm512_castsi512_pd(_mm512_movm_epi64(static_cast<__mmask8>(k & 0xFF)));
  hi = _mm512_castsi512_pd(_mm512_movm_epi64(static_cast<__mmask8>(k >> 8)));
}

// masked_softmax, computed in double (the float64 reference's arithmetic): each
// element is rounded once, to float then to the dtype, like the reference. The
// row's scaled values and then its exps live in a per-thread double buffer.
// exp(x) for x <= 0 to ~1 ulp double: x = n ln2 + r (|r| <= ln2/2, n ln2 exact with
// ln2's high part), Taylor series to r^13 (truncation < 1e-17), times 2^n built in
// the exponent bits; x < -700 (and -inf: masked lanes) gives exactly 0.
inline DV dexp(DV x) {
  const DV xc = dv_max(x, dv_set1(-700.0));
  const DV n = dv_round(dv_mul(xc, dv_set1(1.4426950408889634)));
  DV r = dv_fnmadd(n, dv_set1(6.93147180369123816490e-01), xc);
  r = dv_fnmadd(n, dv_set1(1.90821492927058770002e-10), r);
  DV p = dv_set1(1.0 / 6227020800.0);  // 1/13!
  p = dv_fmadd(p, r, dv_set1(2.08767569878681e-09));
  p = dv_fmadd(p, r, dv_set1(2.505210838544172e-08));
  p = dv_fmadd(p, r, dv_set1(2.755731922398589e-07));
  p = dv_fmadd(p, r, dv_set1(2.7557319223985893e-06));
  p = dv_fmadd(p, r, dv_set1(2.48015873015873e-05));
  p = dv_fmadd(p, r, dv_set1(0.0001984126984126984));
  p = dv_fmadd(p, r, dv_set1(0.001388888888888889));
  p = dv_fmadd(p, r, dv_set1(0.008333333333333333));
  p = dv_fmadd(p, r, dv_set1(0.041666666666666664));
  p = dv_fmadd(p, r, dv_set1(0.16666666666666666));
  p = dv_fmadd(p, r, dv_set1(0.5));
  p = dv_fmadd(p, r, dv_set1(1.0));
  p = dv_fmadd(p, r, dv_set1(1.0));
  return dv_keep_ge(x, -700.0, dv_mul(p, dv_pow2(n)));
}

template <typename T>
inline void masked_softmax_row(const T* x, const bool* m, T* y, int64_t S, double scale, double* buf) {
  constexpr int64_t H2 = W / 2;  // doubles per DV
  const DV sc = dv_set1(scale), ninf = dv_set1(-INFINITY);
  DV mx = ninf;
  for (int64_t i = 0; i < S; i += W) {
    const int64_t n = std::min<int64_t>(W, S - i);
    const V xv = n == W ? load(x + i) : load_tail(x + i, n);
    DV ml, mh;
    mask_pair(m + i, n, ml, mh);
    const DV sl = dv_blend(ml, dv_mul(lo_pd(xv), sc), ninf);
    const DV sh = dv_blend(mh, dv_mul(hi_pd(xv), sc), ninf);
    dv_store(buf + i, sl);
    dv_store(buf + i + H2, sh);
    mx = dv_max(mx, dv_max(sl, sh));
  }
  const double top = dv_hmax(mx);
  if (top == -INFINITY) {  // no kept element: the reference's NaN row, nan_to_num'd to 0
    for (int64_t i = 0; i < S; i += W) {
      const int64_t n = std::min<int64_t>(W, S - i);
      if (n == W) store(y + i, vzero()); else store_tail(y + i, vzero(), n);
    }
    return;
  }
  const DV mv = dv_set1(top);
  DV sum = dv_set1(0.0);
  for (int64_t i = 0; i < S; i += W) {
    const DV el = dexp(dv_sub(dv_load(buf + i), mv)), eh = dexp(dv_sub(dv_load(buf + i + H2), mv));
    dv_store(buf + i, el);
    dv_store(buf + i + H2, eh);
    sum = dv_add(sum, dv_add(el, eh));
  }
  // times 1 / sum, as ATen's own softmax kernel does (no division per element)
  const DV inv = dv_set1(1.0 / dv_hsum(sum));
  for (int64_t i = 0; i < S; i += W) {
    const int64_t n = std::min<int64_t>(W, S - i);
    const V v = join_ps(dv_mul(dv_load(buf + i), inv), dv_mul(dv_load(buf + i + H2), inv));
    if (n == W) store(y + i, v); else store_tail(y + i, v, n);
  }
}

// ---- bf16 fast path (the AVX2 unit's, at 16 lanes; see its comments) ----
// fp32 exp, screened stores, exact fix-ups; error budget and screen width as
// there (the operations of each lane are the same, VSCALEFPS applies 2^n).
// Its stores round with integer operations, so it uses no AVX512-BF16
// instruction (a row that falls back to the double path does).
constexpr int kMsErrUlps = 6;
constexpr int kMsTieUlps = kMsErrUlps + 1;
constexpr double kMsSumSlack = 0x1.0p-21;

inline __mmask16 ms_keep(const bool* m) {
  return _mm_cmpneq_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)), _mm_setzero_si128());
}
inline __mmask16 ms_keep_tail(const bool* m, int64_t n) {
  return _mm_cmpneq_epi8_mask(_mm_maskz_loadu_epi8(tail_mask(n), m), _mm_setzero_si128());
}

inline V ms_vexp(V t, V c) {
  const V n = _mm512_roundscale_ps(vmul(t, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm512_fnmadd_ps(n, vset1(0.693359375f), t);
  r = _mm512_fnmadd_ps(n, vset1(-2.12194440e-4f), r);
  r = vadd(r, c);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vadd(vfmadd(p, vmul(r, r), r), vset1(1.0f));  // 1 + (r + r^2 P(r)): one rounding at the end
  return _mm512_scalef_ps(p, n);
}

struct MsScale {
  double scale;
  float sh, sl;
  bool fast;
};
inline MsScale ms_scale(double scale) {
  MsScale s{scale, 0.0f, 0.0f, false};
  const float f = static_cast<float>(scale);
  if (!(scale > 0.0) || !std::isfinite(f) || f < 0x1.0p-100f) return s;
  s.sh = std::bit_cast<float>(std::bit_cast<uint32_t>(f) & 0xFFFFFF00u);
  s.sl = static_cast<float>(scale - static_cast<double>(s.sh));
  s.fast = true;
  return s;
}

template <typename T>
inline void ms_row_range(const T* x, const bool* m, int64_t S, float& hi, float& lo) {
  V mx = vset1(-INFINITY), mn = vset1(INFINITY);
  int64_t i = 0;
  for (; i + W <= S; i += W) {
    const V xv = load(x + i);
    const __mmask16 k = ms_keep(m + i);
    mx = _mm512_mask_max_ps(mx, k, mx, xv);
    mn = _mm512_mask_min_ps(mn, k, mn, xv);
  }
  if (i < S) {
    const V xv = load_tail(x + i, S - i);
    const __mmask16 k = ms_keep_tail(m + i, S - i);
    mx = _mm512_mask_max_ps(mx, k, mx, xv);
    mn = _mm512_mask_min_ps(mn, k, mn, xv);
  }
  hi = _mm512_reduce_max_ps(mx);
  lo = _mm512_reduce_min_ps(mn);
}

inline bool ms_fast_row_ok(float hi, float lo, const MsScale& s) {
  const double a = std::max(std::fabs(static_cast<double>(hi)), std::fabs(static_cast<double>(lo))) * s.scale;
  return s.fast && std::isfinite(hi) && std::isfinite(lo) && (static_cast<double>(hi) - lo) * s.scale <= 80.0 && a <= 1024.0;
}

inline V ms_exp_v(V xv, __mmask16 keep, V vsh, V vsl, V vnm) {
  const V p = vmul(xv, vsh);  // exact
  const V t = vadd(p, vnm);
  const V bb = vsub(t, p);    // TwoSum: t + err == p - max exactly
  const V err = vadd(vsub(p, vsub(t, bb)), vsub(vnm, bb));
  const V c = vfmadd(xv, vsl, err);
  return _mm512_maskz_mov_ps(keep, ms_vexp(t, c));
}

template <typename T>
inline double ms_exact_sum(const T* x, const bool* m, int64_t S, double scale, double top) {
  const DV sc = dv_set1(scale), mv = dv_set1(top), ninf = dv_set1(-INFINITY);
  DV sum = dv_set1(0.0);
  for (int64_t i = 0; i < S; i += W) {
    const int64_t n = std::min<int64_t>(W, S - i);
    const V xv = n == W ? load(x + i) : load_tail(x + i, n);
    DV ml, mh;
    mask_pair(m + i, n, ml, mh);
    const DV el = dexp(dv_sub(dv_blend(ml, dv_mul(lo_pd(xv), sc), ninf), mv));
    const DV eh = dexp(dv_sub(dv_blend(mh, dv_mul(hi_pd(xv), sc), ninf), mv));
    sum = dv_add(sum, dv_add(el, eh));
  }
  return dv_hsum(sum);
}

// bf16 bits (RNE, no NaN) of one V as 16 elements, and its screened lanes.
inline __m256i ms_round1(V a, __mmask16& near) {
  const __m512i ba = _mm512_castps_si512(a);
  const __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(ba, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(ba, 16), _mm512_set1_epi32(1)))), 16);
  const __m512i z = _mm512_and_si512(_mm512_add_epi32(ba, _mm512_set1_epi32(kMsTieUlps - 0x8000)), _mm512_set1_epi32(0xFFFF));
  near = static_cast<__mmask16>(near | _mm512_cmplt_epi32_mask(z, _mm512_set1_epi32(2 * kMsTieUlps + 1)));
  return _mm512_cvtepi32_epi16(r);
}
inline bool ms_near_tie(float y) {
  const uint32_t z = (std::bit_cast<uint32_t>(y) + static_cast<uint32_t>(kMsTieUlps - 0x8000)) & 0xFFFFu;
  return z < 2 * kMsTieUlps + 1;
}

inline bool ms_row_fast(const bf16_t* x, const bool* m, bf16_t* y, int64_t S, const MsScale& s, float* e, int64_t* blocks) {
  float hi, lo;
  ms_row_range(x, m, S, hi, lo);
  if (!ms_fast_row_ok(hi, lo, s)) return false;
  const float top = hi * s.sh;
  const V vsh = vset1(s.sh), vsl = vset1(s.sl), vnm = vset1(-top);
  VD s0 = vdzero(), s1 = vdzero();
  int64_t i = 0;
  for (; i + W <= S; i += W) {
    const V ev = ms_exp_v(load(x + i), ms_keep(m + i), vsh, vsl, vnm);
    store(e + i, ev);
    vsum_wide(ev, s0, s1);
  }
  if (i < S) {
    const V ev = ms_exp_v(load_tail(x + i, S - i), ms_keep_tail(m + i, S - i), vsh, vsl, vnm);
    store(e + i, ev);
    vsum_wide(ev, s0, s1);
  }
  const double sum = hsum_d(vdadd(s0, s1));
  if (!(sum >= 0.5 && sum < 0x1.0p100)) return false;  // NaN in a kept lane
  const double inv64 = 1.0 / sum;
  const V inv = vset1(static_cast<float>(inv64));
  int64_t flagged = 0;
  i = 0;
  for (; i + W <= S; i += W) {
    __mmask16 near = 0;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), ms_round1(vmul(load(e + i), inv), near));
    if (__builtin_expect(near != 0, 0)) blocks[flagged++] = i;
  }
  if (i < S) {
    __mmask16 near = 0;
    const __m256i out = ms_round1(vmul(load(e + i), inv), near);
    _mm256_mask_storeu_epi16(y + i, tail_mask(S - i), out);
    if (near != 0) blocks[flagged++] = i;
  }
  if (__builtin_expect(flagged == 0, 1)) return true;
  const double top64 = static_cast<double>(top);  // the fp32 exps' offset
  double exact_inv = 0.0;
  const float invf = static_cast<float>(inv64);
  for (int64_t b = 0; b < flagged; ++b) {
    for (int64_t k = blocks[b]; k < std::min<int64_t>(blocks[b] + W, S); ++k) {
      if (!m[k] || !ms_near_tie(e[k] * invf)) continue;
      const double ek = std::exp(static_cast<double>(bf16_to_float(x[k])) * s.scale - top64);
      const bf16_t below = float_to_bf16(static_cast<float>(ek * inv64 * (1.0 - kMsSumSlack)));
      const bf16_t above = float_to_bf16(static_cast<float>(ek * inv64 * (1.0 + kMsSumSlack)));
      if (below.bits == above.bits) {
        y[k] = below;
        continue;
      }
      if (exact_inv == 0.0) exact_inv = 1.0 / ms_exact_sum(x, m, S, s.scale, top64);
      store_scalar(y + k, ek * exact_inv);
    }
  }
  return true;
}

template <typename T>
static void masked_softmax_body(T* out, const T* x, int64_t x_size0, int64_t x_size1, int64_t x_size2, int64_t x_size3, const bool* mask, int64_t mask_size0, int64_t mask_size1, int64_t mask_size2, int64_t mask_size3, double scale) {
  if (mask_size1 != 1 && mask_size1 != x_size1) {
    throw std::invalid_argument("masked_softmax: mask.size(1) must be 1 or x.size(1)");
  }
  (void)mask_size0;
  (void)mask_size2;
  (void)mask_size3;
  const int64_t S = x_size3, Tq = x_size2, H = x_size1;
  const int64_t rows = x_size0 * H * Tq;
  const bool parallel = rows > 1 && rows * S >= kParallelMinElements;
  const int64_t run = row_run(rows, omp_get_max_threads());
  const MsScale split = ms_scale(scale);
#pragma omp parallel if (parallel)
  {
    std::vector<double> buf(static_cast<size_t>(S + W));
    std::vector<float> e(std::is_same_v<T, bf16_t> ? static_cast<size_t>(S + W) : 0);
    std::vector<int64_t> blocks(std::is_same_v<T, bf16_t> ? static_cast<size_t>(S / W + 1) : 0);
#pragma omp for schedule(dynamic, run)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r % Tq, h = (r / Tq) % H, b = r / (Tq * H);
      const bool* m = mask + ((b * mask_size1 + (mask_size1 == 1 ? 0 : h)) * Tq + t) * S;
      if constexpr (std::is_same_v<T, bf16_t>) {
        if (ms_row_fast(x + r * S, m, out + r * S, S, split, e.data(), blocks.data())) continue;
      }
      masked_softmax_row(x + r * S, m, out + r * S, S, scale, buf.data());
    }
  }
}

void masked_softmax(DType dt_, void* out, const void* x, int64_t x_size0, int64_t x_size1, int64_t x_size2, int64_t x_size3, const bool* mask, int64_t mask_size0, int64_t mask_size1, int64_t mask_size2, int64_t mask_size3, double scale) {
  KERNEL_DISPATCH_DTYPE(dt_, masked_softmax_body<T>(static_cast<T*>(out), static_cast<const T*>(x), x_size0, x_size1, x_size2, x_size3, mask, mask_size0, mask_size1, mask_size2, mask_size3, scale));
}

}  // namespace avx512
}  // namespace masked_softmax_kernel_cpu
