// AVX512 tier of masked_softmax_kernel. Raw pointers and sizes only, NO torch headers, so a
// one-line edit recompiles this unit in about a second.
// Built with: -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -fopenmp -ffp-contract=off
//
// The helpers below give every op body the same small vocabulary (V = 16
// floats; load/store convert from and to the storage dtype; *_tail use
// __mmask16 masks for the last partial vector). Arithmetic is always fp32;
// bf16 stores round to nearest even (VCVTNEPS2BF16), fp16 stores use F16C
// with _MM_FROUND_TO_NEAREST_INT — never truncation.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "masked_softmax_kernel_tiers.hpp"

namespace masked_softmax_kernel_cpu {
namespace avx512 {
namespace {

using V = __m512;
constexpr int64_t W = 16;  // floats per vector

inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float a) { return _mm512_set1_ps(a); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vabs(V a) { return _mm512_abs_ps(a); }
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a*b+c, one rounding
// 1/a to ~1 ulp without a division: rcp14 (14 bits) plus one Newton step.
// A division costs ~10 cycles per vector and blocks the port exp needs.
inline V vrcp(V a) {
  const V r = _mm512_rcp14_ps(a);
  return vmul(r, _mm512_fnmadd_ps(a, r, vset1(2.0f)));
}
inline float hsum(V a) { return _mm512_reduce_add_ps(a); }
inline float hmax(V a) { return _mm512_reduce_max_ps(a); }

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// Lanes [n, W) replaced by `fill` (e.g. -inf before a max, 0 before a sum).
inline V vfill_tail(V v, int64_t n, float fill) { return _mm512_mask_blend_ps(tail_mask(n), vset1(fill), v); }

// ---- loads: storage dtype -> 16 x fp32 ----
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline V load(const bf16_t* p) {
  // bf16 is the high half of an fp32: widen to 32 bits and shift into place (exact).
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V load(const fp16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Masked loads read only the first n (< 16) elements; the rest are 0.
inline V load_tail(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
inline V load_tail(const bf16_t* p, int64_t n) {
  const __m256i h = _mm256_maskz_loadu_epi16(tail_mask(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline V load_tail(const fp16_t* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}

// ---- stores: 16 x fp32 -> storage dtype, rounded to nearest even ----
// Integer round-to-nearest-even (add 0x7FFF + lowest kept bit, keep the high
// half; NaN stays a quiet NaN): exact for every input, including denormals.
inline __m256i to_bf16_rne_int(V v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i out = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  out = _mm512_mask_mov_epi32(out, nan, _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(out);
}
// VCVTNEPS2BF16 rounds to nearest even in one instruction but treats denormal
// inputs as zero, while torch keeps bf16 denormals; a vector holding a value
// below FLT_MIN in magnitude (zeros included) takes the integer path.
inline __m256i to_bf16(V v) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(v), vset1(1.17549435e-38f), _CMP_LT_OQ);
  if (__builtin_expect(tiny == 0, 1)) return (__m256i)_mm512_cvtneps_pbh(v);
  return to_bf16_rne_int(v);
}
inline __m256i to_fp16(V v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void store(bf16_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(v)); }
inline void store(fp16_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_fp16(v)); }
inline void store_tail(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
inline void store_tail(bf16_t* p, V v, int64_t n) { _mm256_mask_storeu_epi16(p, tail_mask(n), to_bf16(v)); }
inline void store_tail(fp16_t* p, V v, int64_t n) { _mm256_mask_storeu_epi16(p, tail_mask(n), to_fp16(v)); }

// Non-temporal stores (bypass the caches: for outputs much larger than the
// LLC, saves the read-for-ownership of every line). Need a store-size aligned
// pointer; callers check stream_aligned() and end with stream_fence().
// (Callers guarantee the alignment with stream_aligned(); __builtin_assume_aligned says so.)
inline void store_stream(float* p, V v) {
  float* a = static_cast<float*>(__builtin_assume_aligned(p, 64));
  _mm512_stream_ps(a, v);
}
inline void store_stream(bf16_t* p, V v) {
  __m256i* a = static_cast<__m256i*>(__builtin_assume_aligned(p, 32));
  _mm256_stream_si256(a, to_bf16(v));
}
inline void store_stream(fp16_t* p, V v) {
  __m256i* a = static_cast<__m256i*>(__builtin_assume_aligned(p, 32));
  _mm256_stream_si256(a, to_fp16(v));
}
template <typename T>
inline bool stream_aligned(const T* p) { return reinterpret_cast<uintptr_t>(p) % (W * sizeof(T)) == 0; }
inline void stream_fence() { _mm_sfence(); }

// ---- threads: row_run and for_row_runs live in masked_softmax_kernel_tiers.hpp ----

// ---- double-precision helpers (exact sums of squares, rare exact fix-ups) ----
using VD = __m512d;
inline VD vdzero() { return _mm512_setzero_pd(); }
inline VD vdadd(VD a, VD b) { return _mm512_add_pd(a, b); }
inline double hsum_d(VD a) { return _mm512_reduce_add_pd(a); }
// lo/hi += v*v in double: the products of fp32 values are exact in double, so
// the sum of squares is accurate to ~1e-16 whatever the summation order.
inline void vsumsq_wide(V v, VD& lo, VD& hi) {
  const VD a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const VD b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  lo = _mm512_fmadd_pd(a, a, lo);
  hi = _mm512_fmadd_pd(b, b, hi);
}

// lo/hi += v in double (an fp32 sum without rounding drift).
inline void vsum_wide(V v, VD& lo, VD& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// Double vectors for dot products summed in double (linear_int8): products of
// an fp32 value and an int8 are exact in double. AVX512F only.
constexpr int64_t WD = 8;  // doubles per VD
inline VD vdload(const double* p) { return _mm512_loadu_pd(p); }
inline void vdstore(double* p, VD v) { _mm512_storeu_pd(p, v); }
inline VD vdfmadd(VD a, VD b, VD c) { return _mm512_fmadd_pd(a, b, c); }  // a*b+c
// WD int8 -> WD doubles, exact.
inline VD vdload_i8(const int8_t* p) {
  return _mm512_cvtepi32_pd(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// One V (W floats) widened to W doubles at p (exact).
inline void vdstore_wide(double* p, V v) {
  _mm512_storeu_pd(p, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  _mm512_storeu_pd(p + WD, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// Scalar conversions, used only by the fix-ups below (one lane at a time).
inline double to_double(float v) { return v; }
inline double to_double(bf16_t v) { return bf16_to_float(v); }
inline double to_double(fp16_t v) { return _mm512_cvtss_f32(load_tail(&v, 1)); }
inline void store_scalar(float* p, double v) { *p = static_cast<float>(v); }
inline void store_scalar(bf16_t* p, double v) { *p = float_to_bf16(static_cast<float>(v)); }
inline void store_scalar(fp16_t* p, double v) { store_tail(p, vset1(static_cast<float>(v)), 1); }

// Lanes whose fp32 value lies within `ulps` fp32 ulps of a rounding tie of T.
// Rounding such a value could differ from rounding the exact result (the
// reference rounds a float64 result), so those few lanes (~ulps / 2^15 of
// bf16 outputs) are recomputed in double. fp32 outputs need no fix-up.
template <typename T> inline unsigned near_tie(V, int) { return 0; }
// |low bits - tie| <= ulps  <=>  (low bits + tie + ulps) mod 2^k <= 2 * ulps: three ops.
inline unsigned near_tie_bits(V y, int keep_mask, int tie, int ulps) {
  const __m512i shifted = _mm512_add_epi32(_mm512_castps_si512(y), _mm512_set1_epi32(tie + ulps));
  const __m512i low = _mm512_and_si512(shifted, _mm512_set1_epi32(keep_mask));
  return _mm512_cmple_epu32_mask(low, _mm512_set1_epi32(2 * ulps));
}
template <> inline unsigned near_tie<bf16_t>(V y, int ulps) { return near_tie_bits(y, 0xFFFF, 0x8000, ulps); }
// Below fp16's normal range (|y| < 2^-14) the rounding position moves up with
// the exponent, out of the 13 bits the tie test looks at, so every non-zero
// lane there counts as suspect (rms_norm's fp16 denormal outputs flipped at
// ~5e-6 of lanes before; a zero is exact).
template <> inline unsigned near_tie<fp16_t>(V y, int ulps) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(vabs(y), vset1(0x1.0p-14f), _CMP_LT_OQ) &
                         _mm512_cmp_ps_mask(y, vzero(), _CMP_NEQ_OQ);
  return near_tie_bits(y, 0x1FFF, 0x1000, ulps) | tiny;
}

// ---- unchecked stores, for hot loops that fix suspect lanes afterwards ----
// store_fast is the cheapest rounding store: for bf16 a bare VCVTNEPS2BF16,
// which flushes denormal results to zero. suspect_lanes<T> names every lane
// where it may differ from the correctly rounded exact result: within `ulps`
// fp32 ulps of a rounding tie of T (the fp32 value itself is inexact), or a
// bf16 denormal. A hot loop stores fast, collects the blocks with a suspect
// lane without branching, and recomputes those exactly afterwards
// (~(2 * ulps + 1) / 65536 of the lanes). fp32 outputs have no suspects.
inline void store_fast(float* p, V v) { store(p, v); }
inline void store_fast(bf16_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v)); }
inline void store_fast(fp16_t* p, V v) { store(p, v); }
template <typename T> inline unsigned suspect_lanes(V v, int ulps) { return near_tie<T>(v, ulps); }
template <> inline unsigned suspect_lanes<bf16_t>(V v, int ulps) {
  return near_tie<bf16_t>(v, ulps) | _mm512_fpclass_ps_mask(v, 0x20);  // 0x20: denormal
}
// Lanes holding a NaN.
inline unsigned nan_lanes(V v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }

// ---- pairs: 2 * W elements as two V, in an order of this unit's choosing ----
// Elementwise code may work on pairs: load every operand with load_pair (or
// from an fp32 copy written by store_pair_f32), and the lanes line up
// whatever the order. store_pair puts the results back in place with
// unchecked rounding (store_fast); store_pair_fast also returns the suspect
// elements (see store_fast) as a 2 * W-bit mask in ELEMENT order. bf16 uses
// the even/odd split: a 32-bit lane holding two bf16 gives both as fp32 with
// one shift and one AND, and
// the store is one two-source conversion plus one word permutation — about
// half the instructions of widening and narrowing each half separately.
template <typename T>
inline void load_pair(const T* p, V& a, V& b) {
  a = load(p);
  b = load(p + W);
}
template <>
inline void load_pair<bf16_t>(const bf16_t* p, V& a, V& b) {
  const __m512i x = _mm512_loadu_si512(p);
  a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));                                               // even
  b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));  // odd
}
// The pair as fp32 at p[0, 2 * W), in pair order: load(p), load(p + W) give it back.
inline void store_pair_f32(float* p, V a, V b) {
  store(p, a);
  store(p + W, b);
}
// The pair rounded by store_fast and put back in element order, unchecked.
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
// Word k of a bf16 pair: element k. kPairStore picks it from a
// VCVTNE2PS2BF16 result (a's 16 words low, b's high); kPairLowWords picks the
// low 16 bits of its fp32 value from a (even k) or b (odd k: index 32 + ...).
alignas(64) constexpr uint16_t kPairStore[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
alignas(64) constexpr uint16_t kPairLowWords[32] = {0, 32, 2, 34, 4, 36, 6, 38, 8, 40, 10, 42, 12, 44, 14, 46,
                                                    16, 48, 18, 50, 20, 52, 22, 54, 24, 56, 26, 58, 28, 60, 30, 62};
// The bf16 pair rounded (VCVTNE2PS2BF16, denormals flushed) and stored in element order; returns it.
inline __m512i store_pair_bf16(bf16_t* p, V a, V b) {
  const __m512i out = _mm512_permutexvar_epi16(_mm512_load_si512(kPairStore), (__m512i)_mm512_cvtne2ps_pbh(b, a));
  _mm512_storeu_si512(p, out);
  return out;
}
template <>
inline void store_pair<bf16_t>(bf16_t* p, V a, V b) {
  store_pair_bf16(p, a, b);
}
template <>
inline uint64_t store_pair_fast<bf16_t>(bf16_t* p, V a, V b, int ulps) {
  const __m512i out = store_pair_bf16(p, a, b);
  // Near ties: one 16-bit test of the dropped halves of all 32 elements (see near_tie_bits).
  const __m512i low = _mm512_permutex2var_epi16(_mm512_castps_si512(a), _mm512_load_si512(kPairLowWords),
                                                _mm512_castps_si512(b));
  const __m512i shifted = _mm512_add_epi16(low, _mm512_set1_epi16(static_cast<short>(0x8000 + ulps)));
  const uint64_t tie = _mm512_cmple_epu16_mask(shifted, _mm512_set1_epi16(static_cast<short>(2 * ulps)));
  // A zero exponent in the output: a flushed denormal (or a true zero, which the fix-up reproduces).
  const uint64_t tiny = _mm512_testn_epi16_mask(out, _mm512_set1_epi16(0x7F80));
  return tie | tiny;
}

// The elements of a pair that a screened store may have got wrong (what
// store_pair_fast returns, and NaN), as a 2 * W-bit mask in ELEMENT order,
// without storing anything: for a block whose screen flagged something, whose
// other elements are final. Pass the values the store was given (prescaled or
// not): the tests look at the low bits and the value class only — bf16 flags
// zeros, denormals, NaN and infinities, whose prescaled or flushed rounding
// may differ.
template <typename T>
inline uint64_t pair_suspects(V a, V b, int ulps) {
  return suspect_lanes<T>(a, ulps) | nan_lanes(a) | static_cast<uint64_t>(suspect_lanes<T>(b, ulps) | nan_lanes(b)) << W;
}
template <>
inline uint64_t pair_suspects<bf16_t>(V a, V b, int ulps) {
  constexpr int kSpecial = 0xBF;  // VFPCLASSPS: NaN, +-0, +-inf, denormal
  const unsigned even = near_tie<bf16_t>(a, ulps) | _mm512_fpclass_ps_mask(a, kSpecial);
  const unsigned odd = near_tie<bf16_t>(b, ulps) | _mm512_fpclass_ps_mask(b, kSpecial);
  uint64_t lanes = 0;  // lane k of a is element 2k, of b element 2k + 1 (load_pair)
  for (unsigned m = even; m != 0; m &= m - 1) lanes |= uint64_t{1} << (2 * __builtin_ctz(m));
  for (unsigned m = odd; m != 0; m &= m - 1) lanes |= uint64_t{1} << (2 * __builtin_ctz(m) + 1);
  return lanes;
}

// ---- screened stores: store_pair_fast for loops that rarely find a suspect ----
// store_pair_screened stores like store_pair_fast but folds its suspects, and
// NaN results, into a Screen instead of returning them: here a mask register
// with one bit per 16-bit word of a vector, cleared where a word may be
// suspect (bf16: one VPTESTMW per vector, merged into the mask, no shuffles).
// screen_any says whether anything folded in since screen_clear() may be
// suspect or NaN (false alarms allowed: the bf16 test is coarser than
// near_tie); only then does the loop name the lanes exactly with
// pair_suspects / suspect_lanes (and look for NaN itself, where that matters).
using Screen = __mmask32;
inline Screen screen_clear() { return static_cast<Screen>(0xFFFFFFFFu); }
inline bool screen_any(Screen s, int) { return !_kortestc_mask32_u8(s, s); }
// bf16 lanes are tested as t = bits + kScreenAdd + ulps (screen_word_pairs).
// t's low word is the near-tie distance of store_pair_fast, 2 * ulps + 1
// values apart from the tie at 0; its high word (sign ignored) is the
// magnitude's top bits + 0x7F plus the addition's carry: small for zeros and
// denormals (flushed by the fast store), and for a NaN (0x7F81.. wraps to
// 0..). kScreenTest keeps a word's bits whose absence flags it: a low word
// below 16 (the tie window [-ulps, 16 - ulps), so ulps <= 7) or a high word
// below 0x200 without its sign (exponents <= 2). One test instead of a sign
// mask, a minimum and a compare per vector (rms_norm bf16 3-7 % faster,
// measured side by side); the wider windows flag ~1.5x the blocks, but a
// flagged block costs only its recomputation.
constexpr int kScreenAdd = 0x007F8000;
constexpr int kScreenTest = 0x7E00FFF0;
inline __m512i screen_word_pairs(V v, int ulps) {
  return _mm512_add_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(kScreenAdd + ulps));
}
// Clears the bits of s for the words of t (screen_word_pairs' form) that may be suspect.
inline Screen screen_fold(Screen s, __m512i t) { return _mm512_mask_test_epi16_mask(s, t, _mm512_set1_epi32(kScreenTest)); }
// Folds a pair of bf16 results (the values the stores were given) into s.
inline Screen screen_fold_pair(Screen s, V a, V b, int ulps) {
  return screen_fold(screen_fold(s, screen_word_pairs(a, ulps)), screen_word_pairs(b, ulps));
}
template <typename T>
inline void store_pair_screened(T* p, V a, V b, int ulps, Screen& s) {
  // Suspect or NaN elements clear their bit (element k is word k of the pair).
  store_pair(p, a, b);
  s &= static_cast<Screen>(~pair_suspects<T>(a, b, ulps));
}
template <>
inline void store_pair_screened<bf16_t>(bf16_t* p, V a, V b, int ulps, Screen& s) {
  store_pair_bf16(p, a, b);
  s = screen_fold_pair(s, a, b, ulps);
}
// ---- prescaled screened pairs: bf16 rounding folded into the screen's addition ----
// The screen adds kScreenAdd + ulps to every value anyway. With one exponent
// step (0x80) in the high word instead of 0x7F, the sum's high word is the
// bf16 rounding, ties away from zero, of TWICE the value — the same screen
// test still flags the high words of zeros, denormals, NaN and infinities
// (0x7F80 + 0x80 wraps to 0 without the sign). So a caller that computes its values times
// kScreenPrescale<T> (0.5 for bf16: a power of two, exact outside the
// denormal range, which the screen flags) gets the rounded outputs with one
// shift and one bit blend instead of VCVTNE2PS2BF16 and a word permutation
// (rms_norm bf16 13-15 % faster, measured side by side in one C++ process).
// The rounding differs from round-to-nearest-even (and from the fast store)
// only within ulps below a tie, in lanes the screen flags, which the caller
// names with pair_suspects and stores again exactly. The unscaled values
// must stay below 2^128 in magnitude (finite in fp32), or NaN: above, the
// doubled exponent would form an unflagged NaN.
template <typename T>
constexpr float kScreenPrescale = 1.0f;
template <>
constexpr float kScreenPrescale<bf16_t> = 0.5f;
constexpr int kScreenAddDoubling = 0x00808000;
template <typename T>
inline void store_pair_screened_prescaled(T* p, V a, V b, int ulps, Screen& s) {
  store_pair_screened(p, a, b, ulps, s);
}
template <>
inline void store_pair_screened_prescaled<bf16_t>(bf16_t* p, V a, V b, int ulps, Screen& s) {
  const __m512i add = _mm512_set1_epi32(kScreenAddDoubling + ulps);
  const __m512i ta = _mm512_add_epi32(_mm512_castps_si512(a), add);
  const __m512i tb = _mm512_add_epi32(_mm512_castps_si512(b), add);
  s = screen_fold(screen_fold(s, ta), tb);
  // Element 2k is lane k of a (low word), element 2k + 1 lane k of b: (tb & 0xFFFF0000) | (ta >> 16).
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  _mm512_storeu_si512(p, _mm512_ternarylogic_epi32(tb, high, _mm512_srli_epi32(ta, 16), 0xEA));
}
// One V in element order (store_fast plus the same test on its 16 lanes).
template <typename T>
inline void store_screened(T* p, V v, int ulps, Screen& s) {
  store_fast(p, v);
  s &= static_cast<Screen>(~(suspect_lanes<T>(v, ulps) | nan_lanes(v)));
}
template <>
inline void store_screened<bf16_t>(bf16_t* p, V v, int ulps, Screen& s) {
  store_fast(p, v);
  s = screen_fold(s, screen_word_pairs(v, ulps));
}
// Two consecutive V (p[0, W) and p[W, 2W)); bf16 rounds both in one VCVTNE2PS2BF16.
template <typename T>
inline void store2_screened(T* p, V a, V b, int ulps, Screen& s) {
  store_screened(p, a, ulps, s);
  store_screened(p + W, b, ulps, s);
}
template <>
inline void store2_screened<bf16_t>(bf16_t* p, V a, V b, int ulps, Screen& s) {
  _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  s = screen_fold_pair(s, a, b, ulps);
}

// ---- lookups indexed by a 16-bit element's bit pattern (bf16/fp16) ----
// A 65536-entry table turns any function of one bf16/fp16 input into a
// gather (see silu_and_mul). VI holds one 32-bit index per lane.
using VI = __m512i;
template <typename T>
inline VI load_bits(const T* p) {
  static_assert(sizeof(T) == 2, "load_bits: 16-bit element types only");
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
template <typename T>
inline VI load_bits_tail(const T* p, int64_t n) {
  static_assert(sizeof(T) == 2, "load_bits_tail: 16-bit element types only");
  return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail_mask(n), p));
}
inline V vlookup(const float* table, VI idx) { return _mm512_i32gather_ps(idx, table, 4); }
// table[idx] in double for lanes [0, W/2) (lo) and [W/2, W) (hi) of idx.
inline VD vlookup_d_lo(const double* table, VI idx) { return _mm512_i32gather_pd(_mm512_castsi512_si256(idx), table, 8); }
inline VD vlookup_d_hi(const double* table, VI idx) {
  return _mm512_i32gather_pd(_mm512_extracti64x4_epi64(idx, 1), table, 8);
}

// ---- sums of squares ----
// acc + the squares of the 2 * W elements at p, two per lane (which two is
// this unit's business: only the lane sum is meaningful). Two roundings per
// lane per call (three for fp32, whose squares round too); from acc = 0 one
// for bf16/fp16, whose squares are exact in fp32.
template <typename T>
inline V vsq2_acc(const T* p, V acc) {
  const V a = load(p), b = load(p + W);
  return vfmadd(a, a, vfmadd(b, b, acc));
}
// bf16: one VDPBF16PS (acc + odd^2, then + even^2, each rounded). It treats
// denormal inputs and products below FLT_MIN as 0: callers that need a bound
// allow an absolute error of 2^-125 per lane.
template <>
inline V vsq2_acc<bf16_t>(const bf16_t* p, V acc) {
  const __m512bh x = (__m512bh)_mm512_loadu_si512(p);
  return _mm512_dpbf16_ps(acc, x, x);
}

// ---- math ----
// exp(x) for 16 floats, within ~1 ulp: x = n*ln2 + r with |r| <= ln2/2 (ln2 split
// in two so r is exact), a degree-6 polynomial for e^r, and 2^n applied by
// VSCALEFPS, which also produces the right denormals, 0 and +inf at the ends
// of the range (no masks needed). The clamp keeps -inf and NaN-free inputs
// finite: exp(-104) already rounds to 0, exp(88.73) to +inf.
inline V vexp(V x) {
  x = _mm512_min_ps(_mm512_max_ps(x, vset1(-104.0f)), vset1(88.7228394f));
  const V n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  V r = _mm512_fnmadd_ps(n, vset1(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, vset1(-2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfmadd(p, r, vset1(1.3981999507e-3f));
  p = vfmadd(p, r, vset1(8.3334519073e-3f));
  p = vfmadd(p, r, vset1(4.1665795894e-2f));
  p = vfmadd(p, r, vset1(1.6666665459e-1f));
  p = vfmadd(p, r, vset1(5.0000001201e-1f));
  p = vfmadd(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// exp(t) for t <= 0 (-inf gives 0) within 4.5e-7 relative (measured over
// [-104, 0] against float64): one fp32 constant for ln2 in the range
// reduction (its error, 2e-9 per unit of n, is the larger part) and a
// degree-5 polynomial — 10 operations against vexp's 15, for fp32 outputs
// judged at 1e-5 (softmax's fp32 fast path). NaN is the caller's business.
inline V vexp_fast(V t) {
  t = _mm512_max_ps(t, vset1(-104.0f));
  const V n = _mm512_roundscale_ps(vmul(t, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V r = _mm512_fnmadd_ps(n, vset1(0.693147182f), t);
  V p = vset1(8.29617e-3f);  // minimax on [-ln2/2, ln2/2], relative error 8.5e-8
  p = vfmadd(p, r, vset1(4.192529e-2f));
  p = vfmadd(p, r, vset1(1.6667649e-1f));
  p = vfmadd(p, r, vset1(4.9998805e-1f));
  p = vfmadd(p, r, vset1(9.9999964e-1f));
  p = vfmadd(p, r, vset1(1.0000001f));
  return _mm512_scalef_ps(p, n);
}

// erf(z) by Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 absolute, which is
// tighter than torch's own fp32 gelu on this machine (~6e-7 measured against
// float64), cheap (one division, one exp) and branch-free.
inline V verf(V z) {
  const V az = _mm512_abs_ps(z);
  const V t = vdiv(vset1(1.0f), vfmadd(vset1(0.3275911f), az, vset1(1.0f)));
  V r = vfmadd(vset1(1.061405429f), t, vset1(-1.453152027f));
  r = vfmadd(r, t, vset1(1.421413741f));
  r = vfmadd(r, t, vset1(-0.284496736f));
  r = vfmadd(r, t, vset1(0.254829592f));
  const V e = vsub(vzero(), vexp(vsub(vzero(), vmul(z, z))));  // -exp(-z^2)
  const V y = vfmadd(vmul(e, t), r, vset1(1.0f));              // 1 - t*r*exp(-z^2)
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign));
}

}  // namespace

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
