/*
 * test_v41_fwd.c - the DeepSeek-V4.1 forward's invariances on the tiny-v41 checkpoint (the
 * accuracy against the reference is group golden's, fixture tests/golden/tiny-v41): at the
 * scalar level and at this CPU's best, the logits of the golden prompt (40 tokens: the window
 * wraps, both kv sources have many compressed rows, the candidate pre-filter excludes blocks)
 * are bit for bit the same whole and in chunks of 1, 3 and 7 (the Engram history and the
 * compressor frontiers carry across calls), and two different sequences in one step each get
 * the logits they get alone; a saved session continues bit for bit. A light run (sanitizers,
 * qemu: test_light) takes the best level at chunks of 1 and 7 only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "engine/session.h"
#include "io/io.h"
#include "model/runtime.h"
#include "support/gen.h"
#include "test_cases.h"

enum { T_MAX = 64 };

/* The tiny-v41 checkpoint of the golden fixture (gen seed 1) in tmpdir, and its prompt. */
static bool setup(struct test_ctx *t, char *dir, size_t cap, int32_t *toks, int *T)
{
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    if (dsv4_checkpoint_open(&ck, "tests/golden/tiny-v41.safetensors", &err)) {
        CHECKF(0, "%s", err.msg);
        return false;
    }
    const struct dsv4_tensor *tt = dsv4_checkpoint_find(&ck, "seq.tokens");
    CHECK(tt && tt->shape[0] <= T_MAX);
    if (tt && tt->shape[0] <= T_MAX) {
        *T = (int)tt->shape[0];
        memcpy(toks, tt->data, sizeof(int32_t) * (size_t)*T);
    }
    dsv4_checkpoint_close(&ck);
    snprintf(dir, cap, "%s/v41-fwd", t->tmpdir);
    if (dsv4_path_exists(dir)) return tt != NULL;
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = "tiny-v41";
    o.quiet  = true;
    int rc   = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen: %s", err.msg);
    return tt && rc == DSV4_OK;
}

static dsv4_engine *open_level(struct test_ctx *t, const char *dir, const char *level)
{
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    char opts[48];
    snprintf(opts, sizeof(opts), "level=%s", level);
    if (level) ep.backend_opts = opts;
    dsv4_engine    *e;
    struct dsv4_err err;
    int             rc = dsv4_engine_open(&e, dir, &ep, &err);
    CHECKF(rc == DSV4_OK, "open at %s: %s", level ? level : "best", err.msg);
    return rc ? NULL : e;
}

/* logits [T, V] of toks fed in chunks of `chunk` through a fresh session. */
static bool run_chunks(struct test_ctx *t, dsv4_engine *e, const int32_t *toks, int T, int chunk, float *lg, int V)
{
    dsv4_session *s = test_session_new(t, e, T_MAX, chunk);
    if (!s) return false;
    struct dsv4_err err;
    int             rc = DSV4_OK;
    for (int off = 0; off < T && rc == DSV4_OK; off += chunk) {
        int n = T - off < chunk ? T - off : chunk;
        rc    = dsv4_session_eval(s, toks + off, n, lg + (size_t)off * (size_t)V, NULL, NULL, &err);
        CHECKF(rc == DSV4_OK, "eval at %d (chunk %d): %s", off, chunk, err.msg);
    }
    dsv4_session_free(s);
    return rc == DSV4_OK;
}

static void chunks_at(struct test_ctx *t, const char *dir, const int32_t *toks, int T, const char *level,
                      const int *chunks, int n_chunks)
{
    dsv4_engine *e = open_level(t, dir, level);
    if (!e) return;
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    int    V = info.vocab_size;
    float *whole = malloc(sizeof(float) * (size_t)T * (size_t)V), *part = malloc(sizeof(float) * (size_t)T * (size_t)V);
    if (run_chunks(t, e, toks, T, T, whole, V))
        for (int c = 0; c < n_chunks; c++)
            if (run_chunks(t, e, toks, T, chunks[c], part, V))
                CHECKF(!memcmp(whole, part, sizeof(float) * (size_t)T * (size_t)V),
                       "[%s] chunk %d: logits differ from the whole prompt's", level ? level : "best", chunks[c]);
    free(whole);
    free(part);
    dsv4_engine_close(e);
}

static void test_chunks_identical(struct test_ctx *t)
{
    char    dir[512];
    int32_t toks[T_MAX];
    int     T = 0;
    if (!setup(t, dir, sizeof(dir), toks, &T)) return;
    /* a light run (test_light: sanitizers, qemu) takes the best level's decode and one
     * chunking: the plain run takes both levels at every chunking */
    static const int all[] = { 1, 3, 7 }, light[] = { 1, 7 };
    if (!test_light()) chunks_at(t, dir, toks, T, "scalar", all, 3);
    chunks_at(t, dir, toks, T, NULL, test_light() ? light : all, test_light() ? 2 : 3);
}

/* One step over both sequences' chunks ([n0, n1] rows each), logits into la / lb. */
static void batch_step(struct test_ctx *t, dsv4_session *a, dsv4_session *b, const int32_t *ta, const int32_t *tb,
                       int n0, int n1, float *la, float *lb)
{
    const struct dsv4_model *m = dsv4_engine_model(a->engine);
    struct dsv4_fwd_seq q[2] = { { .st = &a->st, .tokens = ta, .n = n0, .n_logits = n0, .logits = la },
                                 { .st = &b->st, .tokens = tb, .n = n1, .n_logits = n1, .logits = lb } };
    struct dsv4_err err;
    CHECKF(dsv4_forward(m, &a->step, q, 2, &err) == DSV4_OK, "batch step: %s", err.msg);
}

/* Two different sequences (the golden prompt, and its tokens reversed) in steps of uneven
 * chunks (13 + 5, then 27 + 35) against each alone, at this CPU's best level. */
static void test_batch_identical(struct test_ctx *t)
{
    char    dir[512];
    int32_t ta[T_MAX], tb[T_MAX];
    int     T = 0;
    if (!setup(t, dir, sizeof(dir), ta, &T) || T != 40) return;
    for (int i = 0; i < T; i++) tb[i] = ta[T - 1 - i];
    dsv4_engine *e = open_level(t, dir, NULL);
    if (!e) return;
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    size_t n   = (size_t)T * (size_t)info.vocab_size;
    float *buf = malloc(sizeof(float) * 4 * n), *alone_a = buf, *alone_b = buf + n, *ba = buf + 2 * n, *bb = buf + 3 * n;
    dsv4_session *a = test_session_new(t, e, T_MAX, T_MAX), *b = test_session_new(t, e, T_MAX, T_MAX);
    if (a && b && run_chunks(t, e, ta, T, T, alone_a, info.vocab_size) &&
        run_chunks(t, e, tb, T, T, alone_b, info.vocab_size)) {
        size_t V = (size_t)info.vocab_size;
        batch_step(t, a, b, ta, tb, 13, 5, ba, bb);
        batch_step(t, a, b, ta + 13, tb + 5, 27, 35, ba + 13 * V, bb + 5 * V);
        CHECKF(!memcmp(ba, alone_a, sizeof(float) * n), "sequence 1: batched logits differ from alone");
        CHECKF(!memcmp(bb, alone_b, sizeof(float) * n), "sequence 2: batched logits differ from alone");
        CHECKF(memcmp(alone_a, alone_b, sizeof(float) * n) != 0, "the two sequences give the same logits");
    }
    if (a) dsv4_session_free(a);
    if (b) dsv4_session_free(b);
    free(buf);
    dsv4_engine_close(e);
}

/* A session saved after 17 tokens and loaded into a fresh one continues bit for bit: the
 * saved slot carries the Engram history (the next n-grams reach back into it) with the rings
 * and frontiers. */
static void test_saved_session_continues(struct test_ctx *t)
{
    char    dir[512], path[600];
    int32_t toks[T_MAX], back[T_MAX];
    int     T = 0, n = 0, k = 17;
    if (!setup(t, dir, sizeof(dir), toks, &T) || T <= k) return;
    dsv4_engine *e = open_level(t, dir, NULL);
    if (!e) return;
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    size_t V = (size_t)info.vocab_size;
    float *whole = malloc(sizeof(float) * (size_t)T * V), *rest = malloc(sizeof(float) * (size_t)T * V);
    dsv4_session *a = test_session_new(t, e, T_MAX, T_MAX), *b = test_session_new(t, e, T_MAX, T_MAX);
    struct dsv4_err err;
    snprintf(path, sizeof(path), "%s/v41.session", t->tmpdir);
    if (a && b && run_chunks(t, e, toks, T, T, whole, info.vocab_size)) {
        CHECK(dsv4_session_eval(a, toks, k, NULL, NULL, NULL, &err) == DSV4_OK);
        CHECKF(dsv4_session_save(a, path, toks, k, &err) == DSV4_OK, "save: %s", err.msg);
        CHECKF(dsv4_session_load(b, path, back, T_MAX, &n, &err) == DSV4_OK && n == k, "load: %s", err.msg);
        CHECK(dsv4_session_eval(b, toks + k, T - k, rest, NULL, NULL, &err) == DSV4_OK);
        CHECKF(!memcmp(rest, whole + (size_t)k * V, sizeof(float) * (size_t)(T - k) * V),
               "logits after a saved and loaded session differ from the whole prompt's");
    }
    if (a) dsv4_session_free(a);
    if (b) dsv4_session_free(b);
    free(whole);
    free(rest);
    dsv4_engine_close(e);
}

const struct test_case test_group_v41_fwd[] = {
    { "chunks_identical_scalar_and_best", test_chunks_identical },
    { "batch_identical", test_batch_identical },
    { "saved_session_continues", test_saved_session_continues },
    { NULL, NULL },
};
