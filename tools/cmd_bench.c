/*
 * cmd_bench.c - `dsv4 bench`: speed and bandwidth figures for one model on this machine.
 *
 * In one run: the machine's read bandwidth (sum over 1 GiB with every thread), then for each
 * context length the prefill speed of a fresh sequence to that length, and for each batch
 * size the decode speed of that many sequences stepping together at that frontier. Decode
 * rows start from copies of the prefilled state and get different next tokens, so routing
 * diverges from the first layer on. For each decode step the bytes that had to be read are
 * counted: the trunk weights, each routed expert used by any row once (unique experts per
 * layer, from the router's choices), the head, and the cached KV rows attended. Output: a
 * table on stdout, optionally CSV (--csv FILE) with machine, backend, checkpoint and commit.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "cli.h"
#include "model/runtime.h"

#ifndef DSV4_GIT_REV
#define DSV4_GIT_REV "unknown"
#endif

/* Router choices of the last step, collected through the dump sink. */
struct route_log {
    int      n_layer, n_exp;
    uint8_t *used; /* [n_layer + 1, n_exp] */
};

static void route_sink(void *ud, const char *stage, int il, int seq, int pos, int n, int width, const float *data)
{
    (void)seq;
    (void)pos;
    struct route_log *rl = ud;
    if (strcmp(stage, "router_ids") != 0 || il < 0 || il > rl->n_layer) return;
    for (int i = 0; i < n * width; i++) {
        int e = (int)data[i];
        if (e >= 0 && e < rl->n_exp) rl->used[(size_t)il * (size_t)rl->n_exp + (size_t)e] = 1;
    }
}

/* Bytes of routed-expert weights per layer (one expert). */
static double expert_bytes(const struct dsv4_model *m, int il)
{
    const struct dsv4_expert_w *e = &m->w.layers[il].experts[0];
    const struct dsv4_linear   *ls[3] = { &e->w1, &e->w2, &e->w3 };
    double                      b     = 0;
    for (int i = 0; i < 3; i++) b += (double)(ls[i]->wt ? ls[i]->wt->nbytes : 0) + (double)(ls[i]->st ? ls[i]->st->nbytes : 0);
    return b;
}

static int *parse_list(const char *s, int *n)
{
    int *v = malloc(sizeof(int) * 64);
    *n     = 0;
    while (*s && *n < 64) {
        char *end;
        long  x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > (1 << 24)) {
            free(v);
            return NULL;
        }
        v[(*n)++] = (int)x;
        s         = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            free(v);
            return NULL;
        }
    }
    return v;
}

/* The one projection of --gemm, as the weight set prepare_weights walks. */
struct gemm_one {
    struct dsv4_linear *l;
};

static void gemm_each_linear(void *ctx, void (*fn)(struct dsv4_linear *l, void *ud), void *ud)
{
    fn(((struct gemm_one *)ctx)->l, ud);
}

static void gemm_each_tensor(void *ctx, void (*fn)(const void **t, size_t bytes, void *ud), void *ud)
{
    (void)ctx, (void)fn, (void)ud;
}

/* One projection timed on a backend of its own, prepared as at load (tiles: interleaved
 * 16-row tiles on the bf16 levels, freed with the backend): the best time in seconds, and
 * whether it ran on prepared tiles; < 0 on error (said on stderr). */
static double gemm_time(const struct dsv4_backend_kind *kind, struct dsv4_backend_params bp, struct dsv4_linear *l,
                        int M, const float *x, float *y, bool *tiled)
{
    struct dsv4_err err;
    void           *impl = NULL;
    if (kind->create(&impl, &bp, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        return -1;
    }
    struct dsv4_backend_settings set = { "", 1, { 0 }, false };
    if (kind->settings) kind->settings(impl, &set);
    int N = l->n_out, K = l->n_in;
    /* activations (rows padded by up to 512 floats, ops_fast.c act_ld; avx2-int's rows are
     * 2K + K/128 floats, src/backend/cpu/fp4_exact.h), then panels: generous */
    size_t                 slen    = (size_t)M * (2 * (size_t)K + (size_t)K / 128 + 1024) + (size_t)set.n_threads * 64 * (size_t)K + 1024;
    float                 *scratch = malloc(sizeof(float) * slen);
    struct gemm_one        one     = { l };
    struct dsv4_checkpoint none    = { 0 };
    struct dsv4_weight_set ws = { .ck = &none, .each_linear = gemm_each_linear, .each_tensor = gemm_each_tensor, .ctx = &one };
    double best = -1;
    if (!scratch) {
        fprintf(stderr, "dsv4 bench: out of memory\n");
    } else if (kind->prepare_weights(impl, &ws, &bp, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
    } else {
        /* a device backend's ops read and write its own memory, and finish at sync */
        bool         dev = !kind->host_visible;
        const float *bx  = x;
        float       *by = y, *bs = scratch;
        if (dev) {
            float *dx = kind->alloc(impl, sizeof(float) * (size_t)M * (size_t)K, DSV4_MEM_ACT);
            by        = kind->alloc(impl, sizeof(float) * (size_t)M * (size_t)N, DSV4_MEM_ACT);
            bs        = kind->alloc(impl, sizeof(float) * slen, DSV4_MEM_ACT);
            if (dx) kind->upload(impl, dx, x, sizeof(float) * (size_t)M * (size_t)K);
            bx = dx;
        }
        enum dsv4_act       act = l->fmt == DSV4_WFMT_BF16 ? DSV4_ACT_NONE : DSV4_ACT_FP8;
        struct dsv4_backend be  = { .ops = kind->ops(impl), .impl = impl, .scratch = bs, .scratch_len = slen };
        if (bx && by && bs) {
            be.ops->linear(&be, l, M, bx, K, by, N, act, DSV4_OUT_BF16); /* warm up */
            if (dev) kind->sync(impl);
        }
        double spent = 0;
        for (int rep = 0; bx && by && bs && (rep < 3 || (spent < 0.3 && rep < 1000)); rep++) {
            double t0 = cli_now();
            be.ops->linear(&be, l, M, bx, K, by, N, act, DSV4_OUT_BF16);
            if (dev) kind->sync(impl);
            double t = cli_now() - t0;
            if (best < 0 || t < best) best = t;
            spent += t;
        }
        if (dev && !(bx && by && bs)) fprintf(stderr, "dsv4 bench: out of device memory\n");
        /* the device buffers go with the backend (destroy) */
    }
    *tiled  = l->prep != NULL;
    l->prep = NULL; /* the backend's, gone with it */
    free(scratch);
    kind->destroy(impl);
    return best;
}

/* --gemm: the prefill projection on random FP8 weights (e8m0 128x128 scales), GFLOP/s. */
static int bench_gemm(const char *spec, const struct dsv4_engine_params *ep)
{
    struct dsv4_err                 err;
    const struct dsv4_backend_kind *kind = dsv4_backend_find(ep->backend);
    void                           *impl = NULL;
    struct dsv4_backend_params      bp = { .opts = ep->backend_opts, .n_threads = ep->n_threads };
    char                            opts[600]; /* the options and the case's tiles= */
    if (!kind || kind->create(&impl, &bp, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", kind ? err.msg : "this build has no such backend");
        return 1;
    }
    struct dsv4_backend_settings set = { "", 1, { 0 }, false };
    if (kind->settings) kind->settings(impl, &set);
    printf("backend %s, %d threads\n%8s %8s %8s %5s %10s %10s %10s\n", set.level, set.n_threads, "M", "N", "K", "fmt",
           "ms", "GFLOP/s", "weight GB/s");
    kind->destroy(impl);
    int rc = 0;
    for (const char *p = spec; *p && rc == 0;) {
        int  M, N, K, used = 0;
        char fmt[8] = "fp8";
        if (sscanf(p, "%d,%d,%d%n", &M, &N, &K, &used) != 3 || M < 1 || N < 1 || K < 128 || K % 128 || M > 65536 ||
            N > 1 << 20 || K > 1 << 16) {
            fprintf(stderr, "dsv4 bench: --gemm wants M,N,K[,fp8|fp4|bf16][,i16] with K a multiple of 128 (got '%s')\n", p);
            rc = 2;
            break;
        }
        p += used;
        if (*p == ',') {
            int n = 0;
            if (sscanf(p, ",%7[a-z0-9]%n", fmt, &n) != 1 || (strcmp(fmt, "fp8") && strcmp(fmt, "fp4") && strcmp(fmt, "bf16"))) {
                fprintf(stderr, "dsv4 bench: --gemm format must be fp8, fp4 or bf16 (got '%s')\n", p + 1);
                rc = 2;
                break;
            }
            p += n;
        }
        bool i16 = !strncmp(p, ",i16", 4);
        if (i16) p += 4;
        snprintf(opts, sizeof(opts), "%s%stiles=%d", ep->backend_opts ? ep->backend_opts : "",
                 ep->backend_opts && *ep->backend_opts ? "," : "", i16);
        bp.opts = opts;
        if (*p == ':') p++;
        enum dsv4_wfmt wf = !strcmp(fmt, "fp4") ? DSV4_WFMT_FP4 : !strcmp(fmt, "bf16") ? DSV4_WFMT_BF16 : DSV4_WFMT_FP8;
        /* bytes of weights and of scales: FP8 e4m3 + 128x128 e8m0, FP4 packed + per-32 e8m0 */
        size_t nw = wf == DSV4_WFMT_FP4 ? (size_t)N * (size_t)K / 2 : (size_t)N * (size_t)K * (wf == DSV4_WFMT_BF16 ? 2 : 1);
        size_t ns = wf == DSV4_WFMT_FP4 ? (size_t)N * (size_t)(K / 32)
                  : wf == DSV4_WFMT_FP8 ? (size_t)((N + 127) / 128) * (size_t)(K / 128) : 1;
        uint8_t *w = malloc(nw), *sc = malloc(ns);
        float   *x = malloc(sizeof(float) * (size_t)M * (size_t)K), *y = malloc(sizeof(float) * (size_t)M * (size_t)N);
        if (!w || !sc || !x || !y) {
            fprintf(stderr, "dsv4 bench: out of memory\n");
            rc = 1;
        } else {
            unsigned long long r = 7;
            for (size_t i = 0; i < nw; i++) {
                r    = r * 6364136223846793005ull + 1442695040888963407ull;
                w[i] = (uint8_t)((r >> 40) & 0x77); /* e4m3 of modest size; FP4: two codes; bf16: small values */
            }
            if (wf == DSV4_WFMT_BF16)
                for (size_t i = 1; i < nw; i += 2) w[i] = (uint8_t)(0x3c + (w[i] & 1));
            memset(sc, 120, ns);
            for (size_t i = 0; i < (size_t)M * (size_t)K; i++) x[i] = dsv4_round_bf16((float)((i * 2654435761u) % 1000) / 500.0f - 1);
            struct dsv4_linear l = { .fmt = wf, .n_out = N, .n_in = K, .w = w, .scale = wf == DSV4_WFMT_BF16 ? NULL : sc,
                                     .block = 128 /* V4's blocks, as the scale size above */ };
            bool               tiled;
            double             best = gemm_time(kind, bp, &l, M, x, y, &tiled);
            if (best < 0) rc = 1;
            else
                printf("%8d %8d %8d %5s %10.3f %10.1f %10.1f%s\n", M, N, K, fmt, best * 1e3, 2.0 * M * N * (double)K / best / 1e9,
                       (double)(nw + ns) / best / 1e9,
                       !tiled ? "" : kind->host_visible ? "  (i16 tiles)" : "  (device copy)");
        }
        free(w);
        free(sc);
        free(x);
        free(y);
    }
    return rc;
}

struct bench_opts {
    const char *dir, *csv;
    const int  *ctxs;
    int         n_ctx;
    const int  *batches;
    int         n_batch, steps, chunk;
    bool        csv_started; /* --cpu-level all: later levels append to the CSV */
    int         spec;        /* --spec-rows K: verify steps of 1 .. K + 1 rows and a draft row */
};

/* --spec-rows: what speculative decoding costs here (docs/SPECULATIVE.md). One sequence with
 * MTP state prefilled to ctx; then, best of `reps`, a forward of n = 1 .. K + 1 rows of it
 * (a verify step with its MTP rows; n > 1 rolled back to one row, as a step that keeps no
 * draft, then that row too: each run starts at ctx, for timing only) and one chained draft
 * row (MTP block + head); DeepSeek-V4.1: the verify steps write the DSpark rings, and the
 * drafts are one DSpark block (every stage, the head over its rows) and K Markov rounds. */
static int bench_spec(const struct dsv4_model *m, struct dsv4_step *S, const int32_t *toks, int ctx, int K, int reps,
                      struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    struct dsv4_kv_mem        kvmem = dsv4_model_kv_mem(m);
    struct dsv4_seq_state     st;
    struct dsv4_spec_undo     u;
    bool   v41  = c->arch == DSV4_ARCH_V4_1;
    int    rows = v41 && c->v41.dspark_block > K + 1 ? c->v41.dspark_block : K + 1; /* a DSpark block's logits */
    float *lg = malloc(sizeof(float) * (size_t)c->vocab_size * (size_t)rows);
    int    rc = lg ? dsv4_seq_state_init(&st, &c->kv, ctx + K + 2, m->row_fmt, true, &kvmem, err)
                   : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (rc) {
        free(lg);
        return rc;
    }
    if ((rc = dsv4_spec_undo_init(&u, m, K + 1, err))) {
        dsv4_seq_state_free(&st);
        free(lg);
        return rc;
    }
    for (int off = 0; off < ctx && !rc; off += S->max_rows) {
        int                 n = ctx - off < S->max_rows ? ctx - off : S->max_rows;
        struct dsv4_fwd_seq q = { .st = &st, .tokens = toks + off, .n = n, .n_logits = 1, .logits = lg };
        rc                    = dsv4_forward(m, S, &q, 1, err);
    }
    double t1 = 0;
    printf("\nspeculative decoding at ctx %d (best of %d): verify steps of 1 + K rows, %s rows included\n", ctx, reps,
           v41 ? "DSpark ring" : "MTP");
    printf("%8s %10s %10s\n", "rows", "ms", "x 1 row");
    for (int n = 1; n <= K + 1 && !rc; n++) {
        double best = 1e30;
        for (int r = 0; r < reps && !rc; r++) {
            struct dsv4_fwd_seq q  = { .st = &st, .tokens = toks, .n = n, .n_logits = n, .logits = lg,
                                       .undo = n > 1 ? &u : NULL };
            double              t0 = cli_now();
            rc                     = dsv4_forward(m, S, &q, 1, err);
            double dt              = cli_now() - t0;
            if (rc) break;
            best = dt < best ? dt : best;
            if (n > 1) dsv4_spec_rollback(m, S, &st, &u, 1);
            st.pos--, st.mtp_pos = st.pos - 1; /* back to ctx: the row it kept goes again */
        }
        if (n == 1) t1 = best;
        if (!rc) printf("%8d %10.2f %10.2f\n", n, best * 1e3, best / t1);
    }
    double bd = 1e30;
    for (int r = 0; r < reps && !rc; r++) {
        struct dsv4_fwd_seq q  = { .st = &st, .tokens = toks, .n = 1, .mtp_logits = lg, .draft_depth = 1 };
        double              t0 = cli_now();
        rc                     = dsv4_forward_draft(m, S, &q, 1, err);
        for (int i = 0; v41 && i < K && i < c->v41.dspark_block && !rc; i++) /* its Markov rounds */
            rc = dsv4_dspark_markov(m, S, &q, 1, i, toks, err);
        double dt              = cli_now() - t0;
        bd                     = dt < bd ? dt : bd;
    }
    /* V4: one chained MTP row; V4.1: the DSpark block and K Markov rounds (all K drafts) */
    if (!rc) printf("%8s %10.2f %10.2f\n", v41 ? "drafts" : "draft", bd * 1e3, bd / t1);
    dsv4_spec_undo_free(&u);
    dsv4_seq_state_free(&st);
    free(lg);
    return rc;
}

/* One level's figures at the first context length, for the summary of --cpu-level all. */
struct level_sum {
    char   level[24];
    double bw, peak, peak_f32, prefill_tps, prefill_gf;
    int    batch[8];
    double tps[8], share[8];
};

static void print_summary(const struct level_sum *s, int n, const struct bench_opts *o)
{
    if (!n) return;
    printf("\nsummary at ctx %d (prefill: GFLOP/s of the projections and experts, share of the level's peak;\n"
           "decode: tok/s, share of the read bandwidth for the bytes the step must read, and for batches\n"
           "after the first, tok/s as a multiple of the first batch's)\n", o->ctxs[0]);
    printf("%-11s %8s %9s %9s %12s %8s", "level", "bw GB/s", "f32 peak", "peak", "prefill t/s", "of peak");
    for (int b = 0; b < o->n_batch && b < 8; b++) printf("   b%-2d t/s  of bw%s", o->batches[b], b ? "  x b1" : "");
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("%-11s %8.1f %9.1f %9.1f %12.1f %7.0f%%", s[i].level, s[i].bw, s[i].peak_f32, s[i].peak, s[i].prefill_tps,
               s[i].peak > 0 ? 100.0 * s[i].prefill_gf / s[i].peak : 0.0);
        for (int b = 0; b < o->n_batch && b < 8; b++) {
            printf(" %9.2f %5.0f%%", s[i].tps[b], 100.0 * s[i].share[b]);
            if (b) printf(" %6.2f", s[i].tps[0] > 0 ? s[i].tps[b] / s[i].tps[0] : 0.0);
        }
        printf("\n");
    }
}

/* One model at one level: its state and buffers, and the machine's figures. */
struct bench_run {
    const struct bench_opts  *o;
    const struct dsv4_model  *m;
    const struct dsv4_config *c;
    const struct dsv4_backend_kind *kind; /* the model's backend: its memory and machine figures */
    void                     *impl;
    int                       n_threads;
    struct dsv4_step          S;
    struct dsv4_seq_state    *sts;  /* [max_b] */
    struct dsv4_fwd_seq      *fs;   /* [max_b] */
    int32_t                  *toks; /* [max_ctx] */
    int32_t                  *next; /* [max_b] */
    float                    *lg;   /* [max_b, vocab] */
    struct route_log          rl;
    uint64_t                 *bw_buf;
    size_t                    bw_n;
    double                    bw, peak, peak_f32, trunk;
    struct dsv4_model_stats   st;
    const dsv4_engine        *e;
    struct utsname            un;
    const char               *backend;
    FILE                     *cf; /* the CSV, or NULL */
};

/* The read bandwidth now, GB/s (best of reps over the 1 GiB buffer). */
static double bandwidth(const struct bench_run *R, int reps)
{
    return R->kind->read_bandwidth(R->impl, R->bw_buf, R->bw_n * 8, reps);
}

/* Bandwidth, arithmetic peak and the model's bytes per token, printed: the figures come from
 * the backend (its threads, its memory, its kernels' peak loops). */
static bool measure_machine(struct bench_run *R)
{
    struct dsv4_backend_settings set = { "", 1, { 0 }, false };
    if (R->kind->settings) R->kind->settings(R->impl, &set);
    R->n_threads = set.n_threads;
    R->backend   = set.level[0] ? set.level : R->kind->name; /* a backend without levels: its name */
    if (!R->kind->read_bandwidth || !R->kind->alloc) {
        fprintf(stderr, "dsv4 bench: backend %s measures no read bandwidth\n", R->kind->name);
        return false;
    }
    printf("measuring read bandwidth (1 GiB, %d threads)...\n", R->n_threads);
    /* the VM's bandwidth moves with its neighbours, by 1.5x within minutes: it is measured
     * here and again around every decode row, whose share is of the mean of the two; the
     * buffer is the backend's (zero-filled, so touched, at alloc) */
    R->bw_n   = ((size_t)1 << 30) / 8;
    R->bw_buf = R->kind->alloc(R->impl, R->bw_n * 8, DSV4_MEM_ACT);
    if (!R->bw_buf) {
        fprintf(stderr, "dsv4 bench: out of memory for the bandwidth buffer\n");
        return false;
    }
    R->bw = bandwidth(R, 5);
    dsv4_model_stats(R->c, &R->m->ck, &R->st);
    R->trunk = (double)(R->st.bytes_per_token - R->st.bytes_experts_per_token);
    uname(&R->un);
    printf("machine %s, backend %s, %d threads, read bandwidth %.1f GB/s\n", R->un.machine, R->backend, R->n_threads,
           R->bw);
    struct dsv4_ep_stats es;
    dsv4_engine_ep_stats(R->e, &es);
    if (es.ranks > 1) { /* expert parallelism: each rank's memory, read by all at once */
        double *g = calloc((size_t)es.ranks, sizeof(double));
        if (g && dsv4_engine_ep_bandwidth(R->e, R->bw_n * 8 / 4, 3, g) == es.ranks) {
            printf("read bandwidth per MPI rank, all at once (256 MiB each):");
            for (int r = 0; r < es.ranks; r++) printf(" rank %d %.1f GB/s%s", r, g[r], r + 1 < es.ranks ? "," : "\n");
        }
        free(g);
    }
    /* prefill's share is of the peak of the kernels it runs on: bf16 dot products where the
     * level has them, f32 FMAs otherwise (the reference runs plain C: no peak) */
    double peak_b = 0;
    R->peak_f32   = 0;
    if (R->kind->peaks) R->kind->peaks(R->impl, &R->peak_f32, &peak_b);
    R->peak = peak_b > 0 ? peak_b : R->peak_f32;
    printf("arithmetic peak, %d threads: f32 FMA %.1f GFLOP/s", R->n_threads, R->peak_f32);
    if (peak_b > 0) printf(", bf16 dot products %.1f GFLOP/s", peak_b);
    printf("\n");
    printf("model %s: %.2f GB weights read per token at batch 1 (trunk %.2f GB incl. head, experts %.2f GB)\n", R->o->dir,
           (double)R->st.bytes_per_token / 1e9, R->trunk / 1e9, (double)R->st.bytes_experts_per_token / 1e9);
    return true;
}

/* The step, the sequence states for max_b sequences of ctx_cap, the tokens and buffers. */
static bool alloc_run(struct bench_run *R, int max_b, int max_ctx, int ctx_cap, struct dsv4_err *err)
{
    const struct dsv4_config *c = R->c;
    R->sts     = calloc((size_t)max_b, sizeof(*R->sts));
    R->fs      = calloc((size_t)max_b, sizeof(*R->fs));
    R->toks    = malloc(sizeof(int32_t) * (size_t)max_ctx);
    R->next    = malloc(sizeof(int32_t) * (size_t)max_b);
    R->lg      = malloc(sizeof(float) * (size_t)max_b * (size_t)c->vocab_size);
    R->rl      = (struct route_log){ c->n_layer, c->n_exp, calloc((size_t)(c->n_layer + 1) * (size_t)c->n_exp, 1) };
    int  chunk = R->o->chunk;
    if (!R->sts || !R->fs || !R->toks || !R->next || !R->lg || !R->rl.used) {
        dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        return false;
    }
    if (dsv4_step_init(&R->S, R->m, chunk > max_b ? chunk : max_b, ctx_cap, err)) return false;
    struct dsv4_kv_mem kvmem = dsv4_model_kv_mem(R->m);
    for (int b = 0; b < max_b; b++)
        if (dsv4_seq_state_init(&R->sts[b], &c->kv, ctx_cap, R->m->row_fmt, false, &kvmem, err)) return false;
    unsigned long long seed = 12345;
    for (int i = 0; i < max_ctx; i++) {
        seed       = seed * 6364136223846793005ull + 1442695040888963407ull;
        R->toks[i] = (int32_t)((seed >> 33) % (unsigned long long)c->vocab_size);
    }
    return true;
}

/* Sequence 0 from empty to ctx tokens, in chunks. */
static int prefill(struct bench_run *R, int ctx, struct dsv4_err *err)
{
    int chunk = R->o->chunk;
    dsv4_seq_state_reset(&R->sts[0], &R->c->kv);
    for (int off = 0; off < ctx; off += chunk) {
        int n     = ctx - off < chunk ? ctx - off : chunk;
        R->fs[0]  = (struct dsv4_fwd_seq){ .st = &R->sts[0], .tokens = R->toks + off, .n = n, .n_logits = 1, .logits = R->lg };
        int rc    = dsv4_forward(R->m, &R->S, R->fs, 1, err);
        if (rc) return rc;
    }
    return DSV4_OK;
}

/* B sequences at the ctx frontier decode o->steps tokens; their time and the bytes they read
 * (the trunk, the experts each step used, the cached rows attended). */
static int decode_steps(struct bench_run *R, int ctx, int B, double *t_total, double *bytes_total, struct dsv4_err *err)
{
    const struct dsv4_config *c = R->c;
    for (int s = 0; s < R->o->steps; s++) {
        for (int b = 0; b < B; b++) {
            R->next[b] = (int32_t)((R->toks[(s * 131 + b * 977) % ctx] + b * 7919 + s) % c->vocab_size);
            R->fs[b]   = (struct dsv4_fwd_seq){ .st = &R->sts[b], .tokens = &R->next[b], .n = 1, .n_logits = 1,
                                                .logits = R->lg + (size_t)b * (size_t)c->vocab_size };
        }
        memset(R->rl.used, 0, (size_t)(c->n_layer + 1) * (size_t)c->n_exp);
        /* the sink's buffer (a backend that is not host-visible) is made at the first step */
        int rc = dsv4_step_set_dump(&R->S, (struct dsv4_dump_sink){ route_sink, &R->rl }, err);
        if (rc) return rc;
        double t1 = cli_now();
        rc        = dsv4_forward(R->m, &R->S, R->fs, B, err);
        if (rc) return rc;
        *t_total += cli_now() - t1;
        dsv4_step_set_dump(&R->S, (struct dsv4_dump_sink){ NULL, NULL }, err);
        double bytes = R->trunk;
        for (int il = 0; il < c->n_layer; il++) {
            int u = 0;
            for (int x = 0; x < c->n_exp; x++) u += R->rl.used[(size_t)il * (size_t)c->n_exp + (size_t)x];
            bytes += u * expert_bytes(R->m, il);
            /* cached rows attended: window + compressed */
            const struct dsv4_layer_kind *k = &c->kind[il];
            int comp = k->ratio ? ctx / k->ratio : 0, rows = k->window;
            rows += k->indexer && k->idx_topk < comp ? k->idx_topk : comp;
            bytes += (double)B * rows * (double)R->sts[0].row_bytes;
            if (k->indexer) bytes += (double)B * comp * (double)R->sts[0].idx_bytes;
        }
        *bytes_total += bytes;
    }
    /* undo the decode steps so the next batch starts from the same frontier */
    for (int b = 0; b < B; b++) R->sts[b].pos = ctx;
    return DSV4_OK;
}

/* Under expert parallelism (docs/DISTRIBUTED.md): what went through MPI between two
 * snapshots, per token and per forward step, and the share of the time it took. */
static void ep_line(const struct bench_run *R, const char *what, const struct dsv4_ep_stats *a, double tokens,
                    double steps, double seconds)
{
    struct dsv4_ep_stats b;
    dsv4_engine_ep_stats(R->e, &b);
    if (b.ranks < 2) return;
    double bytes = (double)(b.bytes_sent - a->bytes_sent + b.bytes_received - a->bytes_received);
    double mpi   = b.mpi_seconds - a->mpi_seconds;
    printf("%8s %-7s MPI, %d ranks: %.1f KB per token (%.1f KB per step), %.3f ms in MPI per step, %.0f%% of the "
           "time, %.0f us per MoE layer\n", "", what, b.ranks, bytes / tokens / 1e3, bytes / steps / 1e3,
           mpi / steps * 1e3, 100.0 * mpi / seconds, 1e6 * mpi / (double)(b.layers - a->layers));
}

/* The decode rows of one context: each batch size from the frontier sequence 0 holds. */
static int decode_rows(struct bench_run *R, int ci, double prefill_tps, double prefill_gf, struct level_sum *sum,
                       struct dsv4_err *err)
{
    const struct bench_opts *o   = R->o;
    int                      ctx = o->ctxs[ci];
    for (int bi = 0; bi < o->n_batch; bi++) {
        int B = o->batches[bi];
        for (int b = 1; b < B; b++) {
            /* copy the frontier state (one allocation per sequence, same layout), through
             * the backend's copy: the state is its memory */
            dsv4_seq_state_copy(&R->sts[b], &R->sts[0]);
        }
        double t_total = 0, bytes_total = 0, bw_before = bandwidth(R, 3);
        struct dsv4_ep_stats ep0;
        dsv4_engine_ep_stats(R->e, &ep0);
        int    rc = decode_steps(R, ctx, B, &t_total, &bytes_total, err);
        if (rc) return rc;
        double step = t_total / (double)o->steps, bps = bytes_total / (double)o->steps;
        double bw_row = 0.5 * (bw_before + bandwidth(R, 3));
        double share  = bps / step / 1e9 / bw_row;
        printf("%8d %6d %12.1f %12.1f %7.0f%% %12.2f %10.2f %14.3e %10.2f %8.1f %7.0f%%\n", ctx, B, prefill_tps,
               prefill_gf, R->peak > 0 ? 100.0 * prefill_gf / R->peak : 0.0, B / step, step * 1e3, bps, bps / step / 1e9,
               bw_row, 100.0 * share);
        ep_line(R, "decode", &ep0, (double)B * o->steps, o->steps, t_total);
        fflush(stdout);
        if (R->cf)
            fprintf(R->cf, "%s,%s,%d,%s,%s,%.2f,%d,%d,%.2f,%.2f,%.3f,%.3f,%.0f,%.3f,%.3f,%.1f\n", R->un.machine,
                    R->backend, R->n_threads, o->dir, DSV4_GIT_REV, bw_row, ctx, B, prefill_tps, prefill_gf, B / step,
                    step * 1e3, bps, bps / step / 1e9, share, R->peak);
        if (sum && ci == 0) {
            sum->bw = R->bw, sum->peak = R->peak, sum->peak_f32 = R->peak_f32, sum->prefill_tps = prefill_tps;
            sum->prefill_gf = prefill_gf;
            if (bi < 8) sum->batch[bi] = B, sum->tps[bi] = B / step, sum->share[bi] = share;
        }
        /* the copies above restore KV contents; sequence 0's ring rows past ctx were
         * overwritten by the decode steps, so re-prefill for the next batch size */
        if (bi + 1 < o->n_batch && (rc = prefill(R, ctx, err))) return rc;
    }
    return DSV4_OK;
}

/* Every context: prefill to the frontier (timed), then its decode rows. */
static int bench_contexts(struct bench_run *R, struct level_sum *sum, struct dsv4_err *err)
{
    const struct bench_opts  *o = R->o;
    const struct dsv4_config *c = R->c;
    printf("\n%8s %6s %12s %12s %8s %12s %10s %14s %10s %8s %8s\n", "ctx", "batch", "prefill t/s", "prefill GF/s",
           "of peak", "decode t/s", "step ms", "bytes/step", "GB/s", "bw GB/s", "of bw");
    for (int ci = 0; ci < o->n_ctx; ci++) {
        int    ctx = o->ctxs[ci];
        struct dsv4_ep_stats ep0;
        dsv4_engine_ep_stats(R->e, &ep0);
        double t0  = cli_now();
        int    rc  = prefill(R, ctx, err);
        if (rc) return rc;
        double tp = cli_now() - t0, prefill_tps = ctx / tp;
        ep_line(R, "prefill", &ep0, ctx, (ctx + o->chunk - 1) / o->chunk, tp);
        /* projection and expert FLOPs of every prompt token; the head runs once per chunk
         * (only the last row's logits are asked for); attention is not counted */
        double head_p     = (double)c->vocab_size * (double)c->d_model;
        int    n_chunks   = (ctx + o->chunk - 1) / o->chunk;
        double prefill_gf = 2.0 * (((double)R->st.active_params - head_p) * ctx + head_p * n_chunks) / tp / 1e9;
        if ((rc = decode_rows(R, ci, prefill_tps, prefill_gf, sum, err))) return rc;
    }
    return DSV4_OK;
}

/* One model at one level (backend option level): bandwidth, peak, then prefill and decode rows;
 * sum (if given) keeps the first context's figures for the summary of --cpu-level all. */
static int bench_model(struct bench_opts *o, const struct dsv4_engine_params *epp, struct level_sum *sum)
{
    struct dsv4_engine_params ep = *epp;
    struct dsv4_err           err;
    dsv4_engine              *e;
    if (dsv4_engine_open(&e, o->dir, &ep, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        return 1;
    }
    /* Every weight page read and mapped before anything is timed: otherwise the first prefill
     * pays a minor page fault per 4 KiB of the mapped checkpoint it touches (on the 12 GB
     * flash-shaped model, 84 instead of 124 tok/s at avx2), a cost a running server pays once. */
    double  tr       = cli_now();
    int64_t resident = dsv4_engine_make_resident(e);
    if (resident >= 0)
        printf("weights in memory and mapped before timing: %.2f GB in %.1f s\n", (double)resident / 1e9, cli_now() - tr);
    struct bench_run R = { .o = o, .m = dsv4_engine_model(e), .e = e };
    R.c                = &R.m->cfg;
    R.kind             = R.m->backend;
    R.impl             = R.m->backend_impl;
    int max_b = 1, max_ctx = 1, rc = 1;
    for (int i = 0; i < o->n_batch; i++) max_b = o->batches[i] > max_b ? o->batches[i] : max_b;
    for (int i = 0; i < o->n_ctx; i++) max_ctx = o->ctxs[i] > max_ctx ? o->ctxs[i] : max_ctx;
    int ctx_cap = max_ctx + o->steps + 1 + (o->spec ? o->spec + 2 : 0); /* --spec-rows: ctx + K + 2 */
    if (!measure_machine(&R)) goto done;
    R.cf = o->csv ? fopen(o->csv, o->csv_started ? "a" : "w") : NULL;
    if (o->csv && !R.cf) fprintf(stderr, "dsv4 bench: cannot create %s\n", o->csv);
    if (R.cf && !o->csv_started)
        fprintf(R.cf, "machine,backend,threads,checkpoint,commit,read_gbps,ctx,batch,prefill_tok_s,prefill_gflops,"
                      "decode_tok_s,step_ms,bytes_per_step,achieved_gbps,bw_share,peak_gflops\n");
    o->csv_started = R.cf != NULL;
    if (!alloc_run(&R, max_b, max_ctx, ctx_cap, &err) || bench_contexts(&R, sum, &err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        goto done;
    }
    if (o->spec > 0) {
        if (!R.m->w.has_mtp) {
            fprintf(stderr, "dsv4 bench: --spec-rows needs a checkpoint with an MTP block (V4.1: DSpark stages)\n");
            goto done;
        }
        if (bench_spec(R.m, &R.S, R.toks, o->ctxs[0], o->spec, o->steps, &err)) {
            fprintf(stderr, "dsv4 bench: %s\n", err.msg);
            goto done;
        }
    }
    rc = 0;
done:
    if (R.cf) fclose(R.cf);
    for (int b = 0; R.sts && b < max_b; b++) dsv4_seq_state_free(&R.sts[b]);
    dsv4_step_free(&R.S);
    free(R.sts);
    free(R.fs);
    free(R.toks);
    free(R.next);
    free(R.lg);
    free(R.rl.used);
    if (R.bw_buf) R.kind->free(R.impl, R.bw_buf, R.bw_n * 8);
    dsv4_engine_close(e);
    return rc;
}

/* Whether `name` is one of the comma-separated entries of `list`. */
static bool in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

/* --cpu-level all (list NULL: every level this machine runs, lowest first) or a list
 * (A,B,...: those levels, in the backend's order), then one summary table. A listed level
 * the backend does not know or this machine lacks is an error before anything runs. */
static int bench_levels(struct bench_opts *o, const struct dsv4_engine_params *epp, const char *list)
{
    struct dsv4_engine_params       ep = *epp;
    struct level_sum                sums[16];
    int                             n_sum = 0, rc = 0, n_listed = 0;
    bool                            here;
    const char                     *name;
    const struct dsv4_backend_kind *kind = dsv4_backend_find(ep.backend);
    for (int l = 0; list && kind && kind->level && (name = kind->level(l, &here)); l++)
        if (in_list(list, name)) {
            if (!here) {
                fprintf(stderr, "dsv4 bench: --cpu-level %s: this machine lacks level %s\n", list, name);
                return 1;
            }
            n_listed++;
        }
    int n_entries = list ? 1 : 0;
    for (const char *p = list; p && *p; p++) n_entries += *p == ',';
    if (n_listed != n_entries) {
        fprintf(stderr, "dsv4 bench: --cpu-level %s: a level is unknown to this backend or repeated (dsv4 ops lists "
                        "them)\n", list);
        return 1;
    }
    for (int l = 0; kind && kind->level && (name = kind->level(l, &here)) && n_sum < 16; l++) {
        if (!here || (list && !in_list(list, name))) continue;
        if (!cli_backend_opt(&ep, "level", name)) /* the last level= wins */
            return 1;
        printf("\n=== level %s ===\n", name);
        memset(&sums[n_sum], 0, sizeof(sums[n_sum]));
        snprintf(sums[n_sum].level, sizeof(sums[n_sum].level), "%s", name);
        if ((rc = bench_model(o, &ep, &sums[n_sum]))) break;
        n_sum++;
    }
    print_summary(sums, n_sum, o);
    return rc;
}

/* The command line: the lists as given, and the --gemm spec (which runs alone). */
struct bench_args {
    const char *dir, *csv, *ctx_s, *batch_s, *gemm;
    int         steps, chunk, spec;
};

#define BA(field) offsetof(struct bench_args, field)
static const struct cli_opt BENCH_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory", CLI_STR, BA(dir), 0, 0, NULL },
    { "--ctx-list", NULL, "A,B,...", "context frontiers (default 512,2048)", CLI_STR, BA(ctx_s), 0, 0, NULL },
    { "--batch-list", NULL, "A,B,...", "decode batch sizes (default 1,4,8,16)", CLI_STR, BA(batch_s), 0, 0, NULL },
    { "--decode-steps", NULL, "N", "decode steps per row (default 8)", CLI_INT, BA(steps), 1, 1000, NULL },
    { "--chunk", NULL, "N", "prefill tokens per forward call (default 512)", CLI_INT, BA(chunk), 1, 65536, NULL },
    { "--csv", NULL, "FILE", "also write the rows as CSV", CLI_STR, BA(csv), 0, 0, NULL },
    { "--spec-rows", NULL, "K", "verify steps of 1 .. K + 1 rows and a draft row (MTP)", CLI_INT, BA(spec), 1,
      DSV4_SPEC_MAX_DRAFT, NULL },
    { "--gemm", NULL, "M,N,K[,fp8|fp4|bf16][,i16][:...]",
      "one projection alone: M tokens, N outputs, K inputs; i16: on\ninterleaved 16-row tiles (no -m)", CLI_STR,
      BA(gemm), 0, 0, NULL },
};
#undef BA

int cmd_bench(int argc, char **argv)
{
    struct bench_args a = { .ctx_s = "512,2048", .batch_s = "1,4,8,16", .steps = 8, .chunk = 512 };
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group groups[] = { { NULL, BENCH_OPTS, sizeof(BENCH_OPTS) / sizeof(BENCH_OPTS[0]), &a },
                                        cli_engine_group(&ep, true) };
    const struct cli_spec  spec     = { "bench",
                                        "usage: dsv4 bench -m DIR [options]   prefill and decode rows per context and batch\n"
                                        "       dsv4 bench --gemm SPEC [options]   one projection alone\n",
                                        groups, 2,
                                        "\n--cpu-level all: every level this machine runs, then a summary table; --cpu-level A,B,...: those\nlevels (e.g. all but scalar on a large model), then the table\n" };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (a.gemm) return bench_gemm(a.gemm, &ep);
    const char *dir = a.dir, *csv = a.csv;
    int         steps = a.steps, chunk = a.chunk, spec_k = a.spec;
    int         n_ctx, n_batch;
    int        *ctxs = parse_list(a.ctx_s, &n_ctx), *batches = parse_list(a.batch_s, &n_batch);
    if (!dir || !ctxs || !batches || !n_ctx || !n_batch) {
        fprintf(stderr, "dsv4 bench: -m DIR is required; lists are positive integers separated by commas\n");
        free(ctxs);
        free(batches);
        return 2;
    }
    ep.log       = cli_log_stderr;
    ep.log_ud    = (void *)"bench";
    struct bench_opts o = { dir, csv, ctxs, n_ctx, batches, n_batch, steps, chunk, false, spec_k };
    char level[256];
    if (!dsv4_backend_opt_get(ep.backend_opts, "level", level, sizeof(level)) ||
        (strcmp(level, "all") != 0 && !strchr(level, ',')))
        rc = bench_model(&o, &ep, NULL);
    else
        rc = bench_levels(&o, &ep, strcmp(level, "all") ? level : NULL);
    free(ctxs);
    free(batches);
    return rc;
}
