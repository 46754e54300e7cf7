/*
 * core.h - the base layer every other directory may use: errors, logging, assertions,
 * checked arithmetic, arenas, a string-keyed hash map, and the number formats of the
 * DeepSeek-V4 release (bf16, f16, e4m3fn, e5m2, e8m0, e2m1).
 */
#ifndef DSV4_CORE_H
#define DSV4_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4.h"

/* ------------------------------------------------------------------ assertions */

/* Cheap invariant checks stay on in release builds: a broken invariant aborts with file:line. */
#define DSV4_ASSERT(cond)                                                                   \
    do {                                                                                    \
        if (!(cond)) dsv4_assert_fail(__FILE__, __LINE__, #cond);                           \
    } while (0)

#ifdef DSV4_DEBUG
#define DSV4_DEBUG_ASSERT(cond) DSV4_ASSERT(cond)
#else
#define DSV4_DEBUG_ASSERT(cond) ((void)0)
#endif

#define DSV4_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

_Noreturn void dsv4_assert_fail(const char *file, int line, const char *expr);

/* ------------------------------------------------------------------ errors */

/* Formats one sentence into err (if non-NULL) and returns code, so callers can
 * `return dsv4_err_set(err, DSV4_EINVAL, "...")`. */
int dsv4_err_set(struct dsv4_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dsv4_err_clear(struct dsv4_err *err);

/* ------------------------------------------------------------------ logging */

struct dsv4_logger {
    dsv4_log_fn fn;
    void       *ud;
};

void dsv4_log(const struct dsv4_logger *lg, enum dsv4_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------ allocation guard */

/* Marks a region (per thread) where nothing may allocate; see alloc_guard.c. */
void          dsv4_alloc_guard_enter(void);
void          dsv4_alloc_guard_leave(void);
/* Allocations seen inside guarded regions since start (all threads): counted only where
 * alloc_interpose.c is compiled in (the test runner, DSV4_DEBUG builds). */
unsigned long dsv4_alloc_guard_count(void);
/* Exempts the calling thread's allocations while on (nested): a device backend turns it on
 * around its driver's calls, whose host allocations are the driver's (lavapipe's queue
 * submission allocates); dsv4's own code stays counted. */
void          dsv4_alloc_guard_exempt(bool on);
/* Called by the allocation hook for each allocation of n bytes. */
void          dsv4_alloc_guard_note(size_t n);

/* ------------------------------------------------------------------ checked arithmetic */

static inline bool dsv4_mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

static inline bool dsv4_add_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

/* ------------------------------------------------------------------ arena */

/*
 * A bump allocator for one lifetime (engine, session, step, request). Blocks come from
 * malloc when the arena grows; nothing is freed individually. dsv4_arena_mark/reset give
 * the "temp scope" used by per-step scratch.
 */
struct dsv4_arena_block;
struct dsv4_arena {
    struct dsv4_arena_block *head;      /* newest block */
    size_t                   block_min; /* minimum size of a new block */
    size_t                   used;      /* bytes handed out (statistics) */
};

struct dsv4_arena_mark {
    struct dsv4_arena_block *block;
    size_t                   off;
};

void  dsv4_arena_init(struct dsv4_arena *a, size_t block_min);
void  dsv4_arena_free(struct dsv4_arena *a);
void *dsv4_arena_alloc(struct dsv4_arena *a, size_t size, size_t align); /* NULL on OOM */
void *dsv4_arena_zalloc(struct dsv4_arena *a, size_t size, size_t align);
char *dsv4_arena_strdup(struct dsv4_arena *a, const char *s);
struct dsv4_arena_mark dsv4_arena_get_mark(const struct dsv4_arena *a);
void  dsv4_arena_reset_to(struct dsv4_arena *a, struct dsv4_arena_mark m);

/* ------------------------------------------------------------------ string map */

/* Open-addressing map from NUL-terminated keys (not copied) to pointers. */
struct dsv4_strmap {
    const char **keys;
    void       **vals;
    size_t       cap; /* power of two */
    size_t       len;
};

int   dsv4_strmap_init(struct dsv4_strmap *m, size_t expected);
void  dsv4_strmap_free(struct dsv4_strmap *m);
/* Inserts or replaces; returns DSV4_OK or DSV4_ENOMEM. *old receives a replaced value. */
int   dsv4_strmap_put(struct dsv4_strmap *m, const char *key, void *val, void **old);
void *dsv4_strmap_get(const struct dsv4_strmap *m, const char *key);
uint64_t dsv4_hash_bytes(const void *p, size_t n, uint64_t seed);

/* ------------------------------------------------------------------ checksums (checksum.c) */

/* CRC-32C (Castagnoli) of p[0, n), continuing from crc (0 to start): crc32c("123456789") is
 * 0xE3069283. */
uint32_t dsv4_crc32c(uint32_t crc, const void *p, size_t n);
/* SHA-256 (FIPS 180-4) of p[0, n). */
void     dsv4_sha256(const void *p, size_t n, uint8_t out[32]);

/* ------------------------------------------------------------------ number formats */

/* bf16: round-to-nearest-even; NaN stays NaN (quiet). Inline: on every hot path. */
static inline uint16_t dsv4_bf16_from_f32(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float dsv4_f32_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float    x;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/* Round x to the nearest bf16 value and return it as float. */
static inline float dsv4_round_bf16(float x)
{
    return dsv4_f32_from_bf16(dsv4_bf16_from_f32(x));
}

/* IEEE binary16: RNE, overflow to inf, subnormals. */
uint16_t dsv4_f16_from_f32(float x);
float    dsv4_f32_from_f16(uint16_t h);

/* FP8 e4m3fn: bias 7, no inf, NaN only at 0x7F/0xFF, max 448. Encoding saturates finite
 * values to +-448 (as torch's clamp-then-cast in the reference); NaN encodes as 0x7F. */
uint8_t dsv4_e4m3_from_f32(float x);
/* Decoding is bit construction (exact): normal codes map to an f32 with the exponent
 * rebiased by 120, subnormals are m * 2^-9. */
static inline float dsv4_f32_from_e4m3(uint8_t c)
{
    uint32_t e = (c >> 3) & 15u, m = c & 7u, u;
    float    x;
    if (e == 15 && m == 7) return __builtin_nanf("");
    if (e == 0) {
        x = (float)m * 0x1p-9f;
        return (c & 0x80) ? -x : x;
    }
    u = ((uint32_t)(c & 0x80) << 24) | ((e + 120u) << 23) | (m << 20);
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/* FP8 e5m2: bias 15, inf and NaN as IEEE. Encoding is RNE with overflow to inf
 * (IEEE semantics, as torch's float8_e5m2 cast). */
uint8_t dsv4_e5m2_from_f32(float x);
float   dsv4_f32_from_e5m2(uint8_t c);

/* e8m0: value 2^(e-127); 255 = NaN. Encoding takes the exponent of a positive power of two
 * (other inputs round up to the next power of two, the "ue8m0" rule of the reference);
 * zero, negative and NaN inputs encode as 255. */
uint8_t dsv4_e8m0_from_f32(float x);
static inline float dsv4_f32_from_e8m0(uint8_t e)
{
    if (e == 255) return __builtin_nanf("");
    if (e == 0) return 0x1p-127f;
    uint32_t u = (uint32_t)e << 23;
    float    x;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

/* FP4 e2m1: bit 3 sign, magnitudes {0,.5,1,1.5,2,3,4,6}. Encoding RNE, saturating at 6;
 * NaN encodes as 0 (e2m1 has no NaN). Packed bytes: low nibble = even index. */
uint8_t dsv4_e2m1_from_f32(float x);
static inline float dsv4_f32_from_e2m1(uint8_t code)
{
    static const float mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
    float              v      = mag[code & 7];
    return (code & 8) ? -v : v;
}

/* Power-of-two scale 2^ceil(log2(x)) for x > 0, computed exactly on the float's bits. */
float dsv4_pow2_ceil(float x);

/* The same for a normal positive x, inline (the SIMD quantisers' per-block scale). */
static inline float dsv4_pow2_ceil_normal(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x800000u;
    __builtin_memcpy(&x, &u, 4);
    return x;
}

#endif /* DSV4_CORE_H */
