// AVX2 tier of rope_kernel. Raw pointers and sizes only, NO torch headers, so a
// one-line edit recompiles this unit in about a second.
// Built with: -mavx2 -mfma -mf16c -fopenmp -ffp-contract=off
//
// Same vocabulary as the AVX512 unit (V = 8 floats). AVX2 has no bf16
// instructions: bf16 stores use the integer round-to-nearest-even trick
// (add 0x7FFF plus the lowest kept bit, keep the high half; NaN stays a
// quiet NaN) — never plain truncation. fp16 goes through F16C. Tails use
// maskload/maskstore for fp32 and a small zero-padded buffer for 16-bit types.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>
#include <cstring>

#include "rope_kernel_tiers.hpp"

namespace rope_kernel_cpu {
namespace avx2 {
namespace {

using V = __m256;
constexpr int64_t W = 8;  // floats per vector

inline V vzero() { return _mm256_setzero_ps(); }
inline V vset1(float a) { return _mm256_set1_ps(a); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline V vabs(V a) { return _mm256_andnot_ps(vset1(-0.0f), a); }
inline V vfmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }  // a*b+c, one rounding
// 1/a to ~2 ulp without a division: rcp (12 bits) plus one Newton step.
inline V vrcp(V a) {
  const V r = _mm256_rcp_ps(a);
  return vmul(r, _mm256_fnmadd_ps(a, r, vset1(2.0f)));
}
inline float hsum(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(V a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) set: compare n against 0..7.
inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Lanes [n, W) replaced by `fill` (e.g. -inf before a max, 0 before a sum).
inline V vfill_tail(V v, int64_t n, float fill) {
  return _mm256_blendv_ps(vset1(fill), v, _mm256_castsi256_ps(tail_mask(n)));
}

// ---- loads: storage dtype -> 8 x fp32 ----
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline V load(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline V load(const fp16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V load_tail(const float* p, int64_t n) { return _mm256_maskload_ps(p, tail_mask(n)); }
template <typename T>
inline V load_tail(const T* p, int64_t n) {
  T buf[W] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
  return load(buf);
}

// ---- stores: 8 x fp32 -> storage dtype, rounded to nearest even ----
inline __m128i to_bf16(V v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  __m256i out = _mm256_srli_epi32(rounded, 16);
  // NaN: keep the sign and payload's high half, force the quiet bit.
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  out = _mm256_blendv_epi8(out, quiet, nan);
  // 8 x u32 (each < 65536) -> 8 x u16 in order.
  const __m256i packed = _mm256_packus_epi32(out, out);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}
inline __m128i to_fp16(V v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline void store(bf16_t* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }
inline void store(fp16_t* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_fp16(v)); }
inline void store_tail(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, tail_mask(n), v); }
template <typename T>
inline void store_tail(T* p, V v, int64_t n) {
  T buf[W];
  store(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(T));
}

// Non-temporal stores (see the AVX512 unit).
// (Callers guarantee the alignment with stream_aligned(); __builtin_assume_aligned says so.)
inline void store_stream(float* p, V v) {
  float* a = static_cast<float*>(__builtin_assume_aligned(p, 32));
  _mm256_stream_ps(a, v);
}
inline void store_stream(bf16_t* p, V v) {
  __m128i* a = static_cast<__m128i*>(__builtin_assume_aligned(p, 16));
  _mm_stream_si128(a, to_bf16(v));
}
inline void store_stream(fp16_t* p, V v) {
  __m128i* a = static_cast<__m128i*>(__builtin_assume_aligned(p, 16));
  _mm_stream_si128(a, to_fp16(v));
}
template <typename T>
inline bool stream_aligned(const T* p) { return reinterpret_cast<uintptr_t>(p) % (W * sizeof(T)) == 0; }
inline void stream_fence() { _mm_sfence(); }

// ---- threads: row_run and for_row_runs live in rope_kernel_tiers.hpp ----

// ---- double-precision helpers (exact sums of squares, rare exact fix-ups) ----
using VD = __m256d;
inline VD vdzero() { return _mm256_setzero_pd(); }
inline VD vdadd(VD a, VD b) { return _mm256_add_pd(a, b); }
inline double hsum_d(VD a) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}
// lo/hi += v*v in double: exact products, sum accurate to ~1e-16.
inline void vsumsq_wide(V v, VD& lo, VD& hi) {
  const VD a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  const VD b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  lo = _mm256_fmadd_pd(a, a, lo);
  hi = _mm256_fmadd_pd(b, b, hi);
}

// lo/hi += v in double (an fp32 sum without rounding drift).
inline void vsum_wide(V v, VD& lo, VD& hi) {
  lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

// Double vectors for dot products summed in double (linear_int8): products of
// an fp32 value and an int8 are exact in double.
constexpr int64_t WD = 4;  // doubles per VD
inline VD vdload(const double* p) { return _mm256_loadu_pd(p); }
inline void vdstore(double* p, VD v) { _mm256_storeu_pd(p, v); }
inline VD vdfmadd(VD a, VD b, VD c) { return _mm256_fmadd_pd(a, b, c); }  // a*b+c
// WD int8 -> WD doubles, exact (the 4-byte load folds into VPMOVSXBD).
inline VD vdload_i8(const int8_t* p) {
  int32_t bytes;
  std::memcpy(&bytes, p, sizeof(bytes));
  return _mm256_cvtepi32_pd(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(bytes)));
}
// One V (W floats) widened to W doubles at p (exact).
inline void vdstore_wide(double* p, V v) {
  _mm256_storeu_pd(p, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  _mm256_storeu_pd(p + WD, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

// Scalar conversions, used only by the fix-ups below (one lane at a time).
inline double to_double(float v) { return v; }
inline double to_double(bf16_t v) { return bf16_to_float(v); }
inline double to_double(fp16_t v) { return _mm256_cvtss_f32(load_tail(&v, 1)); }
inline void store_scalar(float* p, double v) { *p = static_cast<float>(v); }
inline void store_scalar(bf16_t* p, double v) { *p = float_to_bf16(static_cast<float>(v)); }
inline void store_scalar(fp16_t* p, double v) { store_tail(p, vset1(static_cast<float>(v)), 1); }

// Lanes whose fp32 value lies within `ulps` fp32 ulps of a rounding tie of T;
// those are recomputed in double (see the AVX512 unit). fp32 needs none.
inline unsigned near_tie_bits(V y, int keep_mask, int tie, int ulps) {
  const __m256i low = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(keep_mask));
  const __m256i dist = _mm256_abs_epi32(_mm256_sub_epi32(low, _mm256_set1_epi32(tie)));
  const __m256i far = _mm256_cmpgt_epi32(dist, _mm256_set1_epi32(ulps));
  return static_cast<unsigned>(~_mm256_movemask_ps(_mm256_castsi256_ps(far))) & 0xFFu;
}
template <typename T> inline unsigned near_tie(V, int) { return 0; }
template <> inline unsigned near_tie<bf16_t>(V y, int ulps) { return near_tie_bits(y, 0xFFFF, 0x8000, ulps); }
// fp16 also flags every non-zero lane below its normal range (see the AVX512 unit).
template <> inline unsigned near_tie<fp16_t>(V y, int ulps) {
  const V a = vabs(y);
  const V tiny = _mm256_and_ps(_mm256_cmp_ps(a, vset1(0x1.0p-14f), _CMP_LT_OQ), _mm256_cmp_ps(a, vzero(), _CMP_GT_OQ));
  return near_tie_bits(y, 0x1FFF, 0x1000, ulps) | static_cast<unsigned>(_mm256_movemask_ps(tiny));
}

// ---- unchecked stores (see the AVX512 unit) ----
// This unit's bf16 store is exact for denormals, so only near-tie lanes are
// suspect.
template <typename T>
inline void store_fast(T* p, V v) { store(p, v); }
template <typename T> inline unsigned suspect_lanes(V v, int ulps) { return near_tie<T>(v, ulps); }
inline unsigned nan_lanes(V v) { return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))); }

// ---- pairs (see the AVX512 unit): here simply two consecutive vectors ----
template <typename T>
inline void load_pair(const T* p, V& a, V& b) {
  a = load(p);
  b = load(p + W);
}
inline void store_pair_f32(float* p, V a, V b) {
  store(p, a);
  store(p + W, b);
}
template <typename T>
inline void store_pair(T* p, V a, V b) {
  store_fast(p, a);
  store_fast(p + W, b);
}
template <typename T>
inline uint64_t store_pair_fast(T* p, V a, V b, int ulps) {
  store_pair(p, a, b);
  return suspect_lanes<T>(a, ulps) | static_cast<uint64_t>(suspect_lanes<T>(b, ulps)) << W;
}

// A pair's suspect elements without storing (see the AVX512 unit).
template <typename T>
inline uint64_t pair_suspects(V a, V b, int ulps) {
  return suspect_lanes<T>(a, ulps) | nan_lanes(a) | static_cast<uint64_t>(suspect_lanes<T>(b, ulps) | nan_lanes(b)) << W;
}

// ---- screened stores (see the AVX512 unit): here the suspect and NaN mask itself ----
using Screen = uint64_t;
inline Screen screen_clear() { return 0; }
inline bool screen_any(Screen s, int) { return s != 0; }
template <typename T>
inline void store_pair_screened(T* p, V a, V b, int ulps, Screen& s) {
  store_pair(p, a, b);
  s |= pair_suspects<T>(a, b, ulps);
}
template <typename T>
inline void store_screened(T* p, V v, int ulps, Screen& s) {
  store_fast(p, v);
  s |= suspect_lanes<T>(v, ulps) | nan_lanes(v);
}
template <typename T>
inline void store2_screened(T* p, V a, V b, int ulps, Screen& s) {
  store_screened(p, a, ulps, s);
  store_screened(p + W, b, ulps, s);
}
// Prescaled pairs (see the AVX512 unit): this unit's screen is a mask, so
// there is nothing to fold; values are stored as they are.
template <typename T>
constexpr float kScreenPrescale = 1.0f;
template <typename T>
inline void store_pair_screened_prescaled(T* p, V a, V b, int ulps, Screen& s) {
  store_pair_screened(p, a, b, ulps, s);
}

// ---- lookups indexed by a 16-bit element's bit pattern (see the AVX512 unit) ----
using VI = __m256i;
template <typename T>
inline VI load_bits(const T* p) {
  static_assert(sizeof(T) == 2, "load_bits: 16-bit element types only");
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <typename T>
inline VI load_bits_tail(const T* p, int64_t n) {
  T buf[W] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
  return load_bits(buf);
}
inline V vlookup(const float* table, VI idx) { return _mm256_i32gather_ps(table, idx, 4); }
inline VD vlookup_d_lo(const double* table, VI idx) { return _mm256_i32gather_pd(table, _mm256_castsi256_si128(idx), 8); }
inline VD vlookup_d_hi(const double* table, VI idx) { return _mm256_i32gather_pd(table, _mm256_extracti128_si256(idx, 1), 8); }

// ---- sums of squares (see the AVX512 unit): two roundings per lane per call ----
template <typename T>
inline V vsq2_acc(const T* p, V acc) {
  const V a = load(p), b = load(p + W);
  return vfmadd(a, a, vfmadd(b, b, acc));
}

// ---- math (see the AVX512 unit for the derivations) ----
// p * 2^n for an integral n in [-151, 128], as two normal factors 2^(n/2) *
// 2^(n - n/2), so results below FLT_MIN come out as the correct denormals and
// n = 128 overflows to +inf (this unit has no VSCALEFPS).
inline V vscale2(V p, V n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const V f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const V f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return vmul(vmul(p, f1), f2);
}

// exp(x), same reduction and polynomial as the AVX512 unit, 2^n by vscale2
// (softmax of very negative logits needs its denormals).
inline V vexp(V x) {
  x = _mm256_min_ps(_mm256_max_ps(x, vset1(-104.0f)), vset1(88.7228394f));
  const V n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm256_fnmadd_ps(n, vset1(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, vset1(-2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vfmadd(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vscale2(p, n);
}

// exp(t) for t <= 0 within 4.5e-7 relative (see the AVX512 unit), 2^n as
// in vexp.
inline V vexp_fast(V t) {
  t = _mm256_max_ps(t, vset1(-104.0f));
  const V n = _mm256_round_ps(vmul(t, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V r = _mm256_fnmadd_ps(n, vset1(0.693147182f), t);
  V p = vset1(8.29617e-3f);  // minimax on [-ln2/2, ln2/2], relative error 8.5e-8
  p = vfmadd(p, r, vset1(4.192529e-2f));
  p = vfmadd(p, r, vset1(1.6667649e-1f));
  p = vfmadd(p, r, vset1(4.9998805e-1f));
  p = vfmadd(p, r, vset1(9.9999964e-1f));
  p = vfmadd(p, r, vset1(1.0000001f));
  return vscale2(p, n);
}

inline V verf(V z) {
  const V az = _mm256_andnot_ps(vset1(-0.0f), z);
  const V t = vdiv(vset1(1.0f), vfmadd(vset1(0.3275911f), az, vset1(1.0f)));
  V r = vfmadd(vset1(1.061405429f), t, vset1(-1.453152027f));
  r = vfmadd(r, t, vset1(1.421413741f));
  r = vfmadd(r, t, vset1(-0.284496736f));
  r = vfmadd(r, t, vset1(0.254829592f));
  const V e = vsub(vzero(), vexp(vsub(vzero(), vmul(z, z))));  // -exp(-z^2)
  const V y = vfmadd(vmul(e, t), r, vset1(1.0f));              // 1 - t*r*exp(-z^2)
  return _mm256_xor_ps(y, _mm256_and_ps(z, vset1(-0.0f)));      // copy the sign of z
}

}  // namespace

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
