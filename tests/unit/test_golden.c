/*
 * test_golden.c - the engine against the Python reference's golden fixtures (tests/golden/,
 * format and tolerances in tests/golden/README.md).
 *
 * Each fixture names the `dsv4 gen` command of its checkpoint; the checkpoint is regenerated
 * (deterministic) and every case is run:
 *   - with the scalar reference ops (DSV4_CPU=ref), which reproduce the reference arithmetic:
 *     logits and MTP logits within median 1e-3 / overall 2e-3 relative L2 (the fixtures are
 *     F16) and the same argmax everywhere once the engine's logits are rounded to F16; at
 *     several prompt chunkings;
 *   - with the optimised ops at every dispatch level this CPU supports, which sum in another
 *     order: within twice the case's recorded noise floor (median >= 0.02, overall >= 0.04)
 *     and argmax agreement at most 0.10 below it.
 * The per-stage dump is checked with `dsv4 align` (exact path: every stage at 0 error), and a
 * deliberately perturbed weight must be named as the first diverging stage. Sanitizer builds
 * and qemu (test_light) run one chunking a fixture on the exact path and the best level only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "backend/cpu/cpu.h"
#include "core/core.h"
#include "support/gen.h"
#include "io/io.h"
#include "test_cases.h"

static bool meta(const struct dsv4_checkpoint *ck, const char *key, char *out, size_t cap)
{
    return dsv4_st_metadata(ck->files[0].data, ck->files[0].size, key, out, cap);
}

/* Regenerates the fixture's checkpoint from its gen_args into dir. */
static bool regen(struct test_ctx *t, const struct dsv4_checkpoint *ck, const char *dir)
{
    char args[512];
    if (!meta(ck, "gen_args", args, sizeof(args))) {
        CHECKF(0, "fixture without gen_args");
        return false;
    }
    struct gen_opts o;
    gen_opts_default(&o);
    o.quiet = true;
    static char preset[64];
    for (char *tok = strtok(args, " "); tok; tok = strtok(NULL, " ")) {
        if (!strcmp(tok, "--preset")) {
            char *v = strtok(NULL, " ");
            snprintf(preset, sizeof(preset), "%s", v ? v : "");
            o.preset = preset;
        } else if (!strcmp(tok, "--seed")) {
            char *v = strtok(NULL, " ");
            o.seed  = v ? strtoull(v, NULL, 10) : 1;
        } else if (!strcmp(tok, "--swiglu-limit")) {
            char *v        = strtok(NULL, " ");
            o.swiglu_limit = v ? atof(v) : -1;
        } else if (!strcmp(tok, "--fp8-experts")) o.fp8_experts = true;
        else if (!strcmp(tok, "--f32-scales")) o.f32_scales = true;
        else if (!strcmp(tok, "--single-file")) o.single_file = true;
        else if (!strcmp(tok, "--no-mtp")) o.no_mtp = true;
    }
    struct dsv4_err err;
    int             rc = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen: %s", err.msg);
    return rc == DSV4_OK;
}

struct cmp {
    double median, overall, argmax;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* mine [T, V] f32 vs ref [T, V] f16 (rows ld apart in both); argmax on mine rounded to f16
 * when round16. */
static struct cmp compare_ld(const float *mine, const struct dsv4_tensor *ref, int T, int V, int ld, bool round16)
{
    double *rel = malloc(sizeof(double) * (size_t)T), dd = 0, rr = 0;
    int     agree = 0;
    for (int t = 0; t < T; t++) {
        double d2 = 0, r2 = 0;
        int    am = 0, ar = 0;
        float  bm = -INFINITY, br = -INFINITY;
        for (int v = 0; v < V; v++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)ref->data + ((size_t)t * (size_t)ld + (size_t)v) * 2, 2);
            double b = dsv4_f32_from_f16(h), a = mine[(size_t)t * (size_t)ld + (size_t)v];
            float  am16 = round16 ? dsv4_f32_from_f16(dsv4_f16_from_f32((float)a)) : (float)a;
            d2 += (a - b) * (a - b);
            r2 += b * b;
            if (am16 > bm) bm = am16, am = v;
            if ((float)b > br) br = (float)b, ar = v;
        }
        rel[t] = r2 > 0 ? sqrt(d2 / r2) : 0;
        dd += d2;
        rr += r2;
        agree += am == ar;
    }
    qsort(rel, (size_t)T, sizeof(double), cmp_double);
    struct cmp c = { rel[T / 2], rr > 0 ? sqrt(dd / rr) : 0, (double)agree / T };
    free(rel);
    return c;
}

static struct cmp compare(const float *mine, const struct dsv4_tensor *ref, int T, int V, bool round16)
{
    return compare_ld(mine, ref, T, V, V, round16);
}

static void parse_noise(const char *s, struct cmp *c)
{
    c->median = c->overall = 0;
    c->argmax = 1;
    if (s) sscanf(s, "median %lf overall %lf argmax %lf", &c->median, &c->overall, &c->argmax);
}

/* Runs tokens through a fresh session in chunks; logits [T, V], MTP [T-1, V]. */
static bool run(struct test_ctx *t, dsv4_engine *e, const int32_t *toks, int T, int chunk, bool mtp, float *lg, float *ml)
{
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = T;
    sp.max_chunk = chunk;
    sp.mtp       = mtp;
    dsv4_session   *s;
    struct dsv4_err err;
    if (dsv4_session_create(e, &sp, &s, &err)) {
        CHECKF(0, "session: %s", err.msg);
        return false;
    }
    int nm = 0;
    for (int off = 0; off < T; off += chunk) {
        int n = T - off < chunk ? T - off : chunk, got = 0;
        if (dsv4_session_eval(s, toks + off, n, lg + (size_t)off * info.vocab_size,
                              mtp ? ml + (size_t)nm * info.vocab_size : NULL, &got, &err)) {
            CHECKF(0, "eval: %s", err.msg);
            dsv4_session_free(s);
            return false;
        }
        nm += got;
    }
    dsv4_session_free(s);
    return true;
}

/* V4.1's DSpark rows of a session fed one token at a time: after each position t < T - 1 the
 * draft with toks[t + 1] known, rows [(T - 1) x B, V + 1] (the confidence last), as the
 * fixture's `.dspark`. */
static bool run_dspark(struct test_ctx *t, dsv4_engine *e, const int32_t *toks, int T, float *rows)
{
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    size_t B = (size_t)info.dspark_block, V = (size_t)info.vocab_size;
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = T;
    sp.max_chunk = 1;
    sp.mtp       = true;
    dsv4_session   *s   = NULL;
    float          *tmp = malloc(sizeof(float) * B * V), conf[64];
    struct dsv4_err err;
    int             rc = B <= 64 ? dsv4_session_create(e, &sp, &s, &err) : DSV4_EINVAL;
    for (int p = 0; rc == DSV4_OK && p < T; p++) {
        rc = dsv4_session_eval(s, toks + p, 1, NULL, NULL, NULL, &err);
        if (rc == DSV4_OK && p + 1 < T) rc = dsv4_session_dspark_rows(s, toks[p + 1], tmp, conf, &err);
        for (size_t i = 0; rc == DSV4_OK && p + 1 < T && i < B; i++) {
            float *row = rows + ((size_t)p * B + i) * (V + 1);
            memcpy(row, tmp + i * V, sizeof(float) * V);
            row[V] = conf[i];
        }
    }
    CHECKF(rc == DSV4_OK, "DSpark rows: %s", B <= 64 ? err.msg : "a block of more than 64 rows");
    dsv4_session_free(s);
    free(tmp);
    return rc == DSV4_OK;
}

/* The fixture's DSpark rows (V4.1) against a token-at-a-time session's: the logits within the
 * bounds of the main logits (noise: the case's mtp_noise_*, measured on these rows), and on
 * the exact path the confidence column too. */
static void check_dspark(struct test_ctx *t, dsv4_engine *e, const struct dsv4_tensor *td, const int32_t *toks, int T,
                         const char *what, bool exact, const struct cmp *noise)
{
    int    V = (int)td->shape[1] - 1, R = (int)td->shape[0];
    float *rows = malloc(sizeof(float) * (size_t)R * (size_t)(V + 1));
    if (run_dspark(t, e, toks, T, rows)) {
        struct cmp g = compare_ld(rows, td, R, V, V + 1, exact);
        double lim_med = exact ? 1e-3 : fmax(2 * noise->median, 0.02);
        double lim_all = exact ? 2e-3 : fmax(2 * noise->overall, 0.04);
        double lim_arg = exact ? 1.0 : noise->argmax - 0.10;
        CHECKF(R == (T - 1) * (R / (T - 1)) && g.median <= lim_med && g.overall <= lim_all && g.argmax >= lim_arg,
               "%s: DSpark rows median %.3g (<= %.3g) overall %.3g (<= %.3g) argmax %.3f (>= %.3f)", what, g.median,
               lim_med, g.overall, lim_all, g.argmax, lim_arg);
        int bad = 0; /* the confidence: the fixture's f16 rounding alone */
        for (int r = 0; exact && r < R; r++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)td->data + ((size_t)r * (size_t)(V + 1) + (size_t)V) * 2, 2);
            double b = dsv4_f32_from_f16(h), a = rows[(size_t)r * (size_t)(V + 1) + (size_t)V];
            bad += fabs(a - b) > 1e-3 * fabs(b) + 1e-6;
        }
        CHECKF(bad == 0, "%s: %d DSpark confidences differ from the reference", what, bad);
    }
    free(rows);
}

/* All cases of one fixture at one CPU level ("ref" = exact path), or on another backend
 * (level "backend:NAME", held to the fast levels' tolerances). */
static void check_fixture(struct test_ctx *t, const char *file, const char *level, const int *chunks, int n_chunks)
{
    char path[256], dir[512], cases[256];
    snprintf(path, sizeof(path), "tests/golden/%s", file);
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    if (dsv4_checkpoint_open(&ck, path, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    snprintf(dir, sizeof(dir), "%s/golden-%s", t->tmpdir, file);
    if (!dsv4_path_exists(dir) && !regen(t, &ck, dir)) goto out;
    if (!meta(&ck, "cases", cases, sizeof(cases))) {
        CHECKF(0, "%s: no cases", file);
        goto out;
    }
    bool exact = !strcmp(level, "ref");
    for (char *save = NULL, *K = strtok_r(cases, ",", &save); K; K = strtok_r(NULL, ",", &save)) {
        char name[128], rev[32] = "current", noise_s[128] = "", mnoise_s[128] = "";
        snprintf(name, sizeof(name), "%s.tokens", K);
        const struct dsv4_tensor *tt = dsv4_checkpoint_find(&ck, name);
        snprintf(name, sizeof(name), "%s.logits", K);
        const struct dsv4_tensor *tl = dsv4_checkpoint_find(&ck, name);
        snprintf(name, sizeof(name), "%s.mtp_logits", K);
        const struct dsv4_tensor *tm = dsv4_checkpoint_find(&ck, name);
        snprintf(name, sizeof(name), "%s.dspark", K);
        const struct dsv4_tensor *td = dsv4_checkpoint_find(&ck, name);
        if (!tt || !tl) {
            CHECKF(0, "%s: case %s incomplete", file, K);
            continue;
        }
        snprintf(name, sizeof(name), "%s.revision", K);
        meta(&ck, name, rev, sizeof(rev));
        snprintf(name, sizeof(name), "%s.noise_ulp", K);
        meta(&ck, name, noise_s, sizeof(noise_s));
        snprintf(name, sizeof(name), "%s.mtp_noise_ulp", K);
        meta(&ck, name, mnoise_s, sizeof(mnoise_s));
        int T = (int)tt->shape[0], V = (int)tl->shape[1];
        struct dsv4_engine_params ep;
        dsv4_engine_params_default(&ep);
        ep.revision = !strcmp(rev, "initial") ? DSV4_REVISION_INITIAL : DSV4_REVISION_CURRENT;
        char opts[48];
        snprintf(opts, sizeof(opts), "level=%s", level);
        if (!strncmp(level, "backend:", 8)) ep.backend = level + 8;
        else ep.backend_opts = opts;
        dsv4_engine *e;
        int          rc = dsv4_engine_open(&e, dir, &ep, &err);
        if (rc) {
            CHECKF(0, "%s: %s", file, err.msg);
            continue;
        }
        float *lg = malloc(sizeof(float) * (size_t)T * V), *ml = malloc(sizeof(float) * (size_t)T * V);
        for (int c = 0; c < n_chunks; c++) {
            int chunk = chunks[c] > 0 ? chunks[c] : T;
            if (!run(t, e, (const int32_t *)tt->data, T, chunk, tm != NULL, lg, ml)) break;
            struct cmp got = compare(lg, tl, T, V, exact), noise;
            parse_noise(noise_s, &noise);
            double lim_med = exact ? 1e-3 : fmax(2 * noise.median, 0.02);
            double lim_all = exact ? 2e-3 : fmax(2 * noise.overall, 0.04);
            double lim_arg = exact ? 1.0 : noise.argmax - 0.10;
            CHECKF(got.median <= lim_med && got.overall <= lim_all && got.argmax >= lim_arg,
                   "%s %s [%s, chunk %d]: logits median %.3g (<= %.3g) overall %.3g (<= %.3g) argmax %.3f (>= %.3f)",
                   file, K, level, chunk, got.median, lim_med, got.overall, lim_all, got.argmax, lim_arg);
            if (tm) {
                struct cmp gm = compare(ml, tm, T - 1, V, exact), mnoise;
                parse_noise(mnoise_s, &mnoise);
                lim_med = exact ? 1e-3 : fmax(2 * mnoise.median, 0.02);
                lim_all = exact ? 2e-3 : fmax(2 * mnoise.overall, 0.04);
                lim_arg = exact ? 1.0 : mnoise.argmax - 0.10;
                CHECKF(gm.median <= lim_med && gm.overall <= lim_all && gm.argmax >= lim_arg,
                       "%s %s [%s, chunk %d]: MTP median %.3g (<= %.3g) overall %.3g (<= %.3g) argmax %.3f (>= %.3f)",
                       file, K, level, chunk, gm.median, lim_med, gm.overall, lim_all, gm.argmax, lim_arg);
            }
        }
        if (td) {
            struct cmp dnoise;
            char       what[160];
            parse_noise(mnoise_s, &dnoise);
            snprintf(what, sizeof(what), "%s %s [%s]", file, K, level);
            check_dspark(t, e, td, (const int32_t *)tt->data, T, what, exact, &dnoise);
        }
        free(lg);
        free(ml);
        dsv4_engine_close(e);
    }
out:
    dsv4_checkpoint_close(&ck);
}

enum { N_V4_FIXTURES = 4 }; /* the DeepSeek-V4 ones, first */
static const char *const fixtures[] = { "tiny-a.safetensors",     "tiny-b.safetensors", "tiny-a-limit.safetensors",
                                        "tiny-a-fp8.safetensors", "tiny-v41.safetensors" };

/* A light run (test_light: sanitizers, qemu) takes one chunking a fixture: chunks of 7 where
 * the plain run takes several (what carries across calls), the whole prompt being checked at
 * every level; and not tiny-b (a third of the time: its long window and ratio-128 blocks are
 * the same reference C as tiny-a's, and every_level runs them at the best level). */
static void test_exact_path(struct test_ctx *t)
{
    bool light = test_light();
    int  all[] = { 0, 1, 7 }, few[] = { 37 }, seven[] = { 7 };
    check_fixture(t, fixtures[0], "ref", light ? seven : all, light ? 1 : 3);
    if (!light) check_fixture(t, fixtures[1], "ref", few, 1);
    check_fixture(t, fixtures[2], "ref", all, 1);
    check_fixture(t, fixtures[3], "ref", all, light ? 1 : 2);
    int v41[] = { 0, 1, 3, 7 }; /* DeepSeek-V4.1: bit for bit the reference's (F16 storage aside) */
    check_fixture(t, fixtures[4], "ref", light ? seven : v41, light ? 1 : 4);
}

/* A light run (test_light) takes this CPU's best level only (neon under qemu): the plain run
 * takes every level, and a sanitizer's every op at every level is group ops'. */
static void test_every_level(struct test_ctx *t)
{
    int once[] = { 0 }, chunked[] = { 0, 5 };
    int top    = (int)dsv4_cpu_detect(); /* DSV4_CPU above it would run `top` again */
    int lo     = test_light() ? (top < DSV4_CPU_AVX512BF16 ? top : DSV4_CPU_AVX512BF16) : 0;
    for (int l = lo; l <= DSV4_CPU_AVX512BF16 && l <= top; l++) /* this architecture's names (neon on aarch64) */
        for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++)
            check_fixture(t, fixtures[f], dsv4_cpu_level_name((enum dsv4_cpu_level)l), f == 0 ? chunked : once,
                          f == 0 ? 2 : 1);
    test_levels_not_here(t, top, DSV4_CPU_AVX512BF16);
    if (test_light()) return;
    /* the -int sub-levels (their own FP4 numerics: exact block sums) within the same bounds */
    static const char *const sub[2] = { "avx2-int", "avx512-int" };
    for (int i = 0; i < 2; i++) {
        if (!DSV4_HAVE_X86 || top < (i ? DSV4_CPU_AVX512 : DSV4_CPU_AVX2)) {
            test_not_here(t, sub[i]);
            continue;
        }
        for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++)
            check_fixture(t, fixtures[f], sub[i], f == 0 ? chunked : once, f == 0 ? 2 : 1);
    }
}

/* The Vulkan backend (on lavapipe in CI) against the reference, with the fast levels'
 * tolerances: every fixture (both revisions, FP4 and FP8 experts, the clamps), whole prompt,
 * chunk 1 and 7 on tiny-a. */
static void test_vulkan(struct test_ctx *t)
{
    if (!test_need_backend(t, "vulkan")) return;
    int all[] = { 0, 1, 7 }, once[] = { 0 };
    for (size_t f = 0; f < N_V4_FIXTURES; f++) /* DeepSeek-V4.1 runs on the CPU backend only so far */
        check_fixture(t, fixtures[f], "backend:vulkan", f == 0 ? all : once, f == 0 ? 3 : 1);
}

/* The golden tiny-a checkpoint regenerated into the temporary directory (once), for align. */
static bool align_checkpoint(struct test_ctx *t, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/golden-tiny-a.safetensors", t->tmpdir); /* same checkpoint (seed 1) */
    if (dsv4_path_exists(dir)) return true;
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    if (dsv4_checkpoint_open(&ck, "tests/golden/tiny-a.safetensors", &err)) {
        CHECKF(0, "%s", err.msg);
        return false;
    }
    regen(t, &ck, dir);
    dsv4_checkpoint_close(&ck);
    return true;
}

/* dsv4 align on the per-stage dump: exact path all zero; a perturbed weight is named. */
static void test_align(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char dir[512], cmd[2048], *out = NULL;
    if (!align_checkpoint(t, dir, sizeof(dir))) return;
    snprintf(cmd, sizeof(cmd), "DSV4_CPU=ref %s align -m %s --ref tests/golden/tiny-a.dump.safetensors --json", bin, dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "align (exact path) exit %d:\n%s", rc, out);
    /* every compared stage at exactly 0 error: floats, router weights, sets */
    json_error_t je;
    json_t      *j = json_loads(out, 0, &je);
    json_t      *stages = json_object_get(j, "stages");
    CHECKF(json_array_size(stages) >= 70, "align compared %zu stages", json_array_size(stages));
    int    nonzero = 0;
    size_t si;
    json_t *st;
    json_array_foreach(stages, si, st) {
        double cosv = json_number_value(json_object_get(st, "cos")), mx = json_number_value(json_object_get(st, "max_abs"));
        double we = json_number_value(json_object_get(st, "weight_err")), ag = json_number_value(json_object_get(st, "agreement"));
        bool   float_stage = cosv != 0;
        if ((float_stage && mx != 0) || we != 0 || (!float_stage && ag != 0 && ag != 1)) {
            nonzero++;
            fprintf(stderr, "    differs: %s\n", json_string_value(json_object_get(st, "stage")));
        }
    }
    CHECKF(nonzero == 0, "%d stages differ from the reference on the exact path", nonzero);
    json_decref(j);
    free(out);
    /* perturb layer 2's wkv (e4m3 codes of its first rows) in a copy: the first failing stage must be L2.kv */
    char pert[600];
    snprintf(pert, sizeof(pert), "%s/perturbed", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", pert, dir, pert);
    CHECK(system(cmd) == 0);
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    if (dsv4_checkpoint_open(&ck, pert, &err) == DSV4_OK) {
        const struct dsv4_tensor *w = dsv4_checkpoint_find(&ck, "layers.2.attn.wkv.weight");
        CHECK(w != NULL);
        if (w) {
            char file[700];
            snprintf(file, sizeof(file), "%s/%s", pert, ck.file_names[w->file]);
            FILE *f = fopen(file, "r+b");
            CHECK(f != NULL);
            if (f) {
                uint8_t buf[256 * 8];
                fseek(f, (long)w->offset, SEEK_SET);
                CHECK(fread(buf, 1, sizeof(buf), f) == sizeof(buf));
                for (size_t i = 0; i < sizeof(buf); i++) buf[i] ^= 0x40; /* flips exponent bits */
                fseek(f, (long)w->offset, SEEK_SET);
                CHECK(fwrite(buf, 1, sizeof(buf), f) == sizeof(buf));
                fclose(f);
            }
        }
        dsv4_checkpoint_close(&ck);
    }
    for (int pass = 0; pass < 2; pass++) {
        snprintf(cmd, sizeof(cmd), "%s%s align -m %s --ref tests/golden/tiny-a.dump.safetensors", pass ? "" : "DSV4_CPU=ref ",
                 bin, pert);
        rc = test_run(cmd, &out);
        CHECKF(rc == 3 && strstr(out, "first stage beyond its threshold: L2.kv"),
               "align on a perturbed L2 wkv (%s path) exit %d:\n%s", pass ? "fast" : "exact", rc, out);
        free(out);
    }
    /* the fast path on the intact checkpoint stays within the thresholds */
    snprintf(cmd, sizeof(cmd), "%s align -m %s --ref tests/golden/tiny-a.dump.safetensors", bin, dir);
    rc = test_run(cmd, &out);
    CHECKF(rc == 0, "align (fast path) exit %d:\n%s", rc, out);
    free(out);
}

/* dsv4 align on cpu-strict, whose step buffers the host cannot read in place: the dumps come
 * through download, and every stage compares as on cpu (the same JSON, exact and fast path). */
static void test_align_strict(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    char dir[512], cmd[2048], *out[2] = { NULL, NULL };
    if (!bin || !align_checkpoint(t, dir, sizeof(dir))) return;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof(cmd), "%s%s align -m %s --ref tests/golden/tiny-a.dump.safetensors --json%s",
                     pass ? "" : "DSV4_CPU=ref ", bin, dir, k ? " --backend cpu-strict" : "");
            int rc = test_run(cmd, &out[k]);
            CHECKF(rc == 0, "align (%s path) on %s exit %d:\n%s", pass ? "fast" : "exact", k ? "cpu-strict" : "cpu", rc,
                   out[k]);
        }
        json_error_t je;
        json_t      *a = json_loads(out[0], 0, &je), *b = json_loads(out[1], 0, &je);
        json_t      *sa = json_object_get(a, "stages"), *sb = json_object_get(b, "stages");
        CHECKF(json_array_size(sa) >= 70, "align compared %zu stages", json_array_size(sa));
        CHECKF(sa && sb && json_equal(sa, sb), "align's stages on cpu-strict differ from cpu (%s path)",
               pass ? "fast" : "exact");
        json_decref(a);
        json_decref(b);
        free(out[0]);
        free(out[1]);
    }
}

const struct test_case test_group_golden[] = {
    { "exact_path_vs_reference", test_exact_path },
    { "every_level_vs_reference", test_every_level },
    { "align_dump_and_perturbed_weight", test_align },
    { "align_on_strict", test_align_strict },
    { "vulkan_vs_reference", test_vulkan },
    { NULL, NULL },
};
