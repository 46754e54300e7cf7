/*
 * test_forward.c - the forward pass through the public session API: chunk invariance
 * (bit-identical logits at chunk sizes 1, 3, 7 and T, MTP included), window wrap and
 * compression-block boundaries on tiny-a and tiny-b, errors that change nothing (context
 * full, bad token id), and the allocation guard: decoding allocates nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/core.h"
#include "engine/session.h"
#include "support/gen.h"
#include "io/io.h"
#include "model/runtime.h"
#include "test_cases.h"

static bool make_model(struct test_ctx *t, const char *preset, unsigned long long seed, const char *name, char *dir,
                       size_t n)
{
    snprintf(dir, n, "%s/%s", t->tmpdir, name);
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = preset;
    o.seed   = seed;
    o.quiet  = true;
    struct dsv4_err err;
    int             rc = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen: %s", err.msg);
    return rc == DSV4_OK;
}

static int32_t *random_tokens(int T, int vocab, unsigned long long seed)
{
    int32_t *v = malloc(sizeof(int32_t) * (size_t)T);
    for (int i = 0; i < T; i++) v[i] = (int32_t)(test_rand_u64(&seed) % (unsigned long long)vocab);
    return v;
}

/* Runs T tokens in chunks of `chunk`; returns malloc'd [T, V] logits and [T-1, V] MTP logits. */
static float *run_chunked(struct test_ctx *t, dsv4_engine *e, const int32_t *toks, int T, int chunk, float **mtp)
{
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = T;
    sp.max_chunk = chunk;
    sp.mtp       = mtp != NULL;
    dsv4_session   *s;
    struct dsv4_err err;
    if (dsv4_session_create(e, &sp, &s, &err)) {
        CHECKF(0, "session: %s", err.msg);
        return NULL;
    }
    size_t V  = (size_t)info.vocab_size;
    float *lg = calloc((size_t)T * V, sizeof(float));
    float *ml = mtp ? calloc((size_t)T * V, sizeof(float)) : NULL;
    int    nm = 0;
    for (int off = 0; off < T; off += chunk) {
        int n = T - off < chunk ? T - off : chunk, got = 0;
        int rc = dsv4_session_eval(s, toks + off, n, lg + (size_t)off * V, ml ? ml + (size_t)nm * V : NULL, &got, &err);
        CHECKF(rc == DSV4_OK, "eval: %s", err.msg);
        nm += got;
    }
    if (mtp) {
        CHECKF(nm == T - 1, "MTP rows %d, expected %d", nm, T - 1);
        *mtp = ml;
    }
    dsv4_session_free(s);
    return lg;
}

/* Logits and MTP logits on a backend that is not host-visible (kind) are those of e (cpu),
 * bit for bit. The RoPE tables reach it through each_tensor: cpu reads the model's in place,
 * kind gave rope its own copies (read back through download: cpu-strict's cannot be read in
 * place). */
static void device_path_same_bits(struct test_ctx *t, dsv4_engine *e, const char *dir, const char *preset,
                                  const char *kind, const int32_t *toks, int T, const float *ref, const float *ref_mtp)
{
    struct dsv4_engine_params ep;
    struct dsv4_err           err;
    dsv4_engine_params_default(&ep);
    ep.backend = kind;
    dsv4_engine *es;
    if (dsv4_engine_open(&es, dir, &ep, &err) != DSV4_OK) {
        CHECKF(0, "open %s: %s", kind, err.msg);
        return;
    }
    const struct dsv4_model *mc = dsv4_engine_model(e), *ms = dsv4_engine_model(es);
    size_t V = (size_t)mc->cfg.vocab_size, half = sizeof(float) * (size_t)(ms->cfg.d_rope / 2);
    float *mtp = NULL, *lg = run_chunked(t, es, toks, T, 7, &mtp);
    CHECKF(lg && memcmp(lg, ref, (size_t)T * V * sizeof(float)) == 0, "%s: %s logits differ", preset, kind);
    CHECKF(mtp && memcmp(mtp, ref_mtp, (size_t)(T - 1) * V * sizeof(float)) == 0, "%s: %s MTP logits differ", preset,
           kind);
    CHECK(mc->rope_swa.freq == mc->freq_swa && mc->rope_comp.freq == mc->freq_comp);
    CHECKF(ms->rope_swa.freq != ms->freq_swa && ms->rope_comp.freq != ms->freq_comp,
           "%s: %s's rope reads the model's host tables", preset, kind);
    float swa[256], comp[256];
    CHECK(half <= sizeof(swa));
    if (half <= sizeof(swa)) {
        ms->backend->download(ms->backend_impl, swa, ms->rope_swa.freq, half);
        ms->backend->download(ms->backend_impl, comp, ms->rope_comp.freq, half);
        CHECK(!memcmp(swa, ms->freq_swa, half) && !memcmp(comp, ms->freq_comp, half));
    }
    free(lg);
    free(mtp);
    dsv4_engine_close(es);
}

static void chunk_invariance(struct test_ctx *t, const char *preset, int T)
{
    char dir[256];
    if (!make_model(t, preset, 11, preset, dir, sizeof(dir))) return;
    dsv4_engine              *e;
    struct dsv4_err           err;
    struct dsv4_engine_params ep;
    test_engine_params(&ep); /* the run's backend: the determinism is every backend's */
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "open: %s", err.msg);
        return;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    CHECK(info.has_mtp);
    int32_t *toks = random_tokens(T, info.vocab_size, 99);
    float   *ref_mtp = NULL, *ref = run_chunked(t, e, toks, T, T, &ref_mtp);
    size_t   V = (size_t)info.vocab_size;
    int      chunks[] = { 1, 3, 7 };
    for (int c = 0; c < 3 && ref; c++) {
        float *mtp = NULL, *lg = run_chunked(t, e, toks, T, chunks[c], &mtp);
        if (!lg) break;
        CHECKF(memcmp(lg, ref, (size_t)T * V * sizeof(float)) == 0, "%s: logits at chunk %d differ from one prefill", preset,
               chunks[c]);
        CHECKF(memcmp(mtp, ref_mtp, (size_t)(T - 1) * V * sizeof(float)) == 0, "%s: MTP logits at chunk %d differ", preset,
               chunks[c]);
        free(lg);
        free(mtp);
    }
    /* the same bits through the device-memory path (logits downloaded, KV through the
     * backend's upload and copy), and on memory the host cannot read (against the CPU's bits:
     * only when the run is on the CPU) */
    for (int k = 0; ref && !test_backend && k < 2; k++)
        device_path_same_bits(t, e, dir, preset, k ? "cpu-strict" : "cpu-staged", toks, T, ref, ref_mtp);
    /* logits are finite and not degenerate */
    bool   finite = true;
    double ss = 0;
    for (size_t i = 0; ref && i < (size_t)T * V; i++) {
        finite &= isfinite(ref[i]);
        ss += (double)ref[i] * ref[i];
    }
    CHECK(finite);
    CHECK(ss / ((double)T * (double)V) > 1e-3);
    free(ref);
    free(ref_mtp);
    free(toks);
    dsv4_engine_close(e);
}

/* The GEMV/GEMM crossovers are each engine's own: a second engine in the process keeps the
 * first one's, and the two (GEMM from one token, GEMV up to 64) give the same bits. */
static void test_engines_keep_own_gemm_min(struct test_ctx *t)
{
    char dir[256];
    if (!make_model(t, "tiny-a", 13, "gmin", dir, sizeof(dir))) return;
    static const char *const spec[2] = { "gemm_min=1,1,1", "gemm_min=64,64,64" };
    dsv4_engine             *e[2]    = { NULL, NULL };
    struct dsv4_err          err;
    for (int i = 0; i < 2; i++) {
        struct dsv4_engine_params ep;
        dsv4_engine_params_default(&ep);
        ep.backend_opts = spec[i];
        ep.n_threads    = 2;
        CHECKF(dsv4_engine_open(&e[i], dir, &ep, &err) == DSV4_OK, "open with gemm_min %s: %s", spec[i], err.msg);
        if (!e[i]) goto done;
    }
    for (int i = 0; i < 2; i++) {
        struct dsv4_engine_settings es;
        dsv4_engine_settings(e[i], &es);
        int want = i ? 64 : 1;
        CHECKF(es.gemm_min[0] == want && es.gemm_min[1] == want && es.gemm_min[2] == want,
               "engine %d (gemm_min %s) reports %d,%d,%d after the other opened", i, spec[i], es.gemm_min[0],
               es.gemm_min[1], es.gemm_min[2]);
        CHECK(es.n_threads == 2 && es.tiles && es.revision == DSV4_REVISION_CURRENT && !es.profiling);
        CHECK(!strcmp(es.backend, "cpu") && es.level[0]);
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e[0], &info);
    int      T    = 24;
    int32_t *toks = random_tokens(T, info.vocab_size, 5);
    float   *a = run_chunked(t, e[0], toks, T, T, NULL), *b = run_chunked(t, e[1], toks, T, T, NULL);
    CHECKF(a && b && memcmp(a, b, sizeof(float) * (size_t)T * (size_t)info.vocab_size) == 0,
           "the GEMM and the GEMV engines' logits differ");
    free(a);
    free(b);
    free(toks);
done:
    dsv4_engine_close(e[0]);
    dsv4_engine_close(e[1]);
}

/* A -int sub-level (exact FP4 block sums, src/backend/cpu/fp4_exact.h): its logits do not
 * depend on the chunk or on the GEMV/GEMM crossover, and they are close to its base level's (often the same bits: the experts' outputs are rounded to bf16; test_fp4_exact.c
 * shows the projections themselves differ). */
static void fp4x_invariance_at(struct test_ctx *t, const char *dir, const char *sub, const char *base)
{
    char opts[3][64];
    snprintf(opts[0], sizeof(opts[0]), "level=%s,gemm_min=1,1,1", sub);
    snprintf(opts[1], sizeof(opts[1]), "level=%s,gemm_min=64,64,64", sub);
    snprintf(opts[2], sizeof(opts[2]), "level=%s", base);
    dsv4_engine *e[3] = { NULL, NULL, NULL };
    float       *lg[3] = { NULL, NULL, NULL };
    int          T = 53;
    int32_t     *toks = NULL;
    size_t       V = 0;
    for (int i = 0; i < 3; i++) {
        struct dsv4_engine_params ep;
        struct dsv4_err           err;
        dsv4_engine_params_default(&ep);
        ep.backend_opts = opts[i];
        ep.n_threads    = 2;
        CHECKF(dsv4_engine_open(&e[i], dir, &ep, &err) == DSV4_OK, "open with %s: %s", opts[i], err.msg);
        if (!e[i]) goto done;
        struct dsv4_model_info info;
        dsv4_engine_info(e[i], &info);
        V = (size_t)info.vocab_size;
        if (!toks) toks = random_tokens(T, info.vocab_size, 99);
        lg[i] = run_chunked(t, e[i], toks, T, T, NULL);
        if (!lg[i]) goto done;
    }
    struct dsv4_engine_settings es;
    dsv4_engine_settings(e[0], &es);
    CHECKF(!strcmp(es.level, sub), "the engine reports level %s", es.level);
    CHECKF(memcmp(lg[0], lg[1], (size_t)T * V * sizeof(float)) == 0, "%s: the GEMM and the GEMV logits differ", sub);
    for (int c = 1; c <= 7; c += 6) {
        float *l = run_chunked(t, e[0], toks, T, c, NULL);
        CHECKF(l && memcmp(l, lg[0], (size_t)T * V * sizeof(float)) == 0, "%s: logits at chunk %d differ", sub, c);
        free(l);
    }
    double dmax = 0, amax = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        dmax = fmax(dmax, fabs((double)lg[0][i] - lg[2][i]));
        amax = fmax(amax, fabs((double)lg[2][i]));
    }
    CHECKF(dmax < 0.05 * amax, "%s is far from %s: max difference %g of logits up to %g", sub, base, dmax, amax);
done:
    for (int i = 0; i < 3; i++) {
        free(lg[i]);
        dsv4_engine_close(e[i]);
    }
    free(toks);
}

static void test_fp4x_invariance(struct test_ctx *t)
{
    if (!DSV4_HAVE_X86 || dsv4_cpu_detect() < DSV4_CPU_AVX2) {
        test_skip(t, TEST_SKIP_MACHINE, "the -int sub-levels need an x86 CPU with AVX2");
        return;
    }
    char dir[256];
    if (!make_model(t, "tiny-a", 11, "tiny-a", dir, sizeof(dir))) return;
    fp4x_invariance_at(t, dir, "avx2-int", "avx2");
    if (dsv4_cpu_detect() >= DSV4_CPU_AVX512) fp4x_invariance_at(t, dir, "avx512-int", "avx512");
    else test_not_here(t, "avx512-int");
}

static void test_chunk_invariance_tiny_a(struct test_ctx *t)
{
    /* window 16 wraps several times; CSA blocks of 4 and HCA blocks of 16 complete inside
     * chunks and across chunk boundaries */
    chunk_invariance(t, "tiny-a", 53);
}

static void test_chunk_invariance_tiny_b(struct test_ctx *t)
{
    /* window 128 wraps; the first ratio-128 block completes at position 127 */
    chunk_invariance(t, "tiny-b", 140);
}

static void test_errors_change_nothing(struct test_ctx *t)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/tiny-a", t->tmpdir);
    dsv4_engine              *e;
    struct dsv4_err           err;
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "open: %s", err.msg);
        return;
    }
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx = 8;
    dsv4_session *s = NULL;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    if (!s) {
        dsv4_engine_close(e);
        return;
    }
    int32_t toks[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
    CHECK(dsv4_session_eval(s, toks, 5, NULL, NULL, NULL, &err) == DSV4_OK);
    float        keep[2048] = { 0 };
    const float *lg0        = dsv4_session_logits(s);
    CHECK(lg0 != NULL);
    if (lg0) memcpy(keep, lg0, sizeof(keep));
    CHECK(dsv4_session_eval(s, toks, 4, NULL, NULL, NULL, &err) == DSV4_ERANGE);
    CHECKF(strstr(err.msg, "context") != NULL, "%s", err.msg);
    int32_t bad[2] = { 3, 2048 };
    CHECK(dsv4_session_eval(s, bad, 2, NULL, NULL, NULL, &err) == DSV4_ERANGE);
    CHECKF(strstr(err.msg, "2048") != NULL, "%s", err.msg);
    bad[1] = -1;
    CHECK(dsv4_session_eval(s, bad, 2, NULL, NULL, NULL, &err) == DSV4_ERANGE);
    CHECK(dsv4_session_eval(s, toks, 0, NULL, NULL, NULL, &err) == DSV4_EINVAL);
    CHECK(dsv4_session_pos(s) == 5);
    CHECK(lg0 && dsv4_session_logits(s) && memcmp(keep, dsv4_session_logits(s), sizeof(keep)) == 0);
    CHECK(dsv4_session_eval(s, toks + 5, 3, NULL, NULL, NULL, &err) == DSV4_OK); /* fills the context exactly */
    CHECK(dsv4_session_pos(s) == 8);
    dsv4_session_free(s);
    sp.max_ctx = 1 << 30;
    CHECK(dsv4_session_create(e, &sp, &s, &err) == DSV4_EINVAL);
    sp.max_ctx = 16;
    sp.mtp     = true;
    CHECK(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK);
    dsv4_session_free(s);
    dsv4_engine_close(e);
    CHECK(dsv4_engine_open(&e, "/nonexistent/dir", NULL, &err) == DSV4_EIO);
}

static void test_no_alloc_while_decoding(struct test_ctx *t)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/tiny-a", t->tmpdir);
    dsv4_engine              *e;
    struct dsv4_err           err;
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "open: %s", err.msg);
        return;
    }
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = 96;
    sp.max_chunk = 16;
    sp.mtp       = true;
    dsv4_session *s = NULL;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    if (!s) {
        dsv4_engine_close(e);
        return;
    }
    int32_t *toks = random_tokens(96, 2048, 5);
    float   *lg   = malloc(sizeof(float) * 40 * 2048), *ml = malloc(sizeof(float) * 40 * 2048);
    int      n_mtp;
    /* a first session of the same shape (a prefill and a few decode steps), unmeasured: a
     * device backend makes what it keeps for the engine's life at first use (the Vulkan
     * backend's table of each layer's experts, its step buffers at the largest step); the
     * measured session then allocates nothing, from its prefill on (the CPU allocates nothing
     * in either) */
    dsv4_session *warm = NULL;
    CHECKF(dsv4_session_create(e, &sp, &warm, &err) == DSV4_OK, "session: %s", err.msg);
    if (warm) {
        CHECK(dsv4_session_eval(warm, toks, 40, lg, ml, &n_mtp, &err) == DSV4_OK);
        for (int i = 40; i < 44; i++) CHECK(dsv4_session_eval(warm, toks + i, 1, NULL, ml, &n_mtp, &err) == DSV4_OK);
        dsv4_session_free(warm);
    }
    unsigned long before = dsv4_alloc_guard_count();
    CHECK(dsv4_session_eval(s, toks, 40, lg, ml, &n_mtp, &err) == DSV4_OK); /* chunked prefill */
    for (int i = 40; i < 96; i++) CHECK(dsv4_session_eval(s, toks + i, 1, NULL, ml, &n_mtp, &err) == DSV4_OK);
    CHECKF(dsv4_alloc_guard_count() == before, "%lu allocations while evaluating tokens",
           dsv4_alloc_guard_count() - before);
    /* the guard does count: an allocation inside a guarded region is seen */
    dsv4_alloc_guard_enter();
    char *volatile p = malloc(64);
    dsv4_alloc_guard_leave();
    if (p) p[0] = 1;
    free(p);
    CHECK(dsv4_alloc_guard_count() == before + 1);
    free(lg);
    free(ml);
    free(toks);
    dsv4_session_free(s);
    dsv4_engine_close(e);
}

/* dsv4 convert: the native checkpoint is page-aligned and gives the same logits. */
/* Decode steps on the staged backend, counted by the profiler (prof_xfer.h): a step's
 * transfers over the step before, by kind. */
static void decode_xfers(struct test_ctx *t, dsv4_engine *e, dsv4_session *s, int32_t tok, bool mtp, uint64_t *d)
{
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    size_t          V  = (size_t)info.vocab_size;
    float          *lg = calloc(V, sizeof(float)), *ml = calloc(V, sizeof(float));
    uint64_t        a[DSV4_XFER_COUNT], b[DSV4_XFER_COUNT];
    struct dsv4_err err;
    int             got = 0;
    dsv4_prof_xfers(e->model.prof, a);
    CHECKF(dsv4_session_eval(s, &tok, 1, lg, mtp ? ml : NULL, &got, &err) == DSV4_OK, "eval: %s", err.msg);
    dsv4_prof_xfers(e->model.prof, b);
    for (int x = 0; x < DSV4_XFER_COUNT; x++) d[x] = b[x] - a[x];
    free(lg);
    free(ml);
}

/* A tiny-a engine on `backend` (NULL: the default) with the profiler on (its trace named
 * after tag), or NULL. */
static dsv4_engine *open_profiled(struct test_ctx *t, const char *backend, const char *tag)
{
    char dir[256], trace[300];
    if (!make_model(t, "tiny-a", 5, tag, dir, sizeof(dir))) return NULL;
    snprintf(trace, sizeof(trace), "%s/%s-trace.json", t->tmpdir, tag);
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    ep.backend      = backend;
    ep.profile_path = trace;
    dsv4_engine    *e = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_engine_open(&e, dir, &ep, &err) == DSV4_OK, "open %s: %s", backend ? backend : "cpu", err.msg);
    return e;
}

/* The host learns nothing inside a step (docs/BACKENDS.md, "No read-back inside a step"):
 * a decode step on cpu-staged downloads the logits and nothing else (the MTP head's too when
 * asked for), with one host synchronisation per download and no upload. Its copies stay on
 * the backend: the main head's row gather, and with MTP the block's input row and the
 * pending row for the next step (forward.c). Its MoE layers read nothing back. */
static void decode_transfer_counts(struct test_ctx *t, const char *kind)
{
    dsv4_engine    *e = open_profiled(t, kind, kind);
    struct dsv4_err err;
    if (!e) return;
    CHECK(e->model.prof != NULL);
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    for (int mtp = 0; mtp < 2; mtp++) {
        struct dsv4_session_params sp;
        dsv4_session_params_default(&sp);
        sp.max_ctx = 32, sp.max_chunk = 8, sp.mtp = mtp;
        dsv4_session *s;
        if (dsv4_session_create(e, &sp, &s, &err)) {
            CHECKF(0, "session: %s", err.msg);
            break;
        }
        int32_t  prompt[5] = { 3, 1, 4, 1, 5 };
        float   *lg        = calloc(5 * (size_t)info.vocab_size, sizeof(float)); /* [5, vocab] */
        int      got       = 0;
        uint64_t d[DSV4_XFER_COUNT];
        CHECKF(dsv4_session_eval(s, prompt, 5, lg, NULL, &got, &err) == DSV4_OK, "prefill: %s", err.msg);
        for (int step = 0; step < 3; step++) {
            decode_xfers(t, e, s, 2 + step, mtp, d);
            uint64_t want_dl = mtp ? 2 : 1;
            CHECKF(d[DSV4_XFER_DOWNLOAD] == want_dl, "%s mtp %d step %d: %llu downloads, want %llu", kind, mtp, step,
                   (unsigned long long)d[DSV4_XFER_DOWNLOAD], (unsigned long long)want_dl);
            CHECKF(d[DSV4_XFER_SYNC] == want_dl, "%s mtp %d step %d: %llu synchronisations, want %llu", kind, mtp,
                   step, (unsigned long long)d[DSV4_XFER_SYNC], (unsigned long long)want_dl);
            CHECKF(d[DSV4_XFER_UPLOAD] == 0, "%s mtp %d step %d: %llu uploads", kind, mtp, step,
                   (unsigned long long)d[DSV4_XFER_UPLOAD]);
            uint64_t want_cp = mtp ? 3 : 1;
            CHECKF(d[DSV4_XFER_COPY] == want_cp, "%s mtp %d step %d: %llu copies, want %llu", kind, mtp, step,
                   (unsigned long long)d[DSV4_XFER_COPY], (unsigned long long)want_cp);
        }
        free(lg);
        dsv4_session_free(s);
    }
    dsv4_engine_close(e);
}

/* The calls of each op that one dsv4_forward step over seqs makes. */
static void step_calls(struct test_ctx *t, const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *q,
                       int n, uint64_t *calls)
{
    uint64_t        a[DSV4_OP_COUNT], b[DSV4_OP_COUNT];
    struct dsv4_err err;
    dsv4_prof_calls(m->prof, a);
    CHECKF(dsv4_forward(m, S, q, n, &err) == DSV4_OK, "step of %d sequences: %s", n, err.msg);
    dsv4_prof_calls(m->prof, b);
    for (int op = 0; op < DSV4_OP_COUNT; op++) calls[op] = b[op] - a[op];
}

/* The whole-step ops (docs/BACKENDS.md, "The step descriptor") make one call per layer
 * whatever the number of sequences: a step of three (a decode row, a chunk across a
 * compression block, a first chunk) calls step_begin, attention, indexer_topk and compress
 * as often as a step of one decode row, MTP block included; store_rows twice per attention
 * (staging, rings) and at most once per compressor (the rows of the blocks completed, none
 * when no sequence completes one). Sequences of different page sizes are refused. */
static void test_whole_step_calls(struct test_ctx *t)
{
    dsv4_engine    *e = open_profiled(t, NULL, "wstep");
    struct dsv4_err err;
    if (!e) return;
    const struct dsv4_model *m = dsv4_engine_model(e);
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx = 64, sp.max_chunk = 8, sp.mtp = true;
    dsv4_session *s[3] = { NULL, NULL, NULL };
    int32_t       tok[8] = { 3, 1, 4, 1, 5, 9, 2, 6 };
    for (int i = 0; i < 3; i++) CHECKF(dsv4_session_create(e, &sp, &s[i], &err) == DSV4_OK, "session: %s", err.msg);
    if (!s[0] || !s[1] || !s[2]) goto done;
    CHECK(dsv4_session_eval(s[0], tok, 5, NULL, NULL, NULL, &err) == DSV4_OK);
    CHECK(dsv4_session_eval(s[1], tok, 6, NULL, NULL, NULL, &err) == DSV4_OK);
    uint64_t one[DSV4_OP_COUNT], three[DSV4_OP_COUNT];
    struct dsv4_fwd_seq q[3] = { { .st = &s[0]->st, .tokens = tok, .n = 1 }, { .st = &s[1]->st, .tokens = tok, .n = 3 },
                                 { .st = &s[2]->st, .tokens = tok, .n = 2 } };
    step_calls(t, m, &s[0]->step, q, 3, three);
    step_calls(t, m, &s[0]->step, q, 1, one);
    static const enum dsv4_op ops[] = { DSV4_OP_STEP_BEGIN, DSV4_OP_ATTENTION, DSV4_OP_INDEXER_TOPK, DSV4_OP_COMPRESS };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        CHECKF(three[ops[i]] == one[ops[i]] && one[ops[i]] > 0, "%s: %llu calls for three sequences, %llu for one",
               dsv4_op_name(ops[i]), (unsigned long long)three[ops[i]], (unsigned long long)one[ops[i]]);
    for (int k = 0; k < 2; k++) {
        const uint64_t *c = k ? three : one;
        CHECKF(c[DSV4_OP_STORE_ROWS] >= 2 * c[DSV4_OP_ATTENTION] &&
                   c[DSV4_OP_STORE_ROWS] <= 2 * c[DSV4_OP_ATTENTION] + c[DSV4_OP_COMPRESS],
               "%s: %llu store_rows calls for %llu attention and %llu compress calls", k ? "three" : "one",
               (unsigned long long)c[DSV4_OP_STORE_ROWS], (unsigned long long)c[DSV4_OP_ATTENTION],
               (unsigned long long)c[DSV4_OP_COMPRESS]);
    }
    /* the per-layer offsets hold for every sequence of a step: a state of another page size
     * (its layout is never reached) is refused before anything runs */
    struct dsv4_seq_state other = s[2]->st;
    other.page_tokens           = s[2]->st.page_tokens / 4;
    int pos0                    = s[0]->st.pos;
    q[1].st                     = &other;
    CHECK(dsv4_forward(m, &s[0]->step, q, 2, &err) == DSV4_EINVAL);
    CHECKF(strstr(err.msg, "page size") != NULL && s[0]->st.pos == pos0, "%s", err.msg);
    /* one attention call per layer and one for the MTP block */
    CHECKF(one[DSV4_OP_ATTENTION] == (uint64_t)m->cfg.n_layer + 1, "%llu attention calls, %d layers + MTP",
           (unsigned long long)one[DSV4_OP_ATTENTION], m->cfg.n_layer);
done:
    for (int i = 0; i < 3; i++) dsv4_session_free(s[i]);
    dsv4_engine_close(e);
}

/* cpu-staged and cpu-strict alike: on cpu-strict a host read of a step buffer would also
 * fault, so the counts are all the host asks of its memory. */
static void test_staged_decode_transfers(struct test_ctx *t)
{
    decode_transfer_counts(t, "cpu-staged");
    decode_transfer_counts(t, "cpu-strict");
}

static void test_convert_roundtrip(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char dir[256], out[300], cmd[1200], *txt = NULL;
    snprintf(dir, sizeof(dir), "%s/tiny-b", t->tmpdir);
    snprintf(out, sizeof(out), "%s/tiny-b-native", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "%s convert -q -m %s -o %s", bin, dir, out);
    CHECKF(test_run(cmd, &txt) == 0, "convert: %s", txt);
    free(txt);
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    char                   path[400];
    snprintf(path, sizeof(path), "%s/model.safetensors", out);
    if (dsv4_checkpoint_open(&ck, path, &err)) { /* nothing to read, or compare, below */
        CHECKF(0, "%s", err.msg);
        return;
    }
    int aligned = 0, real = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        if (!strncmp(ck.tensors[i].name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX))) continue;
        real++;
        aligned += ck.tensors[i].offset % 4096 == 0;
    }
    CHECK(real > 400 && aligned == real);
    char fmt[64] = "";
    CHECK(dsv4_st_metadata(ck.files[0].data, ck.files[0].size, "format", fmt, sizeof(fmt)) && !strcmp(fmt, "dsv4-native"));
    dsv4_checkpoint_close(&ck);
    dsv4_engine *a = NULL, *b = NULL;
    CHECKF(dsv4_engine_open(&a, dir, NULL, &err) == DSV4_OK, "%s", err.msg);
    CHECKF(a && dsv4_engine_open(&b, out, NULL, &err) == DSV4_OK, "%s", err.msg);
    if (!a || !b) {
        dsv4_engine_close(a);
        return;
    }
    int32_t *toks = random_tokens(40, 2048, 8);
    float   *la = run_chunked(t, a, toks, 40, 40, NULL), *lb = run_chunked(t, b, toks, 40, 40, NULL);
    CHECK(la && lb && memcmp(la, lb, sizeof(float) * 40 * 2048) == 0);
    free(lb);
    dsv4_engine_close(b);
    /* --tiles, from the native checkpoint: every tiled projection's tiles stored beside it
     * ("NAME.i16"), the checkpoint still valid, and the same logits (the tiles are the ones
     * the loader would make) */
    char out2[320];
    snprintf(out2, sizeof(out2), "%s/tiny-b-tiles", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "%s convert -q --tiles -m %s -o %s && %s inspect -m %s", bin, out, out2, bin, out2);
    CHECKF(test_run(cmd, &txt) == 0, "convert --tiles / inspect: %s", txt);
    free(txt);
    /* the stored form is the backend's (export_prepared): an unknown one is refused by name */
    snprintf(cmd, sizeof(cmd), "%s convert -q --tiles --backend no-such -m %s -o %s/none 2>&1", bin, out, t->tmpdir);
    CHECK(test_run(cmd, &txt) != 0 && txt && strstr(txt, "no backend 'no-such'"));
    free(txt);
    snprintf(path, sizeof(path), "%s/model.safetensors", out2);
    CHECKF(dsv4_checkpoint_open(&ck, path, &err) == DSV4_OK, "%s", err.msg);
    int n_tiles = 0, n_i16_scales = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        size_t l = strlen(ck.tensors[i].name);
        if (l > 4 && !strcmp(ck.tensors[i].name + l - 4, ".i16")) {
            n_tiles++;
            n_i16_scales += strstr(ck.tensors[i].name, ".scale.i16") != NULL;
            CHECK(ck.tensors[i].dtype == DSV4_DTYPE_U8 && ck.tensors[i].offset % 4096 == 0);
        }
    }
    CHECKF(n_tiles > 100 && n_i16_scales > 10, "%d tile tensors, %d of FP4 scales", n_tiles, n_i16_scales);
    dsv4_checkpoint_close(&ck);
    b = NULL;
    CHECKF(dsv4_engine_open(&b, out2, NULL, &err) == DSV4_OK, "%s", err.msg);
    lb = b ? run_chunked(t, b, toks, 40, 7, NULL) : NULL;
    CHECK(la && lb && memcmp(la, lb, sizeof(float) * 40 * 2048) == 0);
    free(la);
    free(lb);
    free(toks);
    dsv4_engine_close(a);
    dsv4_engine_close(b);
}

const struct test_case test_group_forward[] = {
    { "chunk_invariance_tiny_a", test_chunk_invariance_tiny_a },
    { "chunk_invariance_tiny_b", test_chunk_invariance_tiny_b },
    { "fp4x_chunk_and_crossover_invariance", test_fp4x_invariance },
    { "errors_change_nothing", test_errors_change_nothing },
    { "convert_roundtrip", test_convert_roundtrip },
    { "no_alloc_while_decoding", test_no_alloc_while_decoding },
    { "engines_keep_own_gemm_min", test_engines_keep_own_gemm_min },
    { "staged_decode_transfers", test_staged_decode_transfers },
    { "whole_step_calls", test_whole_step_calls },
    { NULL, NULL },
};
