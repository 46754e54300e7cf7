/*
 * forward.c - the DeepSeek-V4 forward pass over one step (docs/MODEL.md §R3.1), readable top
 * down: embed into hc streams, for each block hc_pre -> norm -> attention -> hc_post and
 * hc_pre -> norm -> MoE -> hc_post, then hc_head -> norm -> head for the rows whose logits
 * are wanted, then the MTP block (§3.11) for the positions whose next token is known.
 * DeepSeek-V4.1 (docs/MODEL.md §6) runs the same loop with its own attention sublayer
 * (attention_v41.c), Engram before the blocks that have it (engram_fwd.c), lagged mixes (S->lag:
 * each sublayer collapses with the previous one's pre mix) and a final collapse without
 * hc_head; no MTP block: its DSpark stages draft (dspark.c), fed by the rings this loop
 * writes for every position it runs.
 *
 * A step holds chunks of one or more sequences. Every sequence's state advances by its
 * chunk; checks that could fail (token ids, context room, mapped KV pages, batch size)
 * happen before any state changes, so an error leaves every sequence as it was.
 *
 * Every op computes a row independently of the other rows of the step, so a sequence's
 * results do not depend on what else is in the batch (docs/SERVING.md, determinism). The
 * head, the largest projection, runs once over the logits rows of all sequences whose
 * logits buffers follow each other in memory (the scheduler lays them out that way).
 */

#include "model/runtime.h"

static void dump_rows(struct dsv4_step *S, const char *stage, int il, const float *data, int width)
{
    if (!S->dump.fn) return;
    for (int s = 0; s < S->n_seqs; s++)
        dsv4_dump_dev(S, stage, il, s, S->seq_pos0[s], S->seq_n[s], width,
                      data + (size_t)S->seq_row0[s] * (size_t)width);
}

/* n floats from one backend buffer to another. */
static void copy_rows(const struct dsv4_model *m, float *dst, const float *src, size_t n)
{
    m->backend->copy(m->backend_impl, dst, src, sizeof(float) * n);
    dsv4_prof_xfer(m->prof, DSV4_XFER_COPY, sizeof(float) * n);
}

/* Logits computed in the backend's memory, to the caller's host buffer: the step's one
 * download and host synchronisation (counted by the profiler, prof_xfer.h). */
static void download_logits(const struct dsv4_model *m, float *dst, const float *src, size_t n)
{
    m->backend->download(m->backend_impl, dst, src, sizeof(float) * n);
    m->backend->sync(m->backend_impl);
    dsv4_prof_xfer(m->prof, DSV4_XFER_DOWNLOAD, sizeof(float) * n);
    dsv4_prof_xfer(m->prof, DSV4_XFER_SYNC, 0);
}

void dsv4_block(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state, int R,
                float **X, float **Xn)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int d = c->d_model, hc = c->hc, il = L->il;
    bool   v41 = c->arch == DSV4_ARCH_V4_1;
    float *t, *lag = v41 ? S->lag : NULL; /* V4.1: lagged mixes (docs/MODEL.md §6) */

    be->ops->hc_pre(be, R, hc, d, *X, L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, c->hc_sinkhorn_iters,
                    c->norm_eps, c->hc_eps, lag, S->u, S->post, S->comb);
    be->ops->rmsnorm(be, R, d, S->u, d, L->attn_norm, c->norm_eps, S->u, d);
    dump_rows(S, "attn_in", il, S->u, d);
    if (v41) dsv4_attention_v41(m, S, L, R);
    else dsv4_attention_sublayer(m, S, L, state, R);
    be->ops->hc_post(be, R, hc, d, S->f, *X, S->post, S->comb, *Xn);
    t = *X, *X = *Xn, *Xn = t;
    dump_rows(S, "x_attn", il, *X, hc * d);

    be->ops->hc_pre(be, R, hc, d, *X, L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, c->hc_sinkhorn_iters,
                    c->norm_eps, c->hc_eps, lag, S->u, S->post, S->comb);
    be->ops->rmsnorm(be, R, d, S->u, d, L->ffn_norm, c->norm_eps, S->u, d);
    dump_rows(S, "ffn_in", il, S->u, d);
    dsv4_moe_sublayer(m, S, L, R);
    dump_rows(S, "moe_out", il, S->f, d);
    be->ops->hc_post(be, R, hc, d, S->f, *X, S->post, S->comb, *Xn);
    t = *X, *X = *Xn, *Xn = t;
    dump_rows(S, "x_out", il, *X, hc * d);
}

/* logits[n, vocab] of n rows of streams: hc_head -> norm -> head (f32). */
static void head(const struct dsv4_model *m, struct dsv4_step *S, const float *X, int n, const float *fn,
                 const float *scale, const float *base, const uint16_t *norm, float *logits, int il, int seq, int pos)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    be->ops->hc_head(be, n, c->hc, c->d_model, X, fn, scale, base, c->norm_eps, c->hc_eps, S->hid);
    be->ops->rmsnorm(be, n, c->d_model, S->hid, c->d_model, norm, c->norm_eps, S->hid, c->d_model);
    dsv4_dump_dev(S, "final_hidden", il, seq, pos, n, c->d_model, S->hid);
    float *y = S->logits_dev ? S->logits_dev : logits;
    be->ops->linear(be, &m->w.head, n, S->hid, c->d_model, y, c->vocab_size, DSV4_ACT_NONE, DSV4_OUT_F32);
    if (S->logits_dev) download_logits(m, logits, y, (size_t)n * (size_t)c->vocab_size);
    dsv4_dump(S, "logits", il, seq, pos, n, c->vocab_size, logits);
}

/* Main-head logits of every sequence that asks for them, one head pass per run of
 * sequences whose logits buffers are contiguous (their rows gathered into S->Xm, then
 * hc_head into S->hid; collapsed (V4.1): X holds [rows, d_model] already collapsed, gathered
 * into S->hid). */
static void main_heads(const struct dsv4_model *m, struct dsv4_step *S, const float *X, bool collapsed)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    size_t V = (size_t)c->vocab_size, d = (size_t)c->d_model;
    size_t sd = collapsed ? d : (size_t)c->hc * d;
    float *gather = collapsed ? S->hid : S->Xm;
    int    s = 0;
    while (s < S->n_seqs) {
        if (!S->seqs[s].n_logits) {
            s++;
            continue;
        }
        float *out = S->seqs[s].logits, *next = out;
        int    e = s, rows = 0;
        for (; e < S->n_seqs; e++) {
            const struct dsv4_fwd_seq *q = &S->seqs[e];
            if (!q->n_logits) continue;
            if (q->logits != next) break;
            copy_rows(m, gather + (size_t)rows * sd, X + (size_t)(S->seq_row0[e] + q->n - q->n_logits) * sd,
                      sd * (size_t)q->n_logits);
            rows += q->n_logits;
            next += (size_t)q->n_logits * V;
        }
        if (!collapsed)
            be->ops->hc_head(be, rows, c->hc, c->d_model, S->Xm, m->w.hc_head_fn, m->w.hc_head_scale,
                             m->w.hc_head_base, c->norm_eps, c->hc_eps, S->hid);
        be->ops->rmsnorm(be, rows, c->d_model, S->hid, c->d_model, m->w.norm, c->norm_eps, S->hid, c->d_model);
        float *y = S->logits_dev ? S->logits_dev : out; /* the caller's buffer when it is the backend's too */
        be->ops->linear(be, &m->w.head, rows, S->hid, c->d_model, y, c->vocab_size, DSV4_ACT_NONE, DSV4_OUT_F32);
        if (S->logits_dev) download_logits(m, out, y, (size_t)rows * V);
        if (S->dump.fn)
            for (int i = s, r = 0; i < e; i++) {
                const struct dsv4_fwd_seq *q = &S->seqs[i];
                if (!q->n_logits) continue;
                int pos = S->seq_pos0[i] + q->n - q->n_logits;
                dsv4_dump_dev(S, "final_hidden", -1, i, pos, q->n_logits, c->d_model, S->hid + (size_t)r * d);
                dsv4_dump(S, "logits", -1, i, pos, q->n_logits, c->vocab_size, q->logits);
                r += q->n_logits;
            }
        s = e;
    }
}

/* The MTP block over Rm rows whose input streams are in S->Xm, tokens (the token after each
 * row's position) in S->tok and positions in S->pos, grouped per sequence by S->seq_*:
 * e = enorm(embed[next]); h = hnorm(streams); X = bf16(h_proj(h) + e_proj(e)), then the
 * block. Returns the buffer holding the block's output streams (S->Xm or Xtmp). */
static float *mtp_rows(const struct dsv4_model *m, struct dsv4_step *S, int Rm, float *Xtmp)
{
    const struct dsv4_config *c  = &m->cfg;
    const struct dsv4_layer_w *L = &m->w.mtp;
    struct dsv4_backend      *be = &S->be;
    int d = c->d_model;
    be->ops->embed(be, Rm, S->tok, m->w.embed, d, 1, S->u);
    be->ops->rmsnorm(be, Rm, d, S->u, d, L->enorm, c->norm_eps, S->u, d);
    dump_rows(S, "embed", c->n_layer, S->u, d);
    be->ops->rmsnorm(be, Rm * c->hc, d, S->Xm, d, L->hnorm, c->norm_eps, Xtmp, d);
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &L->e_proj, Rm, S->u, d, S->f, d, act, DSV4_OUT_BF16);
    be->ops->linear(be, &L->h_proj, Rm * c->hc, Xtmp, d, S->Xm, d, act, DSV4_OUT_BF16);
    be->ops->add_streams(be, Rm, c->hc, d, S->f, S->Xm);
    dump_rows(S, "x_in", c->n_layer, S->Xm, c->hc * d);
    float *X = S->Xm, *Xn = Xtmp;
    dsv4_block(m, S, L, c->n_layer, Rm, &X, &Xn);
    return X;
}

/* MTP logits of sequence s's rows of X (the MTP block's output streams). */
static void mtp_head(const struct dsv4_model *m, struct dsv4_step *S, const float *X, int s, float *logits)
{
    const struct dsv4_config *c  = &m->cfg;
    const struct dsv4_layer_w *L = &m->w.mtp;
    size_t sd = (size_t)c->hc * (size_t)c->d_model;
    head(m, S, X + (size_t)S->seq_row0[s] * sd, S->seq_n[s], L->hc_head_fn, L->hc_head_scale, L->hc_head_base,
         L->mtp_norm, logits, c->n_layer, s, S->seq_pos0[s]);
}

/* The MTP block for every sequence that carries MTP state, for the positions from
 * st->mtp_pos whose next token this step knows (up to p0 + n - 2); a position before the
 * chunk (the pending one) takes st->mtp_x. Xf: main final streams. */
static void mtp_step(const struct dsv4_model *m, struct dsv4_step *S, float *Xf, float *Xtmp)
{
    const struct dsv4_config *c = &m->cfg;
    size_t sd = (size_t)c->hc * (size_t)c->d_model;
    int    Rm = 0;
    for (int s = 0; s < S->n_seqs; s++) {
        struct dsv4_fwd_seq *q  = &S->seqs[s];
        struct dsv4_seq_state *st = q->st;
        q->n_mtp = 0;
        if (!st->has_mtp) {
            S->seq_n[s] = 0;
            continue;
        }
        int r0 = S->seq_row0[s], n = S->seq_n[s], p0 = S->seq_pos0[s];
        int first = st->mtp_pos, cnt = 0;
        DSV4_ASSERT(first == (p0 > 0 ? p0 - 1 : 0) || first == p0);
        for (int p = first; p <= p0 + n - 2; p++, cnt++) {
            const float *src = p < p0 ? st->mtp_x : Xf + (size_t)(r0 + p - p0) * sd;
            copy_rows(m, S->Xm + (size_t)(Rm + cnt) * sd, src, sd);
            S->pos[Rm + cnt] = p;
            S->tok[Rm + cnt] = q->tokens[p - p0 + 1];
        }
        copy_rows(m, st->mtp_x, Xf + (size_t)(r0 + n - 1) * sd, sd); /* pending: next chunk's first */
        st->mtp_pos    = p0 + n - 1;
        S->seq_row0[s] = Rm;
        S->seq_n[s]    = cnt;
        S->seq_pos0[s] = first;
        q->n_mtp       = cnt;
        Rm += cnt;
    }
    if (Rm == 0) return;
    dsv4_step_describe(S, Rm); /* the MTP rows are a step of their own */
    float *X = mtp_rows(m, S, Rm, Xtmp);
    for (int s = 0; s < S->n_seqs; s++) {
        /* the block ran for every MTP row so that the state stays whole; the head only if asked */
        if (S->seq_n[s] && S->seqs[s].mtp_logits) mtp_head(m, S, X, s, S->seqs[s].mtp_logits);
    }
}

int dsv4_forward_draft(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                       struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    size_t sd = (size_t)c->hc * (size_t)c->d_model;
    if (c->arch == DSV4_ARCH_V4_1) return dsv4_forward_dspark(m, S, seqs, n_seqs, err);
    if (!m->w.has_mtp) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this checkpoint has no MTP block");
    if (n_seqs > S->max_rows) return dsv4_err_set(err, DSV4_EINVAL, "%d draft rows exceed the planned %d", n_seqs, S->max_rows);
    for (int s = 0; s < n_seqs; s++) {
        const struct dsv4_fwd_seq *q = &seqs[s];
        int p = q->st->mtp_pos + (q->draft_depth > 0 ? q->draft_depth - 1 : 0);
        if (!q->st->has_mtp) return dsv4_err_set(err, DSV4_EINVAL, "a draft row for a sequence without MTP state");
        if (q->n != 1 || q->draft_depth < 0 || !q->mtp_logits)
            return dsv4_err_set(err, DSV4_EINVAL, "a draft row is one token with MTP logits");
        if (q->draft_depth == 0 && q->st->mtp_pos != q->st->pos - 1)
            return dsv4_err_set(err, DSV4_EINVAL, "no pending MTP row at position %d", q->st->pos - 1);
        if (p + 1 >= q->st->max_ctx)
            return dsv4_err_set(err, DSV4_ERANGE, "a draft at position %d exceeds the context of %d tokens", p + 1,
                                q->st->max_ctx);
        if (q->tokens[0] < 0 || q->tokens[0] >= c->vocab_size)
            return dsv4_err_set(err, DSV4_ERANGE, "token id %d is outside the vocabulary [0, %d)", q->tokens[0],
                                c->vocab_size);
        for (int o = 0; o < s; o++)
            if (seqs[o].st == q->st) return dsv4_err_set(err, DSV4_EINVAL, "one sequence twice in a step");
    }
    int rc = dsv4_step_check_layout(seqs, n_seqs, err);
    if (rc) return rc;
    S->seqs   = seqs;
    S->n_seqs = n_seqs;
    dsv4_prof_begin(S->be.prof, "draft");
    for (int s = 0; s < n_seqs; s++) {
        struct dsv4_seq_state *st = seqs[s].st;
        int                    d  = seqs[s].draft_depth;
        copy_rows(m, S->Xm + (size_t)s * sd, d == 0 ? st->mtp_x : st->mtp_h, sd);
        S->pos[s]      = st->mtp_pos + (d > 0 ? d - 1 : 0);
        S->tok[s]      = seqs[s].tokens[0];
        S->seq_row0[s] = s;
        S->seq_n[s]    = 1;
        S->seq_pos0[s] = S->pos[s];
    }
    dsv4_step_describe(S, n_seqs);
    float *X = mtp_rows(m, S, n_seqs, S->Xn);
    for (int s = 0; s < n_seqs; s++) {
        struct dsv4_fwd_seq *q = &seqs[s];
        copy_rows(m, q->st->mtp_h, X + (size_t)s * sd, sd);
        mtp_head(m, S, X, s, q->mtp_logits);
        q->n_mtp = 1;
        if (q->draft_depth == 0) q->st->mtp_pos++;
    }
    dsv4_prof_end(S->be.prof);
    return m->backend->error ? m->backend->error(m->backend_impl, err) : DSV4_OK;
}

/* What a V4.1 step refuses before anything changes: a backend whose memory the host cannot
 * write (the lag and the Engram history are host-written), V4's MTP rows (V4.1 drafts with
 * dsv4_forward_draft), DSpark state without DSpark stages, tokens the Engram map lacks. */
static int check_v41(const struct dsv4_model *m, const struct dsv4_fwd_seq *seqs, int n_seqs, struct dsv4_err *err)
{
    if (!m->backend->host_visible)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "DeepSeek-V4.1 runs on the CPU backend only so far (issue 41)");
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s].mtp_logits)
            return dsv4_err_set(err, DSV4_EINVAL, "DeepSeek-V4.1 has no MTP rows: its DSpark stages draft "
                                                  "(dsv4_forward_draft)");
        if (seqs[s].st->has_mtp && !m->w.has_mtp)
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this checkpoint has no DSpark stages");
    }
    return dsv4_engram_check(m, seqs, n_seqs, err);
}

void dsv4_v41_identity_lag(const struct dsv4_model *m, struct dsv4_step *S, int R)
{
    int hc = m->cfg.hc;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < hc; j++) S->lag[(size_t)r * (size_t)hc + (size_t)j] = j == 0 ? 1.0f : 0.0f;
}

/* The main layers: V4.1's Engram before the blocks that have it, and the DSpark input taken
 * at the entry of its target layers (after Engram, before the block). */
static float *main_layers(const struct dsv4_model *m, struct dsv4_step *S, int R, bool dspark)
{
    const struct dsv4_config *c = &m->cfg;
    float *X = S->X, *Xn = S->Xn;
    if (c->arch == DSV4_ARCH_V4_1) { /* every row's first mix collapses onto stream 0 */
        dsv4_v41_identity_lag(m, S, R);
        dsv4_engram_hash_step(m, S);
    }
    for (int il = 0; il < c->n_layer; il++) {
        const struct dsv4_layer_w *L = &m->w.layers[il];
        if (L->kind.engram) {
            dsv4_engram_layer(m, S, L, R, X);
            dump_rows(S, "x_engram", il, X, c->hc * c->d_model);
        }
        if (dspark) dsv4_dspark_capture(m, S, il, R, X);
        dsv4_block(m, S, L, il, R, &X, &Xn);
    }
    return X;
}

int dsv4_forward(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_fwd_seq *seqs, int n_seqs,
                 struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    int R = 0;
    for (int s = 0; s < n_seqs; s++) {
        struct dsv4_fwd_seq *q = &seqs[s];
        if (q->n < 1) return dsv4_err_set(err, DSV4_EINVAL, "empty chunk");
        if (q->n_logits < 0 || q->n_logits > q->n) return dsv4_err_set(err, DSV4_EINVAL, "bad logits row count");
        if (q->st->pos + q->n > q->st->max_ctx)
            return dsv4_err_set(err, DSV4_ERANGE, "%d tokens at position %d exceed the context of %d tokens", q->n,
                                q->st->pos, q->st->max_ctx);
        if (q->st->max_ctx > S->max_ctx)
            return dsv4_err_set(err, DSV4_EINVAL, "sequence context %d exceeds the step's planned %d", q->st->max_ctx,
                                S->max_ctx);
        if (!dsv4_kv_mapped(q->st, q->st->pos, q->st->pos + q->n))
            return dsv4_err_set(err, DSV4_EINVAL, "no KV page mapped for positions %d..%d", q->st->pos,
                                q->st->pos + q->n - 1);
        for (int o = 0; o < s; o++)
            if (seqs[o].st == q->st) return dsv4_err_set(err, DSV4_EINVAL, "one sequence twice in a step");
        if (q->undo && q->n > q->undo->n_max)
            return dsv4_err_set(err, DSV4_EINVAL, "a verify chunk of %d rows exceeds its undo buffer's %d", q->n,
                                q->undo->n_max);
        for (int t = 0; t < q->n; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= c->vocab_size)
                return dsv4_err_set(err, DSV4_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)",
                                    q->tokens[t], t, c->vocab_size);
        R += q->n;
    }
    if (R > S->max_rows || n_seqs > S->max_rows)
        return dsv4_err_set(err, DSV4_EINVAL, "step of %d rows exceeds the planned %d", R, S->max_rows);
    int rc = dsv4_step_check_layout(seqs, n_seqs, err);
    if (rc == DSV4_OK && c->arch == DSV4_ARCH_V4_1) rc = check_v41(m, seqs, n_seqs, err);
    if (rc) return rc;

    S->seqs   = seqs;
    S->n_seqs = n_seqs;
    dsv4_prof_begin(S->be.prof, "step");
    dsv4_prof_begin(S->be.prof, "embed");
    int r = 0;
    for (int s = 0; s < n_seqs; s++) {
        struct dsv4_fwd_seq *q = &seqs[s];
        S->seq_row0[s] = r;
        S->seq_n[s]    = q->n;
        S->seq_pos0[s] = q->st->pos;
        if (q->undo) q->undo->p0 = q->st->pos, q->undo->n = q->n;
        for (int t = 0; t < q->n; t++, r++) {
            S->pos[r] = q->st->pos + t;
            S->tok[r] = q->tokens[t];
        }
    }
    dsv4_step_describe(S, R);
    S->be.ops->embed(&S->be, R, S->tok, m->w.embed, c->d_model, c->hc, S->X);
    dsv4_prof_end(S->be.prof);
    bool   dspark = c->arch == DSV4_ARCH_V4_1 && dsv4_dspark_wanted(S);
    float *X = main_layers(m, S, R, dspark), *Xn = X == S->X ? S->Xn : S->X;
    if (c->arch == DSV4_ARCH_V4_1) { /* the final collapse with the last FFN's mix: no hc_head */
        S->be.ops->hc_pre(&S->be, R, c->hc, c->d_model, X, NULL, NULL, NULL, 0, c->norm_eps, c->hc_eps, S->lag, S->u,
                          NULL, NULL);
        main_heads(m, S, S->u, true);
        if (dspark) dsv4_dspark_rings(m, S, R); /* the DSpark stages' rings of these positions */
    } else {
        main_heads(m, S, X, false);
    }
    for (int s = 0; s < n_seqs; s++) /* a verify chunk's final streams: MTP's input after a rollback */
        if (seqs[s].undo && seqs[s].st->has_mtp && c->arch == DSV4_ARCH_V4)
            copy_rows(m, seqs[s].undo->xf, X + (size_t)S->seq_row0[s] * (size_t)c->hc * (size_t)c->d_model,
                      (size_t)seqs[s].n * (size_t)c->hc * (size_t)c->d_model);
    if (m->w.has_mtp && c->arch == DSV4_ARCH_V4) mtp_step(m, S, X, Xn);
    dsv4_prof_end(S->be.prof);
    rc = m->backend->error ? m->backend->error(m->backend_impl, err) : DSV4_OK;
    if (rc) return rc; /* the step's results are not to be trusted: its positions stay */
    for (int s = 0; s < n_seqs; s++) seqs[s].st->pos += seqs[s].n;
    return DSV4_OK;
}
