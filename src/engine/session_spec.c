/*
 * session_spec.c - speculative decoding on a session (include/dsv4.h dsv4_session_spec_step;
 * docs/SPECULATIVE.md): the MTP block drafts, one forward step verifies, the sampler keeps a
 * prefix, and the rejected rows are undone (model/spec.c).
 *
 * One call: k draft rows (the pending MTP row with the caller's `next`, then k - 1 rows
 * chained on the MTP block's own output streams), each draft drawn by the sampler from the
 * MTP logits; then one forward of next + the k drafts with logits for every row and the undo
 * record; then dsv4_sampler_verify over the drafts in order, stopping at the first rejection
 * (whose returned token replaces the draft), or one more token sampled from the last row when
 * every draft was kept; then the rollback to the kept rows. The logits of the kept rows are
 * those of a one-token-at-a-time decode (the forward is chunk-invariant), so greedy output is
 * the same bits with and without speculation. DeepSeek-V4.1 drafts with its DSpark stages
 * instead: one block of rows after `next`, its rows chained by the Markov head (k at most the
 * block's rows).
 */
#include <string.h>

#include "engine/session.h"

/* V4's drafts: k rows of the MTP block, the pending one then chained ones, each sampled. */
static int draft_mtp(dsv4_session *s, int k, dsv4_sampler *smp, int32_t *toks, struct dsv4_err *err)
{
    const struct dsv4_model *m = &s->engine->model;
    size_t                   V = (size_t)m->cfg.vocab_size;
    int                      rc = DSV4_OK;
    for (int i = 0; i < k && rc == DSV4_OK; i++) {
        struct dsv4_fwd_seq q = { .st = &s->st, .tokens = &toks[i], .n = 1,
                                  .mtp_logits = s->draft_logits + (size_t)i * V, .draft_depth = i };
        rc = dsv4_forward_draft(m, &s->step, &q, 1, err);
        if (rc == DSV4_OK) toks[i + 1] = dsv4_sampler_sample(smp, q.mtp_logits, NULL);
    }
    return rc;
}

/* V4.1's drafts: one DSpark block (every row at once), then row by row the Markov logits of
 * the token before it and the draft sampled from the row (dspark.c). */
static int draft_dspark(dsv4_session *s, int k, dsv4_sampler *smp, int32_t *toks, struct dsv4_err *err)
{
    const struct dsv4_model *m  = &s->engine->model;
    size_t                   V  = (size_t)m->cfg.vocab_size;
    struct dsv4_fwd_seq      q  = { .st = &s->st, .tokens = toks, .n = 1, .mtp_logits = s->draft_logits };
    int                      rc = dsv4_forward_draft(m, &s->step, &q, 1, err);
    for (int i = 0; i < k && rc == DSV4_OK; i++) {
        rc = dsv4_dspark_markov(m, &s->step, &q, 1, i, &toks[i], err);
        if (rc == DSV4_OK) toks[i + 1] = dsv4_sampler_sample(smp, s->draft_logits + (size_t)i * V, NULL);
    }
    return rc;
}

int dsv4_session_dspark_rows(dsv4_session *s, int32_t next, float *logits, float *conf, struct dsv4_err *err)
{
    const struct dsv4_model *m = &s->engine->model;
    if (m->cfg.arch != DSV4_ARCH_V4_1 || !s->st.has_mtp)
        return dsv4_err_set(err, DSV4_EINVAL, "DSpark rows need a DeepSeek-V4.1 session with DSpark state (mtp)");
    size_t              V = (size_t)m->cfg.vocab_size;
    int                 B = m->cfg.v41.dspark_block;
    struct dsv4_fwd_seq q = { .st = &s->st, .tokens = &next, .n = 1, .mtp_logits = logits };
    int32_t             prev = next;
    int                 rc   = dsv4_forward_draft(m, &s->step, &q, 1, err);
    for (int i = 0; i < B && rc == DSV4_OK; i++) {
        rc = dsv4_dspark_markov(m, &s->step, &q, 1, i, &prev, err);
        const float *row  = logits + (size_t)i * V;
        size_t       best = 0; /* argmax, the lowest id on ties */
        for (size_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        prev = (int32_t)best;
    }
    return rc ? rc : dsv4_dspark_confidence(m, &s->step, 1, conf, err);
}

int dsv4_session_spec_step(dsv4_session *s, int32_t next, int k, dsv4_sampler *smp, int32_t *out, int *n_out,
                           float *logits, struct dsv4_err *err)
{
    const struct dsv4_model *m  = &s->engine->model;
    struct dsv4_seq_state   *st = &s->st;
    size_t                   V  = (size_t)m->cfg.vocab_size;
    *n_out                      = 0;
    if (!smp || !out) return dsv4_err_set(err, DSV4_EINVAL, "speculative step without a sampler or output buffer");
    if (k < 0) return dsv4_err_set(err, DSV4_EINVAL, "negative draft count %d", k);
    if (next < 0 || (size_t)next >= V)
        return dsv4_err_set(err, DSV4_ERANGE, "token id %d is outside the vocabulary [0, %zu)", next, V);
    if (st->pos + 1 > st->max_ctx)
        return dsv4_err_set(err, DSV4_ERANGE, "one more token would exceed the context of %d", st->max_ctx);
    if (k > s->spec_draft) k = s->spec_draft;
    if (k > st->max_ctx - st->pos - 1) k = st->max_ctx - st->pos - 1;
    if (m->cfg.arch == DSV4_ARCH_V4_1 && k > m->cfg.v41.dspark_block) k = m->cfg.v41.dspark_block;
    if (st->pos == 0 || !st->has_mtp) k = 0; /* no pending MTP row to draft from */
    int32_t toks[DSV4_SPEC_MAX_DRAFT + 1];
    float  *rows = k ? s->verify_logits : s->logits;
    int     rc   = DSV4_OK, kept = 0;
    toks[0]      = next;
    dsv4_alloc_guard_enter();
    if (k) rc = m->cfg.arch == DSV4_ARCH_V4_1 ? draft_dspark(s, k, smp, toks, err) : draft_mtp(s, k, smp, toks, err);
    if (rc == DSV4_OK) {
        struct dsv4_fwd_seq q = { .st = st, .tokens = toks, .n = k + 1, .n_logits = k + 1, .logits = rows,
                                  .undo = k ? &s->undo : NULL };
        rc = dsv4_forward(m, &s->step, &q, 1, err);
    }
    if (rc == DSV4_OK) {
        while (kept < k) {
            bool    accepted;
            int32_t t = dsv4_sampler_verify(smp, rows + (size_t)kept * V, s->draft_logits + (size_t)kept * V,
                                            toks[kept + 1], &accepted, NULL);
            out[(*n_out)++] = t;
            if (!accepted) break;
            kept++;
        }
        if (kept == k) out[(*n_out)++] = dsv4_sampler_sample(smp, rows + (size_t)k * V, NULL);
        if (k) dsv4_spec_rollback(m, &s->step, st, &s->undo, kept + 1);
    } else if (k && st->mtp_pos == st->pos) {
        st->mtp_pos = st->pos - 1; /* a failed verify after the pending draft: draft it again */
    }
    dsv4_alloc_guard_leave();
    if (rc) return rc;
    if (logits) memcpy(logits, rows, sizeof(float) * V * (size_t)(kept + 1));
    if (rows != s->logits) memcpy(s->logits, rows + (size_t)kept * V, sizeof(float) * V);
    s->has_logits = true;
    return DSV4_OK;
}
