// masked_softmax (avx2 tier): write the compute body here. Every pointer and size is
// unpacked below; the vocabulary of this unit (V, W, load, load_tail, store,
// store_tail, vfmadd, hsum, vexp, ...) is defined above. Keep the arithmetic in fp32
// and let store() round once to the output dtype; handle the tail (a last dimension
// that is not a multiple of W) with load_tail/store_tail.
//   x: [x_size0, x_size1, x_size2, x_size3] T (bf16/fp32), contiguous
//   mask: [mask_size0, mask_size1, mask_size2, mask_size3] bool, contiguous
//   out: shape of x, T (dtype of x)
// ---- double vectors for masked_softmax (4 doubles: half a V) ----
using DV = __m256d;
inline DV dv_set1(double a) { return _mm256_set1_pd(a); }
inline DV dv_add(DV a, DV b) { return _mm256_add_pd(a, b); }
inline DV dv_sub(DV a, DV b) { return _mm256_sub_pd(a, b); }
inline DV dv_mul(DV a, DV b) { return _mm256_mul_pd(a, b); }
inline DV dv_max(DV a, DV b) { return _mm256_max_pd(a, b); }
inline DV dv_fmadd(DV a, DV b, DV c) { return _mm256_fmadd_pd(a, b, c); }
inline DV dv_fnmadd(DV a, DV b, DV c) { return _mm256_fnmadd_pd(a, b, c); }
inline DV dv_round(DV a) { return _mm256_round_pd(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline DV dv_load(const double* p) { return _mm256_loadu_pd(p); }
inline void dv_store(double* p, DV v) { _mm256_storeu_pd(p, v); }
inline double dv_hmax(DV a) {
  const __m128d m = _mm_max_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return std::max(_mm_cvtsd_f64(m), _mm_cvtsd_f64(_mm_unpackhi_pd(m, m)));
}
inline double dv_hsum(DV a) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(s) + _mm_cvtsd_f64(_mm_unpackhi_pd(s, s));
}
// 2^n for integral n in [-1010, 0], through the exponent bits
inline DV dv_pow2(DV n) {
  const DV magic = dv_set1(6755399441055744.0);  // 1.5 * 2^52: n's integer lands in the low bits
  const __m256i ni = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(n, magic)), _mm256_castpd_si256(magic));
  return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(ni, _mm256_set1_epi64x(1023)), 52));
}
inline DV dv_keep_ge(DV x, double lo, DV v) { return _mm256_and_pd(_mm256_cmp_pd(x, dv_set1(lo), _CMP_GE_OQ), v); }
inline DV dv_blend(DV mask, DV a, DV b) { return _mm256_blendv_pd(b, a, mask); }
inline DV lo_pd(V v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
inline DV hi_pd(V v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
inline V join_ps(DV lo, DV hi) { return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo)); }
// the kept lanes of n (<= W) mask bytes, as all-ones double lanes
inline void mask_pair(const bool* m, int64_t n, DV& lo, DV& hi) {
  alignas(16) uint8_t bytes[16] = {};
  std::memcpy(bytes, m, static_cast<size_t>(n));
  const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_cvtepu8_epi64(b), zero));
  hi = _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_cvtepu8_epi64(_mm_srli_si128(b, 4)), zero));
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

// ---- bf16 fast path: fp32 exp, screened stores, exact fix-ups ----
// A bf16 row is computed in fp32 (exps kept in an fp32 scratch row, summed in
// double) when its kept values are tame (see ms_fast_row_ok); every output is
// then within kMsErrUlps fp32 ulps of the exact softmax (derivation at
// kMsErrUlps), so its bf16 rounding can differ from the reference's only when
// the fp32 value lies within kMsTieUlps of a bf16 tie. Those lanes (15 bit
// patterns in 65536, ~1 lane in 4400) are screened and recomputed in double:
// exp(x) exactly, and the row's sum as an interval around the fp32 exps' sum,
// which settles ~2 in 3 of them; the rest take the row's exact double sum
// (ms_exact_sum, once per row). Other rows (and fp32/fp16 rows) take
// masked_softmax_row, the double path above.
//
// Error budget, in units u = 2^-24 relative (1 fp32 ulp >= 1 u):
//   e = exp(t + c): t + c is x*scale - max to ~2^-30 absolute (x*sh and its
//   sum with -max exact by TwoSum, x*sl and the scale split's residual tiny
//   for |x*scale| <= 1024), then vexp's reduction and degree-6 polynomial:
//   measured <= 1.66 u over t in [-81, 1] with c in +-2^-5 (33 M random
//   and grid points against double exp, on the Ice Lake development box); taken as 2 u.
//   sum of e in double: within 2 u of the exact sum (each term is).
//   inv = float(1 / sum): 1 u.  y = e * inv rounded: 1 u.
//   total <= 2 + 2 + 1 + 1 = 6 u <= 6 ulps of y.
// A lane whose fp32 bits lie more than 7 ulps from a bf16 tie therefore
// rounds to the reference's bf16 value (the reference rounds the exact value
// to fp32 first, which moves it by at most half an ulp).
constexpr int kMsErrUlps = 6;
// The fp32 exps' double sum is within 2 u of the exact sum; the fix-ups allow 8 u.
constexpr double kMsSumSlack = 0x1.0p-21;
constexpr int kMsTieUlps = kMsErrUlps + 1;

// keep lanes of 8 mask bytes (all ones where kept)
inline __m256i ms_keep(const bool* m) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m));
  return _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(b), _mm256_setzero_si256());
}
inline __m256i ms_keep_tail(const bool* m, int64_t n) {
  alignas(8) bool bytes[W] = {};
  std::memcpy(bytes, m, static_cast<size_t>(n));
  return ms_keep(bytes);
}

// exp(t + c) for t in [-81, 1] and |c| <= 2^-5 (c folded into the reduced
// argument, so it is not lost to t's rounding); the result is a normal float,
// 2^n applied with one multiply.
inline V ms_vexp(V t, V c) {
  const V n = _mm256_round_ps(vmul(t, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm256_fnmadd_ps(n, vset1(0.693359375f), t);
  r = _mm256_fnmadd_ps(n, vset1(-2.12194440e-4f), r);
  r = vadd(r, c);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vadd(vfmadd(p, vmul(r, r), r), vset1(1.0f));  // 1 + (r + r^2 P(r)): one rounding at the end
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return vmul(p, _mm256_castsi256_ps(bits));
}

// The scale split once per call: sh keeps scale's top 16 bits (so x * sh is
// exact in fp32 for a bf16 x), sl the rest.
struct MsScale {
  double scale;
  float sh, sl;
  bool fast;  // scale > 0 and finite: the fast path applies
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

// Pass 1: the kept values' max and min (unscaled), -inf/+inf when none.
template <typename T>
inline void ms_row_range(const T* x, const bool* m, int64_t S, float& hi, float& lo) {
  const V ninf = vset1(-INFINITY), pinf = vset1(INFINITY);
  V mx = ninf, mn = pinf;
  int64_t i = 0;
  for (; i + W <= S; i += W) {
    const V xv = load(x + i), k = _mm256_castsi256_ps(ms_keep(m + i));
    mx = vmax(mx, _mm256_blendv_ps(ninf, xv, k));
    mn = vmin(mn, _mm256_blendv_ps(pinf, xv, k));
  }
  if (i < S) {
    const V xv = load_tail(x + i, S - i), k = _mm256_castsi256_ps(ms_keep_tail(m + i, S - i));
    mx = vmax(mx, _mm256_blendv_ps(ninf, xv, k));
    mn = vmin(mn, _mm256_blendv_ps(pinf, xv, k));
  }
  hi = hmax(mx);
  lo = -hmax(vsub(vzero(), mn));
}

// The fast path's preconditions: finite kept values (NaN fails the
// comparisons), a spread of at most 80 after scaling (every exp a normal
// float) and |x * scale| <= 1024 (the scale split's residual negligible).
inline bool ms_fast_row_ok(float hi, float lo, const MsScale& s) {
  const double a = std::max(std::fabs(static_cast<double>(hi)), std::fabs(static_cast<double>(lo))) * s.scale;
  return s.fast && std::isfinite(hi) && std::isfinite(lo) && (static_cast<double>(hi) - lo) * s.scale <= 80.0 && a <= 1024.0;
}

// Pass 2 for one V at i: e = exp(x*scale - max) on kept lanes, 0 elsewhere.
inline V ms_exp_v(V xv, __m256i keep, V vsh, V vsl, V vnm) {
  const V p = vmul(xv, vsh);  // exact
  const V t = vadd(p, vnm);
  const V bb = vsub(t, p);    // TwoSum: t + err == p - max exactly
  const V err = vadd(vsub(p, vsub(t, bb)), vsub(vnm, bb));
  const V c = vfmadd(xv, vsl, err);
  return _mm256_and_ps(ms_vexp(t, c), _mm256_castsi256_ps(keep));
}

// The exact double sum of the row's exps (the double path's arithmetic), for
// the fix-ups of a row with screened lanes.
template <typename T>
inline double ms_exact_sum(const T* x, const bool* m, int64_t S, double scale, double top) {
  const DV sc = dv_set1(scale), mv = dv_set1(top), ninf = dv_set1(-INFINITY);
  DV sum = dv_set1(0.0);
  for (int64_t i = 0; i < S; i += W) {
    const int64_t n = std::min<int64_t>(W, S - i);
    const V xv = n == W ? load(x + i) : load_tail(x + i, n);
    const __m256i k = n == W ? ms_keep(m + i) : ms_keep_tail(m + i, n);
    const DV ml = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(k)));
    const DV mh = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(k, 1)));
    const DV el = dexp(dv_sub(dv_blend(ml, dv_mul(lo_pd(xv), sc), ninf), mv));
    const DV eh = dexp(dv_sub(dv_blend(mh, dv_mul(hi_pd(xv), sc), ninf), mv));
    sum = dv_add(sum, dv_add(el, eh));
  }
  return dv_hsum(sum);
}

// bf16 bits of two V (RNE; no NaN reaches here) as 16 elements in order, and
// the screen: lanes whose fp32 bits lie within kMsTieUlps of a bf16 tie.
inline __m256i ms_round2(V a, V b, __m256i& near) {
  const __m256i ba = _mm256_castps_si256(a), bb = _mm256_castps_si256(b);
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF);
  const __m256i ra = _mm256_srli_epi32(_mm256_add_epi32(ba, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(ba, 16), one))), 16);
  const __m256i rb = _mm256_srli_epi32(_mm256_add_epi32(bb, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(bb, 16), one))), 16);
  const __m256i low = _mm256_set1_epi32(0xFFFF), shift = _mm256_set1_epi32(kMsTieUlps - 0x8000);
  const __m256i width = _mm256_set1_epi32(2 * kMsTieUlps + 1);
  const __m256i za = _mm256_and_si256(_mm256_add_epi32(ba, shift), low);
  const __m256i zb = _mm256_and_si256(_mm256_add_epi32(bb, shift), low);
  near = _mm256_or_si256(near, _mm256_or_si256(_mm256_cmpgt_epi32(width, za), _mm256_cmpgt_epi32(width, zb)));
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xD8);
}
inline bool ms_near_tie(float y) {
  const uint32_t z = (std::bit_cast<uint32_t>(y) + static_cast<uint32_t>(kMsTieUlps - 0x8000)) & 0xFFFFu;
  return z < 2 * kMsTieUlps + 1;
}

// One bf16 row by the fast path; false (nothing written) when the row does not qualify.
// blocks: scratch for the starts of screened blocks (S / (2 W) + 1 entries).
inline bool ms_row_fast(const bf16_t* x, const bool* m, bf16_t* y, int64_t S, const MsScale& s, float* e, int64_t* blocks) {
  float hi, lo;
  ms_row_range(x, m, S, hi, lo);
  if (!ms_fast_row_ok(hi, lo, s)) return false;
  const float top = hi * s.sh;  // exact, and the max of the kept x * sh
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
    store(e + i, ev);  // the scratch row is padded to whole 2 * W blocks
    store(e + i + W, vzero());
    vsum_wide(ev, s0, s1);
  }
  const double sum = hsum_d(vdadd(s0, s1));
  if (!(sum >= 0.5 && sum < 0x1.0p100)) return false;  // NaN in a kept lane
  const double inv64 = 1.0 / sum;
  const V inv = vset1(static_cast<float>(inv64));
  int64_t flagged = 0;
  i = 0;
  for (; i + 2 * W <= S; i += 2 * W) {
    __m256i near = _mm256_setzero_si256();
    const __m256i out = ms_round2(vmul(load(e + i), inv), vmul(load(e + i + W), inv), near);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), out);
    if (__builtin_expect(!_mm256_testz_si256(near, near), 0)) blocks[flagged++] = i;
  }
  if (i < S) {
    __m256i near = _mm256_setzero_si256();
    alignas(32) bf16_t tmp[2 * W];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), ms_round2(vmul(load(e + i), inv), vmul(load(e + i + W), inv), near));
    std::memcpy(y + i, tmp, static_cast<size_t>(S - i) * sizeof(bf16_t));
    if (!_mm256_testz_si256(near, near)) blocks[flagged++] = i;
  }
  if (__builtin_expect(flagged == 0, 1)) return true;
  // Fix-ups of the screened lanes: exp(x) in double; the exact value lies
  // within kMsSumSlack of e * inv64 (the sum's error), and rounding is
  // monotone, so when both ends of that interval give one bf16 value it is
  // the reference's; otherwise divide by the exact double sum.
  // The offset the fp32 exps used (hi * sh, exact), so that ek and inv64 agree.
  const double top64 = static_cast<double>(top);
  double exact_inv = 0.0;
  const float invf = static_cast<float>(inv64);
  for (int64_t b = 0; b < flagged; ++b) {
    for (int64_t k = blocks[b]; k < std::min<int64_t>(blocks[b] + 2 * W, S); ++k) {
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
    std::vector<float> e(std::is_same_v<T, bf16_t> ? static_cast<size_t>(S + 2 * W) : 0);
    std::vector<int64_t> blocks(std::is_same_v<T, bf16_t> ? static_cast<size_t>(S / (2 * W) + 1) : 0);
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

}  // namespace avx2
}  // namespace masked_softmax_kernel_cpu
