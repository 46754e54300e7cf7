/*
 * cpu.c - CPU feature detection, the dispatch level, and the backend state (thread pool).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fp4_exact.h"
#if DSV4_HAVE_X86
#include <cpuid.h>
#endif

#if DSV4_HAVE_NEON
static const char *const level_names[DSV4_CPU_LEVELS] = { "scalar", "neon", "avx512", "avx512bf16", "amx" };
#else
static const char *const level_names[DSV4_CPU_LEVELS] = { "scalar", "avx2", "avx512", "avx512bf16", "amx" };
#endif

const char *dsv4_cpu_level_name(enum dsv4_cpu_level l)
{
    return (unsigned)l < DSV4_CPU_LEVELS ? level_names[l] : "?";
}

bool dsv4_cpu_level_built(enum dsv4_cpu_level l)
{
    return l == DSV4_CPU_SCALAR || (DSV4_HAVE_X86 && (unsigned)l < DSV4_CPU_LEVELS) || (DSV4_HAVE_NEON && l == DSV4_CPU_NEON);
}

#if DSV4_HAVE_X86
/* AMX tiles need the kernel's permission for the XTILEDATA state component, once per process. */
static bool amx_permitted(void)
{
#if defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}
#endif

enum dsv4_cpu_level dsv4_cpu_detect(void)
{
#if DSV4_HAVE_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return DSV4_CPU_SCALAR;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
        return DSV4_CPU_AVX2;
    if (!__builtin_cpu_supports("avx512bf16")) return DSV4_CPU_AVX512;
    if (!(__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16")) || !amx_permitted())
        return DSV4_CPU_AVX512BF16;
    return DSV4_CPU_AMX;
#elif DSV4_HAVE_NEON
    return DSV4_CPU_NEON; /* Advanced SIMD is part of every AArch64 core */
#else
    return DSV4_CPU_SCALAR; /* the only level built (no kernels for this architecture yet) */
#endif
}

/* Asked-for levels this build lacks are an error, not the best level quietly: a caller
 * that names avx2 on another architecture would otherwise measure or test scalar code. */
static int not_built(enum dsv4_cpu_level l, struct dsv4_err *err)
{
    return dsv4_err_set(err, DSV4_EUNSUPPORTED, "level %s is not built for this architecture", dsv4_cpu_level_name(l));
}

bool dsv4_cpu_fp4x_built(void)
{
    return DSV4_HAVE_X86;
}

int dsv4_cpu_pick(const char *name, enum dsv4_cpu_level *level, bool *ref, bool *fp4x, struct dsv4_err *err)
{
    enum dsv4_cpu_level best = dsv4_cpu_detect();
    *level                   = best;
    *ref                     = false;
    *fp4x                    = false;
    const char *env          = name;
    if (!env || !*env) return DSV4_OK;
    if (strcmp(env, "ref") == 0) {
        *level = DSV4_CPU_SCALAR;
        *ref   = true;
        return DSV4_OK;
    }
    if (strcmp(env, DSV4_CPU_FP4X_NAME) == 0 || strcmp(env, DSV4_CPU_FP4X512_NAME) == 0) {
        enum dsv4_cpu_level want = env[3] == '5' ? DSV4_CPU_AVX512 : DSV4_CPU_AVX2;
        if (!dsv4_cpu_fp4x_built())
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "level %s is not built for this architecture", env);
        if (best < DSV4_CPU_AVX2)
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this CPU does not support the %s level", env);
        /* capped as the levels are: avx512-int on a CPU without AVX-512 is avx2-int, whose FP4
         * bits are the same (an expert rank on such a CPU still opens) */
        if (best < want) want = DSV4_CPU_AVX2;
        *level = want;
        *fp4x  = true;
        return DSV4_OK;
    }
    for (int l = 0; l < DSV4_CPU_LEVELS; l++) {
        if (strcmp(env, level_names[l]) == 0) {
            if (!dsv4_cpu_level_built((enum dsv4_cpu_level)l)) return not_built((enum dsv4_cpu_level)l, err);
            *level = (enum dsv4_cpu_level)l < best ? (enum dsv4_cpu_level)l : best;
            return DSV4_OK;
        }
    }
    char names[128] = "ref";
    for (int l = 0; l < DSV4_CPU_LEVELS && dsv4_cpu_level_built((enum dsv4_cpu_level)l); l++) {
        size_t u = strlen(names);
        snprintf(names + u, sizeof(names) - u, ", %s", level_names[l]);
    }
    if (dsv4_cpu_fp4x_built()) {
        size_t u = strlen(names);
        snprintf(names + u, sizeof(names) - u, ", %s, %s", DSV4_CPU_FP4X_NAME, DSV4_CPU_FP4X512_NAME);
    }
    return dsv4_err_set(err, DSV4_EINVAL, "CPU level '%s' is not one of %s", env, names);
}

const struct dsv4_kernels *dsv4_cpu_kernels(enum dsv4_cpu_level l)
{
    switch (l) {
#if DSV4_HAVE_X86
    case DSV4_CPU_AVX2: return &dsv4_kernels_avx2;
    case DSV4_CPU_AVX512:
    case DSV4_CPU_AVX512BF16:
    case DSV4_CPU_AMX: return &dsv4_kernels_avx512;
#endif
#if DSV4_HAVE_NEON
    case DSV4_CPU_NEON: return &dsv4_kernels_neon;
#endif
    default: return &dsv4_kernels_scalar;
    }
}

const struct dsv4_kernels *dsv4_cpu_kernels_bf16(enum dsv4_cpu_level l)
{
#if DSV4_HAVE_X86
    if (l >= DSV4_CPU_AMX) return &dsv4_kernels_amx;
    if (l >= DSV4_CPU_AVX512BF16) return &dsv4_kernels_avx512bf16;
#endif
    (void)l;
    return NULL;
}

#if DSV4_HAVE_X86
/* AMD Zen 5 (family 1Ah): full-width 512-bit units decode FP4 and BF16 rows in the shadow of
 * the FMAs, so at the avx512 level the GEMV, which decodes per four tokens but keeps the
 * weights in registers, beats the GEMM's decoded buffer up to at least 24 tokens (docs/PERF.md,
 * "Where the GEMV beats the GEMM"). Elsewhere the default, measured on Zen 3 and Zen 4. */
static bool cpu_is_zen5_or_later(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u) return false; /* "Auth"enticAMD */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned family = (a >> 8) & 15u;
    if (family == 15u) family += (a >> 20) & 255u;
    return family >= 0x1Au;
}
#endif

int dsv4_cpu_gemm_min(enum dsv4_cpu_level level, const char *spec, int min[4], struct dsv4_err *err)
{
    for (int i = 0; i < 4; i++) min[i] = DSV4_F32_GEMM_MIN_TOKENS;
#if DSV4_HAVE_X86
    if (level >= DSV4_CPU_AVX512 && cpu_is_zen5_or_later()) min[1] = min[2] = 17;
#else
    (void)level;
#endif
    if (!spec || !*spec) return DSV4_OK;
    const char *p = spec;
    for (int i = 0; i < 3; i++) {
        char *end;
        long  v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > DSV4_F32_GEMM_MIN_MAX || *end != (i < 2 ? ',' : '\0'))
            return dsv4_err_set(err, DSV4_EINVAL,
                                "GEMM crossovers '%s': want three token counts FP8,FP4,BF16 in 1..%d (e.g. 5,17,17)", spec,
                                DSV4_F32_GEMM_MIN_MAX);
        min[i] = (int)v;
        p      = end + 1;
    }
    return DSV4_OK;
}

static int create(struct dsv4_cpu **out, enum dsv4_cpu_level level, bool ref, bool fp4x, const char *gemm_min,
                  int n_threads, struct dsv4_err *err);

int dsv4_cpu_create(struct dsv4_cpu **out, const char *level_name, const char *gemm_min, int n_threads,
                    struct dsv4_err *err)
{
    enum dsv4_cpu_level level;
    bool                ref, fp4x;
    *out   = NULL;
    int rc = dsv4_cpu_pick(level_name, &level, &ref, &fp4x, err);
    if (rc) return rc;
    return create(out, level, ref, fp4x, gemm_min, n_threads, err);
}

int dsv4_cpu_create_at(struct dsv4_cpu **out, enum dsv4_cpu_level level, bool ref, int n_threads, struct dsv4_err *err)
{
    return create(out, level, ref, false, NULL, n_threads, err);
}

int dsv4_cpu_create_fp4x(struct dsv4_cpu **out, int n_threads, struct dsv4_err *err)
{
    *out = NULL;
    return dsv4_cpu_create(out, DSV4_CPU_FP4X_NAME, NULL, n_threads, err);
}

const char *dsv4_cpu_name(const struct dsv4_cpu *cpu)
{
    if (cpu->fp4x) return cpu->level >= DSV4_CPU_AVX512 ? DSV4_CPU_FP4X512_NAME : DSV4_CPU_FP4X_NAME;
    return cpu->ref ? "ref" : dsv4_cpu_level_name(cpu->level);
}

/* The -int tables: the avx2 or avx512 level's, with the FP4 projections of fp4_exact.h on the
 * best integer dot product this CPU has at that width (all give the same bits). */
static void fp4x_table(struct dsv4_cpu *cpu)
{
#if DSV4_HAVE_X86
    dsv4_fp4x_init();
    bool zmm           = cpu->level >= DSV4_CPU_AVX512;
    cpu->kx            = zmm ? dsv4_kernels_avx512 : dsv4_kernels_avx2;
    cpu->kx.name       = zmm ? DSV4_CPU_FP4X512_NAME : DSV4_CPU_FP4X_NAME;
    cpu->kx.quant_fp4x = dsv4_fp4x_quant_avx2;
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    /* AVX-VNNI is CPUID.(7,1):EAX bit 4 (GCC 12's __builtin_cpu_supports misses it on Zen 5) */
    bool avxvnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u);
    if (avxvnni) cpu->kx.dot_fp4 = dsv4_fp4x_dot_vnni;
    else if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")) cpu->kx.dot_fp4 = dsv4_fp4x_dot_v512;
    else cpu->kx.dot_fp4 = dsv4_fp4x_dot_avx2;
    if (zmm) cpu->kx.dot_fp4 = __builtin_cpu_supports("avx512vnni") ? dsv4_fp4x_dot_z512v : dsv4_fp4x_dot_z512;
    cpu->k = &cpu->kx;
#else
    (void)cpu;
#endif
}

static int create(struct dsv4_cpu **out, enum dsv4_cpu_level level, bool ref, bool fp4x, const char *gemm_min,
                  int n_threads, struct dsv4_err *err)
{
    *out = NULL;
    if (!dsv4_cpu_level_built(level)) return not_built(level, err);
    if (level > dsv4_cpu_detect())
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this CPU does not support the %s level", dsv4_cpu_level_name(level));
    int gmin[4];
    int rc = dsv4_cpu_gemm_min(level, gemm_min, gmin, err);
    if (rc) return rc;
    /* avx2-int's FP4 GEMV (integer dot products, decoded every 4 tokens) keeps up with its f32
     * GEMM (5 FP operations per 4 products) to about 16 tokens, and so does avx512-int's
     * (docs/PERF.md, "The avx2-int and avx512-int sub-levels"); the same bits either way */
    if (fp4x && !(gemm_min && *gemm_min)) gmin[1] = DSV4_FP4X_GEMM_MIN;
    struct dsv4_cpu *cpu = calloc(1, sizeof(*cpu));
    if (!cpu) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    cpu->level = level;
    cpu->ref   = ref;
    rc         = dsv4_pool_create(&cpu->pool, n_threads, err);
    if (rc) {
        free(cpu);
        return rc;
    }
    cpu->k         = dsv4_cpu_kernels(cpu->level);
    cpu->kb        = dsv4_cpu_kernels_bf16(cpu->level);
    cpu->fp4x      = fp4x;
    if (fp4x) fp4x_table(cpu);
    memcpy(cpu->gemm_min, gmin, sizeof(gmin));
    cpu->n_threads = dsv4_pool_threads(cpu->pool);
    *out           = cpu;
    return DSV4_OK;
}

void dsv4_cpu_free(struct dsv4_cpu *cpu)
{
    if (!cpu) return;
    if (cpu->tiles) munmap(cpu->tiles, cpu->tiles_bytes);
    free(cpu->preps);
    free(cpu->placed);
    dsv4_pool_free(cpu->pool);
    free(cpu);
}
