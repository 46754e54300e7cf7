/*
 * ep_serve.c - an expert rank's loop (dsv4_mpi_serve, ranks 1..N-1; ep.h has the design):
 * load this rank's experts when rank 0 opens an engine, size the buffers when rank 0 plans
 * a step, and for each MoE layer run this rank's experts on the rows rank 0 sends, sending
 * the results back, until rank 0 says QUIT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ep.h"
#include "dist/ep_proto.h"
#include "model/runtime.h"

#if DSV4_HAVE_MPI

struct worker {
    int               rank, ranks;
    bool              loaded, planned;
    struct dsv4_model m;
    struct dsv4_step  S;     /* xe, ye, row_w, grp, the routing and the experts' scratch */
    struct ep_stage   stage; /* host copies of them on a backend the host cannot read */
    int              *part;  /* [table ints] this rank's group table */
    struct dsv4_logger lg;
};

static void log_rank(void *ud, enum dsv4_log_level level, const char *msg)
{
    const struct worker *w = ud;
    if (level <= DSV4_LOG_WARN) fprintf(stderr, "dsv4 rank %d: %s\n", w->rank, msg);
}

static void answer(int rc, const struct dsv4_err *err, const struct worker *w)
{
    struct ep_status st = { .rc = rc };
    if (rc) snprintf(st.msg, sizeof(st.msg), "%.470s", err->msg);
    else if (w) /* OPEN: what this rank holds */
        st = (struct ep_status){ .exp_lo = w->m.exp_lo, .exp_hi = w->m.exp_hi, .held_bytes = ep_held_bytes(&w->m),
                                 .rss_bytes = ep_rss_bytes() };
    MPI_Gather(&st, sizeof(st), MPI_BYTE, NULL, 0, MPI_BYTE, 0, MPI_COMM_WORLD);
}

static void unload(struct worker *w)
{
    if (w->planned) dsv4_step_free(&w->S);
    if (w->loaded) ep_stage_free(&w->stage);
    if (w->loaded) dsv4_model_free(&w->m);
    free(w->part);
    w->part    = NULL;
    w->loaded  = false;
    w->planned = false;
}

static void open_part(struct worker *w, const struct ep_cmd *c)
{
    struct dsv4_err err = { 0 };
    size_t          n   = (size_t)c->arg;
    char           *blob = malloc(n + 1);
    unload(w);
    if (n) MPI_Bcast(blob ? blob : (char[1]){ 0 }, blob ? (int)n : 0, MPI_BYTE, 0, MPI_COMM_WORLD);
    int rc = DSV4_OK;
    if (!blob || n < sizeof(struct ep_open_fixed) + 3)
        rc = dsv4_err_set(&err, DSV4_ENOMEM, "out of memory, or no options from rank 0");
    else {
        blob[n] = 0;
        struct ep_open_fixed f;
        memcpy(&f, blob, sizeof(f));
        const char *dir = blob + sizeof(f), *be = dir + strlen(dir) + 1, *opts = be + strlen(be) + 1;
        struct dsv4_engine_params p;
        dsv4_engine_params_default(&p);
        p.revision     = (enum dsv4_revision)f.revision;
        p.n_threads    = f.n_threads;
        p.backend      = *be ? be : NULL;
        p.backend_opts = *opts ? opts : NULL;
        w->lg          = (struct dsv4_logger){ log_rank, w };
        rc = dsv4_model_load_part(&w->m, dir, &p, &w->lg, w->rank, f.ranks, &err);
        w->loaded = rc == DSV4_OK;
        if (w->loaded) ep_stage_init(&w->stage, &w->m);
        if (rc == DSV4_OK && !(w->part = malloc(sizeof(int) * (size_t)ep_table_ints(w->m.cfg.n_exp))))
            rc = dsv4_err_set(&err, DSV4_ENOMEM, "out of memory");
    }
    free(blob);
    answer(rc, &err, rc ? NULL : w);
}

static void plan(struct worker *w, int rows)
{
    struct dsv4_err err = { 0 };
    int             rc  = DSV4_OK;
    if (!w->loaded) rc = dsv4_err_set(&err, DSV4_EINTERNAL, "no model loaded");
    else if (!w->planned || w->S.max_rows < rows) {
        /* the new plan beside the old one: a plan that cannot be had leaves the steps of the
         * sequences already running as they were (only the asking one fails, on rank 0) */
        struct dsv4_step next;
        rc = dsv4_step_init(&next, &w->m, rows, 1, &err); /* no context: attention never runs here */
        if (rc == DSV4_OK) {
            if (w->planned) dsv4_step_free(&w->S);
            w->S       = next;
            w->planned = true;
        }
    }
    /* grows only, and separately: a failure above or here leaves the smaller plan whole */
    if (rc == DSV4_OK) rc = ep_stage_reserve(&w->stage, rows, w->ranks, &err);
    answer(rc, &err, NULL);
}

/* ROWS: this rank's table, routing weights and rows in one Scatterv (ep_rows_bytes for the n
 * pairs the header named), into the step's buffers; returns n, or -1 when it does not fit. */
static int receive_rows(struct worker *w, int R, int n)
{
    const struct ep_stage *st = &w->stage;
    struct dsv4_step      *S  = &w->S;
    int    E = w->m.cfg.n_exp, d = w->m.cfg.d_model, k = w->m.cfg.n_exp_used, TW = ep_table_ints(E);
    if (n < 0 || n > R * k) return -1;
    size_t bytes = ep_rows_bytes(E, n, d), tb = sizeof(int32_t) * (size_t)TW;
    MPI_Scatterv(NULL, NULL, NULL, MPI_BYTE, st->wire, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    memcpy(w->part, st->wire, tb);
    if (w->part[0] < 0 || w->part[0] > E || w->part[1 + E + w->part[0]] != n) return -1;
    float *hx = ep_host(st, st->xe, S->xe), *hw = ep_host(st, st->row_w, S->row_w);
    memcpy(hw, st->wire + tb, sizeof(float) * (size_t)n);
    ep_from_wire(hx, (const uint16_t *)(const void *)(st->wire + tb + sizeof(float) * (size_t)n), (size_t)n * (size_t)d);
    ep_push(st, S->xe, hx, sizeof(float) * (size_t)n * (size_t)d);
    ep_push(st, S->row_w, hw, sizeof(float) * (size_t)n);
    return n;
}

/* TOKENS: the layer's rows, ids and weights in one broadcast; this rank dispatches them
 * itself and keeps the groups of its experts (pairs [*a, *b) of the dispatch). */
static void receive_tokens(struct worker *w, int R, int *a, int *b)
{
    const struct ep_stage *st = &w->stage;
    struct dsv4_step      *S  = &w->S;
    int    E = w->m.cfg.n_exp, d = w->m.cfg.d_model, k = w->m.cfg.n_exp_used;
    size_t rd = (size_t)R * (size_t)d, nk = (size_t)R * (size_t)k;
    float *hu = ep_host(st, st->u, S->u), *hr = ep_host(st, st->rw, S->rw);
    int   *hi = ep_host(st, st->ids, S->ids);
    MPI_Bcast(st->wire, (int)(2 * rd + 8 * nk), MPI_BYTE, 0, MPI_COMM_WORLD);
    ep_from_wire(hu, (const uint16_t *)(const void *)st->wire, rd);
    memcpy(hi, st->wire + 2 * rd, sizeof(int) * nk);
    memcpy(hr, st->wire + 2 * rd + 4 * nk, sizeof(float) * nk);
    ep_push(st, S->u, hu, sizeof(float) * rd);
    ep_push(st, S->ids, hi, sizeof(int) * nk);
    ep_push(st, S->rw, hr, sizeof(float) * nk);
    S->be.ops->moe_dispatch(&S->be, R, k, E, S->ids, S->rw, S->u, d, S->xe, S->row_w, S->pair_of, S->grp);
    const int *g = ep_pull(st, st->grp, S->grp, sizeof(int) * (size_t)ep_table_ints(E));
    ep_part_of(g, E, w->m.exp_lo, w->m.exp_hi, w->part, a, b);
}

/* One MoE layer: receive, run this rank's experts, send their rows back. n: the pairs the
 * header named for this rank (ROWS). */
static int experts(struct worker *w, const struct ep_cmd *c, int n)
{
    const struct dsv4_config *cfg = &w->m.cfg;
    const struct ep_stage    *st  = &w->stage;
    struct dsv4_step         *S   = &w->S;
    int d = cfg->d_model, R = c->rows, a = 0, b = 0;
    if (!w->planned || R > S->max_rows || R > st->rows || c->layer < 0 || c->layer > cfg->n_layer) return -1;
    if (c->dispatch == DSV4_EP_ROWS) {
        if ((b = receive_rows(w, R, n)) < 0) return -1;
    } else {
        receive_tokens(w, R, &a, &b);
    }
    const struct dsv4_layer_w *L  = c->layer < cfg->n_layer ? &w->m.w.layers[c->layer] : &w->m.w.mtp;
    size_t                     at = (size_t)a * (size_t)d, nd = (size_t)(b - a) * (size_t)d;
    if (w->part[0] > 0)
        S->be.ops->experts(&S->be, L->experts, cfg->n_exp, b - a, ep_table_dev(st, w->part), S->xe + at,
                           S->row_w + a, cfg->swiglu_limit, S->ye + at, S->exp_scratch);
    const float *hy = ep_pull(st, st->ye ? st->ye + at : NULL, S->ye + at, sizeof(float) * nd);
    ep_to_wire((uint16_t *)(void *)st->wire, hy, nd);
    MPI_Gatherv(st->wire, (int)nd, MPI_UINT16_T, NULL, NULL, NULL, MPI_UINT16_T, 0, MPI_COMM_WORLD);
    return 0;
}

int dsv4_mpi_serve(void)
{
    struct worker w;
    memset(&w, 0, sizeof(w));
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.ranks);
    /* mpirun passes a SIGTERM or SIGINT on to every rank: rank 0 drains and then says QUIT,
     * which this rank must live to hear (a rank that died would end the job mid-drain) */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    /* and the signals it forwards as they are (rank 0's: SIGUSR1 promotes a standby) */
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    size_t   msg_n = ep_msg_bytes(w.ranks);
    uint8_t *msg   = malloc(msg_n);
    if (!msg) {
        fprintf(stderr, "dsv4 rank %d: out of memory\n", w.rank);
        MPI_Abort(MPI_COMM_WORLD, 4);
        return 4;
    }
    for (;;) {
        struct ep_cmd c;
        int32_t       mine;
        MPI_Bcast(msg, (int)msg_n, MPI_BYTE, 0, MPI_COMM_WORLD);
        memcpy(&c, msg, sizeof(c));
        memcpy(&mine, msg + sizeof(c) + sizeof(mine) * (size_t)w.rank, sizeof(mine));
        int bad = 0;
        switch (c.op) {
        case EP_OPEN: open_part(&w, &c); break;
        case EP_RESERVE: plan(&w, (int)c.arg); break;
        case EP_EXPERTS: bad = experts(&w, &c, mine); break;
        case EP_CLOSE: unload(&w); break;
        case EP_BANDWIDTH: {
            double gbps = w.loaded ? ep_read_bandwidth(&w.m, (size_t)c.arg, c.rows) : -1;
            MPI_Gather(&gbps, 1, MPI_DOUBLE, NULL, 0, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            break;
        }
        case EP_QUIT: unload(&w); free(msg); return 0;
        default: bad = -1;
        }
        if (bad) {
            /* rank 0 is inside a collective this rank cannot answer: only ending the job
             * frees it (a protocol bug, never bad input: the input stays on rank 0) */
            fprintf(stderr, "dsv4 rank %d: command %d (layer %d, %d rows) does not fit this rank's state\n", w.rank,
                    c.op, c.layer, c.rows);
            unload(&w);
            free(msg);
            MPI_Abort(MPI_COMM_WORLD, 3);
            return 3;
        }
    }
}

#endif
