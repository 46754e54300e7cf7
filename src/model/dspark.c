/*
 * dspark.c - DeepSeek-V4.1's DSpark drafting (docs/SPECULATIVE.md "DeepSeek-V4.1 DSpark";
 * semantics tools/ref/model_v41.py `seed_rings`, `draft`, `dspark_head`, after the official
 * `forward_spec`, `DSparkBlock`, `DSparkMarkovHead`, `DSparkConfidenceHead`).
 *
 * The main forward feeds the stages: at the entry of each target layer (after Engram) the mean
 * of the hc streams, concatenated over the targets, is a position's DSpark input; main_x =
 * main_norm(main_proj(it)) and each stage's ring keeps kv_norm(wkv(main_x)) with RoPE at the
 * position, FP8-simulated, as a window ring. A ring row depends on its position's main rows
 * only, so the forward writes it for every row it runs, verify chunks included: a rejected
 * row sits at a ring slot no later draft reads (kv.h: the rings are DSV4_SPEC_MAX_DRAFT rows
 * longer than the window) and is rewritten when its position is verified again.
 *
 * A draft after position t = pos - 1, with the token at pos known: the block [token, noise x
 * (B - 1)] at positions pos .. pos + B - 1, embedded into hc streams, runs through the stages
 * as V4.1 blocks whose attention reads the ring (t - window + 1 .. t) and every block row (not
 * causal; attention.c), each stage's experts its own (moe.c). The head collapses with the last
 * mix (no hc_head), normalises with the last stage's norm and projects with the main head.
 * The Markov head adds, per row, the logits of the token before it (a low-rank embedding and
 * head); the confidence head scores [collapsed row, that embedding].
 */
#include <string.h>

#include "model/runtime.h"

static const struct dsv4_layer_w *last_stage(const struct dsv4_model *m)
{
    return &m->w.dspark[m->cfg.n_mtp - 1];
}

bool dsv4_dspark_wanted(const struct dsv4_step *S)
{
    for (int s = 0; s < S->n_seqs; s++)
        if (S->seqs[s].st->has_mtp) return true;
    return false;
}

void dsv4_dspark_capture(const struct dsv4_model *m, struct dsv4_step *S, int il, int R, const float *X)
{
    const struct dsv4_config     *c = &m->cfg;
    const struct dsv4_v41_config *v = &c->v41;
    int t = 0, hc = c->hc;
    while (t < v->n_dspark_target && v->dspark_target[t] != il) t++;
    if (t == v->n_dspark_target) return;
    size_t d = (size_t)c->d_model, width = (size_t)v->n_dspark_target * d;
    /* the mean as a collapse with weights 1 / hc (exact for hc a power of two: hc = 4 in
     * every V4.1 config), rounded to bf16 as the official bf16 mean is */
    for (int i = 0; i < R * hc; i++) S->mmix[i] = 1.0f / (float)hc;
    S->be.ops->hc_pre(&S->be, R, hc, c->d_model, X, NULL, NULL, NULL, 0, c->norm_eps, c->hc_eps, S->mmix, S->f, NULL,
                      NULL);
    for (int r = 0; r < R; r++)
        m->backend->copy(m->backend_impl, S->mh + (size_t)r * width + (size_t)t * d, S->f + (size_t)r * d,
                         sizeof(float) * d);
}

void dsv4_dspark_rings(const struct dsv4_model *m, struct dsv4_step *S, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    const struct dsv4_layer_w *D0 = &m->w.dspark[0];
    int d = c->d_model, width = c->v41.n_dspark_target * d;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    /* only the sequences with DSpark state store: the others' slots have no stage rings */
    for (int s = 0; s < S->n_seqs; s++)
        if (!S->seqs[s].st->has_mtp) S->seq_n[s] = 0;
    dsv4_step_describe(S, R);
    be->ops->linear(be, &D0->main_proj, R, S->mh, width, S->u, d, act, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, R, d, S->u, d, D0->main_norm, c->norm_eps, S->u, d);
    const struct dsv4_seq_state *st = dsv4_layout_seq(S);
    for (int i = 0; i < c->n_mtp; i++) {
        const struct dsv4_layer_w *L = &m->w.dspark[i];
        dsv4_v41_window_kv(m, S, L, R);
        struct dsv4_store_dst ring = { .to = DSV4_STORE_RING, .off = dsv4_kv_slot_off(st, st->layers[L->il].ring),
                                       .window = L->kind.window, .ring_rows = st->ring_rows,
                                       .row_bytes = st->row_bytes };
        be->ops->store_rows(be, &S->desc, st->fmt, c->d_head, c->d_rope, S->kv, c->d_head, &ring);
    }
}

/* Checks a draft step before anything runs. */
static int check_draft(const struct dsv4_model *m, const struct dsv4_step *S, const struct dsv4_fwd_seq *seqs,
                       int n_seqs, struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    int B = c->v41.dspark_block;
    if (!m->w.has_mtp) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this checkpoint has no DSpark stages");
    if (!m->backend->host_visible)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "DeepSeek-V4.1 runs on the CPU backend only so far (issue 41)");
    if (n_seqs < 1 || n_seqs * B > S->max_rows)
        return dsv4_err_set(err, DSV4_EINVAL, "%d draft blocks of %d rows exceed the planned %d rows", n_seqs, B,
                            S->max_rows);
    for (int s = 0; s < n_seqs; s++) {
        const struct dsv4_fwd_seq *q = &seqs[s];
        if (!q->st->has_mtp) return dsv4_err_set(err, DSV4_EINVAL, "a draft for a sequence without DSpark state");
        if (q->n != 1 || !q->mtp_logits)
            return dsv4_err_set(err, DSV4_EINVAL, "a DSpark draft takes one token and logits for %d rows", B);
        if (q->st->pos < 1) return dsv4_err_set(err, DSV4_EINVAL, "a DSpark draft follows at least one position");
        if (q->tokens[0] < 0 || q->tokens[0] >= c->vocab_size)
            return dsv4_err_set(err, DSV4_ERANGE, "token id %d is outside the vocabulary [0, %d)", q->tokens[0],
                                c->vocab_size);
        for (int o = 0; o < s; o++)
            if (seqs[o].st == q->st) return dsv4_err_set(err, DSV4_EINVAL, "one sequence twice in a step");
    }
    return dsv4_step_check_layout(seqs, n_seqs, err);
}

/* The head of the draft rows: y = the collapse with the last mix (kept in S->dconf for the
 * confidence), then each sequence's logits. */
static void draft_head(const struct dsv4_model *m, struct dsv4_step *S, const float *X, int R)
{
    const struct dsv4_config  *c  = &m->cfg;
    struct dsv4_backend       *be = &S->be;
    const struct dsv4_layer_w *L  = last_stage(m);
    size_t d = (size_t)c->d_model, ld = d + (size_t)c->v41.dspark_markov_rank;
    be->ops->hc_pre(be, R, c->hc, c->d_model, X, NULL, NULL, NULL, 0, c->norm_eps, c->hc_eps, S->lag, S->u, NULL,
                    NULL);
    for (int r = 0; r < R; r++)
        m->backend->copy(m->backend_impl, S->dconf + (size_t)r * ld, S->u + (size_t)r * d, sizeof(float) * d);
    be->ops->rmsnorm(be, R, c->d_model, S->u, c->d_model, L->mtp_norm, c->norm_eps, S->hid, c->d_model);
    for (int s = 0; s < S->n_seqs; s++) {
        struct dsv4_fwd_seq *q = &S->seqs[s];
        be->ops->linear(be, &m->w.head, S->seq_n[s], S->hid + (size_t)S->seq_row0[s] * d, c->d_model, q->mtp_logits,
                        c->vocab_size, DSV4_ACT_NONE, DSV4_OUT_F32);
        dsv4_dump(S, "dspark_logits", c->n_layer, s, S->seq_pos0[s], S->seq_n[s], c->vocab_size, q->mtp_logits);
        q->n_mtp = S->seq_n[s];
    }
}

int dsv4_forward_dspark(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                        struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    int B = c->v41.dspark_block, R = n_seqs * B;
    int rc = check_draft(m, S, seqs, n_seqs, err);
    if (rc) return rc;
    S->seqs   = seqs;
    S->n_seqs = n_seqs;
    dsv4_prof_begin(S->be.prof, "draft");
    for (int s = 0; s < n_seqs; s++) {
        int P = seqs[s].st->pos;
        for (int i = 0; i < B; i++) {
            S->pos[s * B + i] = P + i;
            S->tok[s * B + i] = i ? c->v41.dspark_noise_id : seqs[s].tokens[0];
        }
        S->seq_row0[s] = s * B;
        S->seq_n[s]    = B;
        S->seq_pos0[s] = P;
    }
    dsv4_step_describe(S, R);
    S->be.ops->embed(&S->be, R, S->tok, m->w.embed, c->d_model, c->hc, S->X);
    dsv4_v41_identity_lag(m, S, R);
    float *X = S->X, *Xn = S->Xn;
    for (int i = 0; i < c->n_mtp; i++) dsv4_block(m, S, &m->w.dspark[i], c->n_layer + i, R, &X, &Xn);
    draft_head(m, S, X, R);
    dsv4_prof_end(S->be.prof);
    return m->backend->error ? m->backend->error(m->backend_impl, err) : DSV4_OK;
}

int dsv4_dspark_markov(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs, int i,
                       const int32_t *prev, struct dsv4_err *err)
{
    const struct dsv4_config  *c  = &m->cfg;
    struct dsv4_backend       *be = &S->be;
    const struct dsv4_layer_w *L  = last_stage(m);
    int    B = c->v41.dspark_block, rank = c->v41.dspark_markov_rank;
    size_t V = (size_t)c->vocab_size, d = (size_t)c->d_model, ld = d + (size_t)rank;
    if (i < 0 || i >= B) return dsv4_err_set(err, DSV4_EINVAL, "Markov round %d of a %d-row draft", i, B);
    if (n_seqs < 1 || n_seqs > S->max_rows / B)
        return dsv4_err_set(err, DSV4_EINVAL, "%d sequences in a Markov round", n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        if (prev[s] < 0 || prev[s] >= c->vocab_size)
            return dsv4_err_set(err, DSV4_ERANGE, "token id %d is outside the vocabulary [0, %d)", prev[s],
                                c->vocab_size);
        S->tok[s] = prev[s];
    }
    be->ops->embed(be, n_seqs, S->tok, L->markov_embed, rank, 1, S->f);
    be->ops->linear(be, &L->markov_head, n_seqs, S->f, rank, S->mbias, c->vocab_size, DSV4_ACT_NONE, DSV4_OUT_F32);
    int rc = m->backend->error ? m->backend->error(m->backend_impl, err) : DSV4_OK;
    if (rc) return rc;
    for (int s = 0; s < n_seqs; s++) { /* host memory (check_draft): f32 adds, as the reference */
        float       *row  = seqs[s].mtp_logits + (size_t)i * V;
        const float *bias = S->mbias + (size_t)s * V;
        for (size_t v = 0; v < V; v++) row[v] += bias[v];
        m->backend->copy(m->backend_impl, S->dconf + (size_t)(s * B + i) * ld + d, S->f + (size_t)s * (size_t)rank,
                         sizeof(float) * (size_t)rank);
    }
    return DSV4_OK;
}

int dsv4_dspark_confidence(const struct dsv4_model *m, struct dsv4_step *S, int n_seqs, float *conf,
                           struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    int B = c->v41.dspark_block, R = n_seqs * B, ld = c->d_model + c->v41.dspark_markov_rank;
    if (n_seqs < 1 || R > S->max_rows) return dsv4_err_set(err, DSV4_EINVAL, "%d sequences' confidence", n_seqs);
    S->be.ops->linear(&S->be, &last_stage(m)->confidence, R, S->dconf, ld, S->conf, 1, DSV4_ACT_NONE, DSV4_OUT_F32);
    int rc = m->backend->error ? m->backend->error(m->backend_impl, err) : DSV4_OK;
    if (rc == DSV4_OK) memcpy(conf, S->conf, sizeof(float) * (size_t)R);
    return rc;
}
