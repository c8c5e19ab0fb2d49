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

/* operations, in this order: sum prod min max band bor bxor */
#define CMRT_N_OPS 7
#define CMRT_ROW(TN, DIR) {cmrt_SUM_##TN##_##DIR, cmrt_PROD_##TN##_##DIR,           \
                           cmrt_MIN_##TN##_##DIR, cmrt_MAX_##TN##_##DIR,            \
                           cmrt_BAND_##TN##_##DIR, cmrt_BOR_##TN##_##DIR,           \
                           cmrt_BXOR_##TN##_##DIR}
#define CMRT_FROW(TN, DIR) {cmrt_SUM_##TN##_##DIR, cmrt_PROD_##TN##_##DIR,          \
                            cmrt_MIN_##TN##_##DIR, cmrt_MAX_##TN##_##DIR, NULL, NULL, NULL}

/* dtypes: i1 i2 i4 i8 u1 u2 u4 u8 f4 f8 bf16 */
#define CMRT_N_TYPES 11
static const cmrt_combine_fn cmrt_table[2][CMRT_N_TYPES][CMRT_N_OPS] = {
    {CMRT_ROW(i1, fwd), CMRT_ROW(i2, fwd), CMRT_ROW(i4, fwd), CMRT_ROW(i8, fwd),
     CMRT_ROW(u1, fwd), CMRT_ROW(u2, fwd), CMRT_ROW(u4, fwd), CMRT_ROW(u8, fwd),
     CMRT_FROW(f4, fwd), CMRT_FROW(f8, fwd), CMRT_FROW(bf16, fwd)},
    {CMRT_ROW(i1, rev), CMRT_ROW(i2, rev), CMRT_ROW(i4, rev), CMRT_ROW(i8, rev),
     CMRT_ROW(u1, rev), CMRT_ROW(u2, rev), CMRT_ROW(u4, rev), CMRT_ROW(u8, rev),
     CMRT_FROW(f4, rev), CMRT_FROW(f8, rev), CMRT_FROW(bf16, rev)},
};

/* the function for (op, dtype, order), or NULL where there is none */
static cmrt_combine_fn cmrt_combine_lookup(int op, int type, int src_first) {
    if (op < 0 || op >= CMRT_N_OPS || type < 0 || type >= CMRT_N_TYPES)
        return NULL;
    return cmrt_table[src_first ? 1 : 0][type][op];
}

#endif
