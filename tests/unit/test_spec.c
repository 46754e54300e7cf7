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
 * DeepSeek-V4.1 (tiny-v41): the same greedy identity with DSpark drafts (K capped at its block
 * of 3), and rollback_every_keep_v41 below.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/session.h"
#include "support/gen.h"
#include "test_cases.h"
#include "test_session.h"
#include "test_v41.h"

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

/* A verify chunk at position P of 2..8 rows (K + 1): the true tokens up to a random kept
 * prefix (returned), garbage past it (never the true token). */
static int verify_chunk(unsigned long long *seed, const int32_t *tok, int P, int T, int V, int32_t *chunk, int *K)
{
    *K       = 1 + (int)(test_rand_u64(seed) % 7);
    int keep = 1 + (int)(test_rand_u64(seed) % (unsigned)(*K + 1));
    if (keep > T - P) keep = T - P;
    for (int i = 0; i <= *K; i++) {
        chunk[i] = i < keep ? tok[P + i] : (int32_t)(test_rand_u64(seed) % (unsigned)V);
        if (i >= keep && P + i < T && chunk[i] == tok[P + i]) chunk[i] = (chunk[i] + 1) % V;
    }
    return keep;
}

static void rollback_every_keep(struct test_ctx *t, const char *preset)
{
    dsv4_engine    *e = test_session_model(t, preset);
    struct dsv4_err err;
    if (!e) return;
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
        int32_t chunk[8];
        int     K, keep = verify_chunk(&seed, tok, P, T, (int)V, chunk, &K);
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

/* V4.1's reference: the tokens one at a time, logits [T, V], and after each position p < T - 1
 * the DSpark rows with tok[p + 1] known, [B, V] and their confidence [B]. */
static bool one_at_a_time_v41(struct test_ctx *t, dsv4_engine *e, const int32_t *tok, int T, float *lg, float *dl,
                              float *dc)
{
    dsv4_session *s = new_session(t, e, T, 1, 0);
    if (!s) return false;
    const struct dsv4_model *m = dsv4_engine_model(e);
    size_t          V = (size_t)m->cfg.vocab_size, B = (size_t)m->cfg.v41.dspark_block;
    struct dsv4_err err;
    int             rc = DSV4_OK;
    for (int p = 0; p < T && rc == DSV4_OK; p++) {
        rc = dsv4_session_eval(s, tok + p, 1, lg + (size_t)p * V, NULL, NULL, &err);
        if (rc == DSV4_OK && p + 1 < T)
            rc = dsv4_session_dspark_rows(s, tok[p + 1], dl + (size_t)p * B * V, dc + (size_t)p * B, &err);
    }
    CHECKF(rc == DSV4_OK, "reference run: %s", err.msg);
    dsv4_session_free(s);
    return rc == DSV4_OK;
}

/* rollback_every_keep on tiny-v41 (Engram on layers 1 and 5, a ratio-2 kv source, ratio-1
 * sources, the candidate pre-filter, 2 DSpark stages): the kept rows' logits are those of
 * one-at-a-time decoding (a missing frontier or Engram undo shows here), and the DSpark rows
 * drafted between verify steps, with the true next token, are the one-at-a-time session's
 * (a ring written by a rejected row and then read would show here). */
static void rollback_every_keep_v41(struct test_ctx *t)
{
    dsv4_engine    *e = test_session_model(t, "tiny-v41");
    struct dsv4_err err;
    if (!e) return;
    if (test_v41_refused_here(t, e)) {
        dsv4_engine_close(e);
        return;
    }
    const struct dsv4_model *m = dsv4_engine_model(e);
    size_t                   V = (size_t)m->cfg.vocab_size, B = (size_t)m->cfg.v41.dspark_block;
    enum { T = 120, P0 = 5 };
    unsigned long long seed = 77;
    int32_t           *tok  = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(test_rand_u64(&seed) % V);
    float *lg = malloc(sizeof(float) * V * T), *dl = malloc(sizeof(float) * V * B * T), *dc = malloc(sizeof(float) * B * T);
    float *vl = malloc(sizeof(float) * V * 8), *gl = malloc(sizeof(float) * V * B), gc[64];
    dsv4_session *s = NULL;
    if (!one_at_a_time_v41(t, e, tok, T, lg, dl, dc) || !(s = new_session(t, e, T + 8, 16, 7))) goto done;
    CHECK(dsv4_session_eval(s, tok, P0, NULL, NULL, NULL, &err) == DSV4_OK);
    int bad_lg = 0, bad_draft = 0, drafts = 0, partial = 0;
    for (int P = P0; P < T;) {
        int32_t chunk[8];
        int     K, keep = verify_chunk(&seed, tok, P, T, (int)V, chunk, &K);
        if (B <= 64 && dsv4_session_dspark_rows(s, tok[P], gl, gc, &err) == DSV4_OK) {
            drafts++;
            bad_draft += memcmp(gl, dl + (size_t)(P - 1) * B * V, sizeof(float) * B * V) != 0 ||
                         memcmp(gc, dc + (size_t)(P - 1) * B, sizeof(float) * B) != 0;
        }
        struct dsv4_fwd_seq q = { .st = &s->st, .tokens = chunk, .n = K + 1, .n_logits = K + 1, .logits = vl,
                                  .undo = &s->undo };
        if (dsv4_forward(m, &s->step, &q, 1, &err)) {
            CHECKF(0, "verify at %d: %s", P, err.msg);
            break;
        }
        for (int i = 0; i < keep; i++) bad_lg += memcmp(vl + (size_t)i * V, lg + (size_t)(P + i) * V, sizeof(float) * V) != 0;
        partial += keep < K + 1;
        dsv4_spec_rollback(m, &s->step, &s->st, &s->undo, keep);
        CHECK(s->st.pos == P + keep);
        P += keep;
    }
    CHECKF(bad_lg == 0, "tiny-v41: %d kept rows' logits differ from one-at-a-time decoding", bad_lg);
    CHECKF(bad_draft == 0 && drafts > T / 4, "tiny-v41: %d of %d DSpark drafts differ", bad_draft, drafts);
    CHECKF(partial > 0, "tiny-v41: no verify step rolled back");
done:
    dsv4_session_free(s);
    free(tok);
    free(lg);
    free(dl);
    free(dc);
    free(vl);
    free(gl);
    dsv4_engine_close(e);
}

static void test_rollback_every_keep(struct test_ctx *t)
{
    rollback_every_keep(t, "tiny-a");
    rollback_every_keep(t, "tiny-b");
    rollback_every_keep_v41(t);
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
    if (dsv4_session_eval(s, prompt, n_prompt, NULL, NULL, NULL, &err)) { /* no logits to sample from */
        CHECKF(0, "prompt: %s", err.msg);
        dsv4_sampler_free(smp);
        dsv4_session_free(s);
        return -1;
    }
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
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "open %s: %s", dir, err.msg);
        return;
    }
    if (test_v41_refused_here(t, e)) {
        dsv4_engine_close(e);
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
    if (make_model(t, "tiny-v41", dir, sizeof(dir))) greedy_identity(t, dir, false); /* DSpark drafts */
    greedy_identity(t, DEMO_MODEL, true);
}

/* Top-k filtered softmax at temperature T, in double (the reference for the chi-square). */
static void filtered(const float *lg, int V, int k, double T, int *ids, double *p)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= ids[q] == i;
            if (!taken && (best < 0 || lg[i] > lg[best])) best = i;
        }
        ids[j] = best;
    }
    double sum = 0;
    for (int j = 0; j < k; j++) sum += (p[j] = exp(((double)lg[ids[j]] - (double)lg[ids[0]]) / T));
    for (int j = 0; j < k; j++) p[j] /= sum;
}

/* Sampled speculation keeps the model's distribution: on the demo model, the two tokens after
 * a fixed `next` (top-k 3, temperature 1.3), drawn 1000 times through K = 2 speculative steps,
 * against their exact probabilities from plain evaluation, by chi-square (significance 1e-4,
 * cells expected below 5 merged). Both verdicts must occur (else the test shows nothing). */
static void test_sampled_distribution(struct test_ctx *t)
{
    dsv4_engine    *e;
    struct dsv4_err err;
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (dsv4_engine_open(&e, DEMO_MODEL, &ep, &err)) {
        CHECKF(0, "open: %s", err.msg);
        return;
    }
    enum { NP = 6, K3 = 3, N = 1000 };
    const int V = dsv4_engine_model(e)->cfg.vocab_size;
    int32_t   prompt[NP] = { 200, 237, 274, 311, 348, 385 }, next = 422;
    double    T = 1.3;
    /* exact: p(a) after prompt + next, p(b | a) */
    dsv4_session *ref = new_session(t, e, 64, 64, 0);
    if (!ref) {
        dsv4_engine_close(e);
        return;
    }
    int    id1[K3], id2[K3][K3];
    double p1[K3], p2[K3][K3];
    bool ref_ok = dsv4_session_eval(ref, prompt, NP, NULL, NULL, NULL, &err) == DSV4_OK &&
                  dsv4_session_eval(ref, &next, 1, NULL, NULL, NULL, &err) == DSV4_OK;
    CHECKF(ref_ok, "reference: %s", err.msg);
    if (ref_ok) filtered(dsv4_session_logits(ref), V, K3, T, id1, p1);
    for (int a = 0; a < K3 && ref_ok; a++) {
        dsv4_session_reset(ref);
        int32_t seq[NP + 2];
        memcpy(seq, prompt, sizeof(prompt));
        seq[NP] = next, seq[NP + 1] = id1[a];
        ref_ok = dsv4_session_eval(ref, seq, NP + 2, NULL, NULL, NULL, &err) == DSV4_OK;
        CHECKF(ref_ok, "reference: %s", err.msg);
        if (ref_ok) filtered(dsv4_session_logits(ref), V, K3, T, id2[a], p2[a]);
    }
    dsv4_session_free(ref);
    if (!ref_ok) { /* no reference distribution to compare with */
        dsv4_engine_close(e);
        return;
    }
    /* sampled through speculative steps */
    dsv4_session              *s = new_session(t, e, 64, 64, 2), *base = new_session(t, e, 64, 64, 2);
    dsv4_sampler              *smp = NULL;
    struct dsv4_sampler_params sp;
    dsv4_sampler_params_default(&sp);
    sp.temperature = (float)T;
    sp.top_k       = K3;
    sp.seed        = 77;
    if (!s || !base || dsv4_sampler_create(&smp, V, &sp, &err) ||
        dsv4_session_eval(base, prompt, NP, NULL, NULL, NULL, &err)) {
        CHECKF(0, "session or sampler: %s", err.msg);
        dsv4_session_free(s);
        dsv4_session_free(base);
        dsv4_engine_close(e);
        return;
    }
    long cnt[K3][K3] = { { 0 } }, other = 0, kept = 0, steps = 0;
    for (int i = 0; i < N; i++) {
        int32_t out[8], got[2];
        int     n_out = 0, n = 0;
        dsv4_seq_state_copy(&s->st, &base->st); /* the prompt's state, without evaluating it again */
        int32_t nx = next;
        while (n < 2) {
            if (dsv4_session_spec_step(s, nx, 2, smp, out, &n_out, NULL, &err)) break;
            steps++, kept += n_out - 1;
            for (int j = 0; j < n_out && n < 2; j++) got[n++] = out[j];
            nx = out[n_out - 1];
        }
        int a = -1, b = -1;
        for (int j = 0; j < K3; j++) a = id1[j] == got[0] ? j : a;
        for (int j = 0; a >= 0 && j < K3; j++) b = id2[a][j] == got[1] ? j : b;
        if (a < 0 || b < 0) other++;
        else cnt[a][b]++;
    }
    CHECKF(other == 0, "%ld samples outside the top-3 supports", other);
    CHECKF(kept > steps / 20 && kept < 2 * steps - steps / 20, "drafts kept %ld in %ld steps: one verdict never occurs",
           kept, steps);
    /* chi-square over the 9 cells, cells expected below 5 merged into one */
    double chi = 0, e_small = 0, o_small = 0;
    int    cells = 0;
    for (int a = 0; a < K3; a++)
        for (int b = 0; b < K3; b++) {
            double ex = N * p1[a] * p2[a][b];
            if (ex < 5) {
                e_small += ex, o_small += (double)cnt[a][b];
                continue;
            }
            chi += ((double)cnt[a][b] - ex) * ((double)cnt[a][b] - ex) / ex;
            cells++;
        }
    if (e_small > 0) chi += (o_small - e_small) * (o_small - e_small) / e_small, cells++;
    static const double crit[] = { 0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83 }; /* p = 1e-4 */
    int df = cells - 1;
    CHECKF(df >= 2 && chi < crit[df], "chi-square %.2f with %d degrees of freedom (critical %.2f)", chi, df,
           df >= 1 && df <= 8 ? crit[df] : 0.0);
    printf("    chi-square %.2f, %d degrees of freedom; %ld of %ld drafts kept\n", chi, df, kept, 2 * steps);
    dsv4_sampler_free(smp);
    dsv4_session_free(s);
    dsv4_session_free(base);
    dsv4_engine_close(e);
}

const struct test_case test_group_spec[] = {
    { "rollback_every_keep", test_rollback_every_keep },
    { "greedy_identity", test_greedy_identity },
    { "sampled_distribution", test_sampled_distribution },
    { NULL, NULL },
};
