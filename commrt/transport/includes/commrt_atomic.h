/* Small inline helpers the Cython core cannot spell itself: atomics with
 * explicit memory order, the CPU's spin hint, and a monotonic clock in
 * nanoseconds.  Everything here is lock-free and safe without the GIL. */
#ifndef COMMRT_ATOMIC_H
#define COMMRT_ATOMIC_H
#include <stdint.h>
#include <time.h>

static inline uint64_t ld_acq_u64(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_rel_u64(volatile uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t ld_acq_u32(volatile uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_rel_u32(volatile uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline int cas_u32(volatile uint32_t *p, uint32_t expect, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expect, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline int cas_u64(volatile uint64_t *p, uint64_t expect, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expect, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline void fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif
