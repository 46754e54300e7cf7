/*
 * test_spec.c - speculative decoding with the MTP block (docs/SPECULATIVE.md).
 *
 * rollback_every_keep: on tiny-a and tiny-b (window, CSA and HCA layers of ratio 16 and 128,
 * MTP), verify chunks of 2..8 rows whose tokens past a random kept prefix are garbage, rolled
 * back to that prefix, with drafts (pending and chained rows) in between: every kept row's
 * logits and MTP logits equal, bit for bit, those of feeding the true tokens one at a time,
 * across window wraps, compression blocks and a page boundary.
 * greedy_identity: dsv4_session_spec_step with a greedy sampler gives the tokens and logits
 * of a one-token-at-a-time greedy decode, for K = 1, 2, 3, 7 and prompts chunked by 1, 7 and
 * 512 (five pairs), on tiny-a, tiny-b and the demo model (whose trained MTP head must get drafts kept).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "session.h"
#include "test_cases.h"

#define DEMO_MODEL "models/kjv-v4-tiny"

static bool make_model(struct test_ctx *t, const char *preset, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", t->tmpdir, preset);
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = preset;
    o.seed   = 23;
    o.quiet  = true;
    struct dsv4_err err;
    int             rc = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen: %s", err.msg);
    return rc == DSV4_OK;
}

static dsv4_session *new_session(struct test_ctx *t, dsv4_engine *e, int max_ctx, int chunk, int spec)
{
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx    = max_ctx;
    sp.max_chunk  = chunk;
    sp.mtp        = true;
    sp.spec_draft = spec;
    dsv4_session   *s = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    return s;
}

/* The reference: the tokens one at a time, logits [T, V] and MTP logits [T - 1, V] (row p:
 * the MTP block at position p, predicting token p + 2). */
static bool one_at_a_time(struct test_ctx *t, dsv4_engine *e, const int32_t *tok, int T, float *lg, float *ml)
{
    dsv4_session *s = new_session(t, e, T, 1, 0);
    if (!s) return false;
    size_t          V = (size_t)dsv4_engine_model(e)->cfg.vocab_size;
    struct dsv4_err err;
    int             nm = 0, rc = DSV4_OK;
    for (int p = 0; p < T && rc == DSV4_OK; p++) {
        int got = 0;
        rc      = dsv4_session_eval(s, tok + p, 1, lg + (size_t)p * V, ml + (size_t)nm * V, &got, &err);
        nm += got;
    }
    CHECKF(rc == DSV4_OK && nm == T - 1, "reference run: rc %d, %d MTP rows: %s", rc, nm, err.msg);
    dsv4_session_free(s);
    return rc == DSV4_OK;
}

static void rollback_every_keep(struct test_ctx *t, const char *preset)
{
    char dir[512];
    if (!make_model(t, preset, dir, sizeof(dir))) return;
    dsv4_engine    *e;
    struct dsv4_err err;
    if (dsv4_engine_open(&e, dir, NULL, &err)) {
        CHECKF(0, "open: %s", err.msg);
        return;
    }
    const struct dsv4_model *m = dsv4_engine_model(e);
    size_t                   V = (size_t)m->cfg.vocab_size;
    enum { T = 300, P0 = 5 };
    unsigned long long seed = 99;
    int32_t           *tok  = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand_u64(&seed) % V);
    float *lg = malloc(sizeof(float) * V * T), *ml = malloc(sizeof(float) * V * T);
    float *vl = malloc(sizeof(float) * V * 8), *vm = malloc(sizeof(float) * V * 9), *dl = malloc(sizeof(float) * V);
    dsv4_session *s = NULL;
    if (!one_at_a_time(t, e, tok, T, lg, ml) || !(s = new_session(t, e, T + 8, 16, 7))) goto done;
    CHECK(dsv4_session_eval(s, tok, P0, NULL, NULL, NULL, &err) == DSV4_OK);
    int bad_lg = 0, bad_ml = 0, n_ml = 0, steps = 0, drafts = 0, bad_draft = 0;
    for (int P = P0; P < T; steps++) {
        int K = 1 + (int)(test_rand_u64(&seed) % 7), keep = 1 + (int)(test_rand_u64(&seed) % (unsigned)(K + 1));
        if (keep > T - P) keep = T - P;
        int32_t chunk[8];
        for (int i = 0; i <= K; i++) {
            chunk[i] = i < keep ? tok[P + i] : (int32_t)(test_rand_u64(&seed) % V);
            if (i >= keep && P + i < T && chunk[i] == tok[P + i]) chunk[i] = (chunk[i] + 1) % (int32_t)V;
        }
        if (steps % 3 == 0) {
            /* drafts first: the pending row with the true next token (its logits are the
             * reference's MTP row P - 1), then chained rows on garbage */
            int depth = 1 + (int)(test_rand_u64(&seed) % 3);
            for (int d = 0; d < depth; d++) {
                int32_t             dt = d ? (int32_t)(test_rand_u64(&seed) % V) : tok[P];
                struct dsv4_fwd_seq q  = { .st = &s->st, .tokens = &dt, .n = 1, .mtp_logits = dl, .draft_depth = d };
                CHECK(dsv4_forward_draft(m, &s->step, &q, 1, &err) == DSV4_OK);
                if (d == 0 && memcmp(dl, ml + (size_t)(P - 1) * V, sizeof(float) * V)) bad_draft++;
                drafts++;
            }
        }
        int                 first = s->st.mtp_pos;
        struct dsv4_fwd_seq q     = { .st = &s->st, .tokens = chunk, .n = K + 1, .n_logits = K + 1, .logits = vl,
                                      .mtp_logits = vm, .undo = &s->undo };
        if (dsv4_forward(m, &s->step, &q, 1, &err)) {
            CHECKF(0, "verify at %d: %s", P, err.msg);
            break;
        }
        for (int i = 0; i < keep; i++) bad_lg += memcmp(vl + (size_t)i * V, lg + (size_t)(P + i) * V, sizeof(float) * V) != 0;
        for (int i = 0; i < q.n_mtp; i++) /* rows whose streams and next token are true */
            if (first + i <= P + keep - 2) {
                bad_ml += memcmp(vm + (size_t)i * V, ml + (size_t)(first + i) * V, sizeof(float) * V) != 0;
                n_ml++;
            }
        dsv4_spec_rollback(m, &s->step, &s->st, &s->undo, keep);
        CHECK(s->st.pos == P + keep && s->st.mtp_pos == P + keep - 1);
        P += keep;
    }
    CHECKF(bad_lg == 0, "%s: %d kept rows' logits differ from one-at-a-time decoding", preset, bad_lg);
    CHECKF(bad_ml == 0 && n_ml > T / 2, "%s: %d of %d MTP rows differ", preset, bad_ml, n_ml);
    CHECKF(bad_draft == 0 && drafts > 0, "%s: %d of the pending drafts' logits differ", preset, bad_draft);
done:
    dsv4_session_free(s);
    free(tok);
    free(lg);
    free(ml);
    free(vl);
    free(vm);
    free(dl);
    dsv4_engine_close(e);
}

static void test_rollback_every_keep(struct test_ctx *t)
{
    rollback_every_keep(t, "tiny-a");
    rollback_every_keep(t, "tiny-b");
}

/* Greedy decoding of N tokens after the prompt, plain (K < 0) or speculative with K drafts;
 * tokens [N] and the logits each was chosen from [N, V]; returns the drafts kept. */
static int greedy(struct test_ctx *t, dsv4_engine *e, const int32_t *prompt, int n_prompt, int chunk, int K, int N,
                  int32_t *out, float *lg)
{
    size_t        V = (size_t)dsv4_engine_model(e)->cfg.vocab_size;
    dsv4_session *s = new_session(t, e, n_prompt + N + 8, chunk, K > 0 ? K : 0);
    dsv4_sampler *smp;
    struct dsv4_sampler_params sp;
    struct dsv4_err            err;
    dsv4_sampler_params_default(&sp);
    if (!s || dsv4_sampler_create(&smp, (int)V, &sp, &err)) {
        dsv4_session_free(s);
        return -1;
    }
    int kept = 0, n = 0;
    CHECK(dsv4_session_eval(s, prompt, n_prompt, NULL, NULL, NULL, &err) == DSV4_OK);
    memcpy(lg, dsv4_session_logits(s), sizeof(float) * V);
    out[n++] = dsv4_sampler_sample(smp, lg, NULL);
    float *rows = malloc(sizeof(float) * V * 8);
    while (n < N) {
        int32_t got[8];
        int     n_got = 0;
        if (K < 0) {
            if (dsv4_session_eval(s, &out[n - 1], 1, NULL, NULL, NULL, &err)) break;
            memcpy(rows, dsv4_session_logits(s), sizeof(float) * V);
            got[n_got++] = dsv4_sampler_sample(smp, rows, NULL);
        } else if (dsv4_session_spec_step(s, out[n - 1], K, smp, got, &n_got, rows, &err)) {
            CHECKF(0, "spec step: %s", err.msg);
            break;
        }
        kept += n_got - 1;
        for (int i = 0; i < n_got && n < N; i++, n++) {
            out[n] = got[i];
            memcpy(lg + (size_t)n * V, rows + (size_t)i * V, sizeof(float) * V);
        }
    }
    CHECKF(n == N, "decoded %d of %d tokens", n, N);
    free(rows);
    dsv4_sampler_free(smp);
    dsv4_session_free(s);
    return kept;
}

static void greedy_identity(struct test_ctx *t, const char *dir, bool demo)
{
    dsv4_engine    *e;
    struct dsv4_err err;
    if (dsv4_engine_open(&e, dir, NULL, &err)) {
        CHECKF(0, "open %s: %s", dir, err.msg);
        return;
    }
    size_t V = (size_t)dsv4_engine_model(e)->cfg.vocab_size;
    enum { NP = 20, N = 48 };
    unsigned long long seed   = 5;
    int32_t            prompt[NP], ref[N], got[N];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(test_rand_u64(&seed) % V);
    if (demo) /* a line of text, so that the trained heads see what they were trained on */
        for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(200 + 37 * i) % (int32_t)V;
    float *lr = malloc(sizeof(float) * V * N), *lg = malloc(sizeof(float) * V * N);
    greedy(t, e, prompt, NP, 512, -1, N, ref, lr);
    /* every K and every prompt chunking, not every pair (each run decodes N tokens) */
    static const int Ks[] = { 1, 2, 3, 7, 2 }, chunks[] = { 1, 7, 512, 1, 512 };
    int kept_total = 0;
    for (size_t i = 0; i < sizeof(Ks) / sizeof(Ks[0]); i++) {
        int kept = greedy(t, e, prompt, NP, chunks[i], Ks[i], N, got, lg);
        kept_total += kept > 0 ? kept : 0;
        CHECKF(!memcmp(ref, got, sizeof(ref)), "%s K=%d chunk %d: tokens differ", dir, Ks[i], chunks[i]);
        CHECKF(!memcmp(lr, lg, sizeof(float) * V * N), "%s K=%d chunk %d: logits differ", dir, Ks[i], chunks[i]);
    }
    if (demo) CHECKF(kept_total > 0, "the demo model's MTP head had no draft kept");
    free(lr);
    free(lg);
    dsv4_engine_close(e);
}

static void test_greedy_identity(struct test_ctx *t)
{
    char dir[512];
    if (make_model(t, "tiny-a", dir, sizeof(dir))) greedy_identity(t, dir, false);
    if (make_model(t, "tiny-b", dir, sizeof(dir))) greedy_identity(t, dir, false);
    greedy_identity(t, DEMO_MODEL, true);
}

const struct test_case test_group_spec[] = {
    { "rollback_every_keep", test_rollback_every_keep },
    { "greedy_identity", test_greedy_identity },
    { NULL, NULL },
};
