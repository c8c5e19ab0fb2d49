/* combine.h: the small path's element-wise combine loops, callable from C.
 *
 * One pair of functions per (operation, dtype), both with the signature of
 * cmrt_combine_fn, computing dst[i] = a OP b in place:
 *   _fwd   a = dst[i], b = src[i]   (dst holds the left operand)
 *   _rev   a = src[i], b = dst[i]   (src holds the left operand)
 * so a caller keeps the lower rank's operand on the left on every rank and
 * the ranks end bitwise equal even where an op does not commute bit for bit.
 *
 * Semantics are NumPy's ufuncs', bit for bit (np.add, np.minimum, ...):
 * integers wrap (the module is built with -fwrapv), MIN/MAX let a NaN win,
 * one IEEE operation per element (no contraction: a single op has nothing
 * to fuse).
 */
#ifndef COMMRT_COMBINE_H
#define COMMRT_COMBINE_H

#include <stddef.h>
#include <stdint.h>

typedef void (*cmrt_combine_fn)(void *dst, const void *src, int64_t n);

#define CMRT_SUM(a, b) ((a) + (b))
#define CMRT_PROD(a, b) ((a) * (b))
/* NumPy's scalar rule: a NaN on the left wins, else the smaller; a tie (0.0 and -0.0)
 * gives the right operand */
#define CMRT_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define CMRT_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define CMRT_BAND(a, b) ((a) & (b))
#define CMRT_BOR(a, b) ((a) | (b))
#define CMRT_BXOR(a, b) ((a) ^ (b))

/* Each loop is built for AVX-512, AVX2 and the baseline, and the loader picks
 * the best the CPU has (GCC function multiversioning): the baseline alone is
 * SSE2, half the width Numba's kernels (compiled for the host) get. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CMRT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CMRT_CLONES
#endif

/* one loop: dst[i] = LEFT OP RIGHT, where LEFT and RIGHT name x[i] and y[i] */
#define CMRT_LOOP(OPN, T, TN, DIR, LEFT, RIGHT)                                 \
    CMRT_CLONES static void cmrt_##OPN##_##TN##_##DIR(void *d, const void *s, int64_t n) {  \
        T *x = (T *)d;                                                          \
        const T *y = (const T *)s;                                              \
        for (int64_t i = 0; i < n; i++) {                                       \
            T a = LEFT[i], b = RIGHT[i];                                        \
            x[i] = (T)CMRT_##OPN(a, b);                                         \
        }                                                                       \
    }

#define CMRT_PAIR(OPN, T, TN) CMRT_LOOP(OPN, T, TN, fwd, x, y) CMRT_LOOP(OPN, T, TN, rev, y, x)

#define CMRT_ARITH(T, TN) \
    CMRT_PAIR(SUM, T, TN) CMRT_PAIR(PROD, T, TN) CMRT_PAIR(MIN, T, TN) CMRT_PAIR(MAX, T, TN)
#define CMRT_INT(T, TN) \
    CMRT_ARITH(T, TN) CMRT_PAIR(BAND, T, TN) CMRT_PAIR(BOR, T, TN) CMRT_PAIR(BXOR, T, TN)

CMRT_INT(int8_t, i1)
CMRT_INT(int16_t, i2)
CMRT_INT(int32_t, i4)
CMRT_INT(int64_t, i8)
CMRT_INT(uint8_t, u1)
CMRT_INT(uint16_t, u2)
CMRT_INT(uint32_t, u4)
CMRT_INT(uint64_t, u8)
CMRT_ARITH(float, f4)
CMRT_ARITH(double, f8)

/* bfloat16, stored as uint16 (the upper half of a float32): widen exactly,
 * one float32 operation, round to nearest even (any NaN becomes 0x7FC0), as
 * torch's c10::BFloat16 does; MIN/MAX pick one operand's bits, so nothing is
 * rounded there at all. */
static inline float cmrt_bf16_widen(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t cmrt_bf16_narrow(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if (f != f)
        return 0x7FC0;
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}
#define CMRT_BF16_ARITH(OPN, DIR, LEFT, RIGHT)                                  \
    CMRT_CLONES static void cmrt_##OPN##_bf16_##DIR(void *d, const void *s, int64_t n) { \
        uint16_t *x = (uint16_t *)d;                                            \
        const uint16_t *y = (const uint16_t *)s;                                \
        for (int64_t i = 0; i < n; i++) {                                       \
            float a = cmrt_bf16_widen(LEFT[i]), b = cmrt_bf16_widen(RIGHT[i]);  \
            x[i] = cmrt_bf16_narrow(CMRT_##OPN(a, b));                          \
        }                                                                       \
    }
#define CMRT_BF16_PICK(OPN, DIR, LEFT, RIGHT)                                   \
    CMRT_CLONES static void cmrt_##OPN##_bf16_##DIR(void *d, const void *s, int64_t n) { \
        uint16_t *x = (uint16_t *)d;                                            \
        const uint16_t *y = (const uint16_t *)s;                                \
        for (int64_t i = 0; i < n; i++) {                                       \
            uint16_t p = LEFT[i], q = RIGHT[i];                                 \
            float a = cmrt_bf16_widen(p), b = cmrt_bf16_widen(q);               \
            x[i] = CMRT_##OPN##_LEFT(a, b) ? p : q;                             \
        }                                                                       \
    }
/* which operand MIN/MAX return: the left one exactly when the float macros do */
#define CMRT_MIN_LEFT(a, b) ((a) < (b) || (a) != (a))
#define CMRT_MAX_LEFT(a, b) ((a) > (b) || (a) != (a))
#define CMRT_BF16_PAIR(OPN, KIND) CMRT_BF16_##KIND(OPN, fwd, x, y) CMRT_BF16_##KIND(OPN, rev, y, x)
CMRT_BF16_PAIR(SUM, ARITH)
CMRT_BF16_PAIR(PROD, ARITH)
CMRT_BF16_PAIR(MIN, PICK)
CMRT_BF16_PAIR(MAX, PICK)

/* float16 (IEEE binary16), stored as uint16: widen exactly, one float32
 * operation, round to nearest even: what NumPy's float16 loops compute
 * (npy_half_to_float, the float op, npy_float_to_half), bit for bit but for
 * which operand's payload a NaN result carries when both are NaN; MIN/MAX
 * pick one operand's bits, as NumPy's do (the left one on a tie).  Sum, product and scaling go 8 at
 * a time through F16C (vcvtph2ps, the float32 op, vcvtps2ph) where the CPU
 * has it and AVX2: GCC does not vectorise _Float16 casts, and NumPy converts
 * one element at a time in software (an add of 110 K halves: ~700 us against
 * ~95 for the scalar casts here, less again 8 wide).  The rest, and every
 * tail, is scalar, with GCC's _Float16 casts.  Where the compiler has no
 * _Float16 the table has no float16 loops and float16 stays with reduce.py's
 * NumPy ufuncs. */
#if defined(__FLT16_MAX__)
#define CMRT_HAVE_F16 1
static inline float cmrt_f16_widen(uint16_t h) {
    union { uint16_t u; _Float16 f; } v;
    v.u = h;
    return (float)v.f;
}
static inline uint16_t cmrt_f16_narrow(float f) {
    union { uint16_t u; _Float16 f; } v;
    v.f = (_Float16)f;
    return v.u;
}
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#define CMRT_F16C 1
/* kind: 0 add, 1 multiply, 2 multiply by f, 3 divide by f; rev: y's operand on the
 * left.  Returns how many elements it did (a multiple of 8); the caller does the rest */
__attribute__((target("avx2,f16c"))) static int64_t cmrt_f16_wide(uint16_t *x, const uint16_t *y,
                                                                   int64_t n, int kind, int rev,
                                                                   float f) {
    int64_t i = 0;
    __m256 c = _mm256_set1_ps(f);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), b, r;
        if (kind >= 2) {
            r = kind == 2 ? _mm256_mul_ps(a, c) : _mm256_div_ps(a, c);
        } else {
            b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
            if (rev) {
                __m256 t = a;
                a = b;
                b = t;
            }
            r = kind == 0 ? _mm256_add_ps(a, b) : _mm256_mul_ps(a, b);
        }
        _mm_storeu_si128((__m128i *)(x + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}
static int cmrt_f16c_ok(void) {
    static int ok = -1;
    if (ok < 0)
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return ok;
}
#define CMRT_F16_START(x, y, n, kind, rev, f) (cmrt_f16c_ok() ? cmrt_f16_wide(x, y, n, kind, rev, f) : 0)
#else
#define CMRT_F16_START(x, y, n, kind, rev, f) 0
#endif
#define CMRT_F16_ARITH(OPN, DIR, LEFT, RIGHT, KIND, REV)                       \
    static void cmrt_##OPN##_f2_##DIR(void *d, const void *s, int64_t n) {    \
        uint16_t *x = (uint16_t *)d;                                            \
        const uint16_t *y = (const uint16_t *)s;                                \
        for (int64_t i = CMRT_F16_START(x, y, n, KIND, REV, 0.0f); i < n; i++) { \
            float a = cmrt_f16_widen(LEFT[i]), b = cmrt_f16_widen(RIGHT[i]);    \
            x[i] = cmrt_f16_narrow(CMRT_##OPN(a, b));                           \
        }                                                                       \
    }
#define CMRT_F16_PICK(OPN, DIR, LEFT, RIGHT)                                    \
    static void cmrt_##OPN##_f2_##DIR(void *d, const void *s, int64_t n) {    \
        uint16_t *x = (uint16_t *)d;                                            \
        const uint16_t *y = (const uint16_t *)s;                                \
        for (int64_t i = 0; i < n; i++) {                                       \
            uint16_t p = LEFT[i], q = RIGHT[i];                                 \
            float a = cmrt_f16_widen(p), b = cmrt_f16_widen(q);                 \
            x[i] = CMRT_##OPN##_LEFT_F16(a, b) ? p : q;                         \
        }                                                                       \
    }
/* NumPy's float16 minimum/maximum keep the left operand on a tie (0.0 and -0.0),
 * unlike its float32 and float64 loops */
#define CMRT_MIN_LEFT_F16(a, b) ((a) <= (b) || (a) != (a))
#define CMRT_MAX_LEFT_F16(a, b) ((a) >= (b) || (a) != (a))
CMRT_F16_ARITH(SUM, fwd, x, y, 0, 0)
CMRT_F16_ARITH(SUM, rev, y, x, 0, 1)
CMRT_F16_ARITH(PROD, fwd, x, y, 1, 0)
CMRT_F16_ARITH(PROD, rev, y, x, 1, 1)
CMRT_F16_PICK(MIN, fwd, x, y)
CMRT_F16_PICK(MIN, rev, y, x)
CMRT_F16_PICK(MAX, fwd, x, y)
CMRT_F16_PICK(MAX, rev, y, x)

/* x[i] = x[i] * f (or / f when divide), in float32, rounded to nearest even:
 * NumPy's `x *= np.float16(f)` and `x /= np.float16(f)` when f is a float16
 * value (the caller rounds it) */
static void cmrt_f16_scale(void *d, int64_t n, float f, int divide) {
    uint16_t *x = (uint16_t *)d;
    int64_t i = CMRT_F16_START(x, x, n, divide ? 3 : 2, 0, f);
    for (; i < n; i++)
        x[i] = cmrt_f16_narrow(divide ? cmrt_f16_widen(x[i]) / f : cmrt_f16_widen(x[i]) * f);
}
#define CMRT_F16_ROW(DIR) CMRT_FROW(f2, DIR)
#else
#define CMRT_HAVE_F16 0
static void cmrt_f16_scale(void *d, int64_t n, float f, int divide) {
    (void)d; (void)n; (void)f; (void)divide;
}
#define CMRT_F16_ROW(DIR) {NULL, NULL, NULL, NULL, NULL, NULL, NULL}
#endif

/* operations, in this order: sum prod min max band bor bxor */
#define CMRT_N_OPS 7
#define CMRT_ROW(TN, DIR) {cmrt_SUM_##TN##_##DIR, cmrt_PROD_##TN##_##DIR,           \
                           cmrt_MIN_##TN##_##DIR, cmrt_MAX_##TN##_##DIR,            \
                           cmrt_BAND_##TN##_##DIR, cmrt_BOR_##TN##_##DIR,           \
                           cmrt_BXOR_##TN##_##DIR}
#define CMRT_FROW(TN, DIR) {cmrt_SUM_##TN##_##DIR, cmrt_PROD_##TN##_##DIR,          \
                            cmrt_MIN_##TN##_##DIR, cmrt_MAX_##TN##_##DIR, NULL, NULL, NULL}

/* dtypes: i1 i2 i4 i8 u1 u2 u4 u8 f4 f8 bf16 f2 */
#define CMRT_N_TYPES 12
static const cmrt_combine_fn cmrt_table[2][CMRT_N_TYPES][CMRT_N_OPS] = {
    {CMRT_ROW(i1, fwd), CMRT_ROW(i2, fwd), CMRT_ROW(i4, fwd), CMRT_ROW(i8, fwd),
     CMRT_ROW(u1, fwd), CMRT_ROW(u2, fwd), CMRT_ROW(u4, fwd), CMRT_ROW(u8, fwd),
     CMRT_FROW(f4, fwd), CMRT_FROW(f8, fwd), CMRT_FROW(bf16, fwd), CMRT_F16_ROW(fwd)},
    {CMRT_ROW(i1, rev), CMRT_ROW(i2, rev), CMRT_ROW(i4, rev), CMRT_ROW(i8, rev),
     CMRT_ROW(u1, rev), CMRT_ROW(u2, rev), CMRT_ROW(u4, rev), CMRT_ROW(u8, rev),
     CMRT_FROW(f4, rev), CMRT_FROW(f8, rev), CMRT_FROW(bf16, rev), CMRT_F16_ROW(rev)},
};

/* the function for (op, dtype, order), or NULL where there is none */
static cmrt_combine_fn cmrt_combine_lookup(int op, int type, int src_first) {
    if (op < 0 || op >= CMRT_N_OPS || type < 0 || type >= CMRT_N_TYPES)
        return NULL;
    return cmrt_table[src_first ? 1 : 0][type][op];
}

#endif
