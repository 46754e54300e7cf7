/*
 * ep.c - expert parallelism, rank 0's side: MPI start and finish, the OPEN of every rank's
 * part, and a MoE layer's routed experts sent out and gathered back (ep.h has the design;
 * ep_serve.c is the other ranks' loop). Built without MPI (DSV4_HAVE_MPI 0), one process is
 * all there is and --ep above 1 is refused.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/ep.h"
#include "dist/ep_proto.h"
#include "model/rank_plan.h"
#include "model/runtime.h"

int64_t ep_rss_bytes(void)
{
    long long pages = 0, rss = 0;
    FILE     *f     = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (int64_t)rss * (int64_t)sysconf(_SC_PAGESIZE);
}

int64_t ep_held_bytes(const struct dsv4_model *m)
{
    int64_t n = 0;
    for (size_t i = 0; i < m->ck.n_tensors; i++)
        if (dsv4_model_holds(m, &m->ck.tensors[i])) n += (int64_t)m->ck.tensors[i].nbytes;
    return n;
}

double ep_read_bandwidth(const struct dsv4_model *m, size_t bytes, int reps)
{
    const struct dsv4_backend_kind *k = m->backend;
    if (!k->read_bandwidth || !k->alloc) return -1;
    void *buf = k->alloc(m->backend_impl, bytes, DSV4_MEM_ACT);
    if (!buf) return -1;
    double gbps = k->read_bandwidth(m->backend_impl, buf, bytes, reps);
    k->free(m->backend_impl, buf, bytes);
    return gbps;
}

#if DSV4_HAVE_MPI

static struct {
    pthread_mutex_t lock; /* MPI_THREAD_SERIALIZED: one engine call at a time talks to the ranks */
    bool on;           /* MPI_Init_thread ran */
    int  rank, ranks;
    bool attached;     /* an engine of this process uses the other ranks */
} g_mpi = { PTHREAD_MUTEX_INITIALIZER, false, 0, 1, false };

/* Around every exchange with the other ranks: one thread at a time (two sessions stepping on
 * two threads would interleave their collectives), and outside the allocation guard of a
 * step (the MPI library allocates for its own needs; DEBUG builds check the engine's). */
static void ep_lock(void)
{
    pthread_mutex_lock(&g_mpi.lock);
    dsv4_alloc_guard_exempt(true);
}

static void ep_unlock(void)
{
    dsv4_alloc_guard_exempt(false);
    pthread_mutex_unlock(&g_mpi.lock);
}

struct dsv4_ep {
    int                  ranks, n_exp, d, k;
    enum dsv4_ep_dispatch how;
    double               limit;           /* the routed experts' SwiGLU clamp */
    int                 *lo, *hi;         /* [ranks] expert ranges */
    int                 *tables;          /* [ranks, table ints] each rank's group table */
    int                 *rows, *row0;     /* [ranks] pairs and first pair */
    int                 *cnt, *displ;     /* [ranks] the same in values of rows (x d) */
    int                 *bcnt, *boff;     /* [ranks] ROWS payload bytes and offsets in the wire */
    struct ep_stage      stage;           /* host copies on a backend the host cannot read */
    struct dsv4_ep_stats st;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A command to every rank (ep_proto.h: the header and one int32 per rank, zero unless
 * given); the message is ep_msg_bytes(ranks) on every rank. */
static void send_cmd(struct ep_cmd c, const int *per_rank)
{
    size_t   n = ep_msg_bytes(g_mpi.ranks);
    uint8_t  small[256], *msg = n <= sizeof(small) ? small : calloc(1, n);
    if (!msg) MPI_Abort(MPI_COMM_WORLD, 4); /* the other ranks wait for this message: no way back */
    memset(msg, 0, n);
    memcpy(msg, &c, sizeof(c));
    for (int r = 0; per_rank && r < g_mpi.ranks; r++) {
        int32_t v = per_rank[r];
        memcpy(msg + sizeof(c) + sizeof(v) * (size_t)r, &v, sizeof(v));
    }
    MPI_Bcast(msg, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (msg != small) free(msg);
}

int dsv4_mpi_start(int *argc, char ***argv)
{
    /* only under a launcher: a plain run never touches MPI (valgrind, sanitizers) */
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK")) return 0;
    int      provided = 0, ok;
    sigset_t all, old;
    /* the MPI library's own threads start here: with every signal blocked they inherit the
     * mask, so a SIGTERM for rank 0's drain reaches the thread that waits for it */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    ok = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!ok) return 0;
    g_mpi.on = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_mpi.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_mpi.ranks);
    /* the forward runs on one thread at a time (the scheduler's, or the caller's): SERIALIZED
     * is enough; a library that gives less cannot be trusted with it */
    if (provided < MPI_THREAD_SERIALIZED && g_mpi.ranks > 1) {
        fprintf(stderr, "dsv4: this MPI library gives thread level %d, expert parallelism needs MPI_THREAD_SERIALIZED\n",
                provided);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return g_mpi.rank;
}

int dsv4_mpi_ranks(void)
{
    return g_mpi.ranks;
}

void dsv4_mpi_finish(void)
{
    if (!g_mpi.on) return;
    if (g_mpi.rank == 0 && g_mpi.ranks > 1) {
        struct ep_cmd c = { .op = EP_QUIT };
        ep_lock();
        send_cmd(c, NULL);
        ep_unlock();
    }
    MPI_Finalize();
    g_mpi.on = false;
}

int dsv4_ep_ranks_for(const struct dsv4_engine_params *p, int *ranks, struct dsv4_err *err)
{
    int want = p->ep > 1 ? p->ep : 1, have = g_mpi.ranks;
    *ranks   = 1;
    if (want == 1 && have == 1) return DSV4_OK;
    if (g_mpi.rank != 0) return dsv4_err_set(err, DSV4_EINVAL, "an engine opens on MPI rank 0 only");
    if (want != have)
        return dsv4_err_set(err, DSV4_EINVAL,
                            have == 1 ? "--ep %d, but this process is not one of %d MPI ranks (start it with mpirun -np %d)"
                                      : "--ep %d, but mpirun started %d ranks (give --ep with the same count)",
                            want, want == 1 ? have : (have == 1 ? want : have), want);
    if (p->ep_dispatch != DSV4_EP_ROWS && p->ep_dispatch != DSV4_EP_TOKENS)
        return dsv4_err_set(err, DSV4_EINVAL, "unknown expert dispatch %d", (int)p->ep_dispatch);
    *ranks = have;
    return DSV4_OK;
}

/* OPEN to every rank: the options, the directory; they load while rank 0 does. The ranks are
 * this engine's until dsv4_ep_attach answers (the lock is held until then). */
int dsv4_ep_announce(const char *dir, const struct dsv4_engine_params *p, int ranks, struct dsv4_err *err)
{
    ep_lock();
    if (g_mpi.attached) {
        ep_unlock();
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "one engine at a time uses the MPI ranks");
    }
    g_mpi.attached = true;
    const char *be = p->backend ? p->backend : "", *opts = p->backend_opts ? p->backend_opts : "";
    size_t      ld = strlen(dir) + 1, lb = strlen(be) + 1, lo = strlen(opts) + 1;
    struct ep_open_fixed f = { (int32_t)p->revision, p->n_threads, ranks, 0 };
    size_t      n = sizeof(f) + ld + lb + lo;
    char       *blob = malloc(n);
    struct ep_cmd c = { .op = EP_OPEN, .arg = blob ? (int64_t)n : 0 };
    send_cmd(c, NULL);
    if (!blob) return DSV4_OK; /* the ranks see an empty blob and fail their OPEN: attach says so */
    memcpy(blob, &f, sizeof(f));
    memcpy(blob + sizeof(f), dir, ld);
    memcpy(blob + sizeof(f) + ld, be, lb);
    memcpy(blob + sizeof(f) + ld + lb, opts, lo);
    MPI_Bcast(blob, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    free(blob);
    return DSV4_OK;
}

/* Every rank's status for the last OPEN or RESERVE (*all, when asked, keeps them; rank 0's
 * is mine, own its error); the first failure becomes err. */
static int gather_status(int ranks, struct ep_status *mine, const struct dsv4_err *own, struct ep_status **keep,
                         struct dsv4_err *err)
{
    struct ep_status *all = calloc((size_t)ranks, sizeof(*all));
    if (mine->rc && own) snprintf(mine->msg, sizeof(mine->msg), "%.470s", own->msg);
    MPI_Gather(mine, sizeof(*mine), MPI_BYTE, all, all ? (int)sizeof(*mine) : 0, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (!all) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the ranks' answers");
    int rc = DSV4_OK;
    for (int r = 0; r < ranks && rc == DSV4_OK; r++)
        if (all[r].rc) {
            rc = all[r].rc;
            if (r == 0 && own) *err = *own;
            else dsv4_err_set(err, rc, "MPI rank %d: %.470s", r, all[r].msg);
        }
    if (keep && rc == DSV4_OK) *keep = all;
    else free(all);
    return rc;
}

static void ep_free(struct dsv4_ep *ep)
{
    if (ep->stage.kind) ep_stage_free(&ep->stage);
    free(ep->lo), free(ep->hi), free(ep->tables), free(ep->rows), free(ep->row0), free(ep->cnt), free(ep->displ);
    free(ep->bcnt), free(ep->boff);
    free(ep);
}

static struct dsv4_ep *ep_new(const struct dsv4_model *m, int ranks, enum dsv4_ep_dispatch how)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_ep           *ep = calloc(1, sizeof(*ep));
    size_t                    n  = (size_t)ranks;
    if (!ep) return NULL;
    *ep = (struct dsv4_ep){ .ranks = ranks, .n_exp = c->n_exp, .d = c->d_model, .k = c->n_exp_used,
                            .limit = c->swiglu_limit, .lo = calloc(n, sizeof(int)), .hi = calloc(n, sizeof(int)),
                            .tables = calloc(n * (size_t)ep_table_ints(c->n_exp), sizeof(int)),
                            .rows = calloc(n, sizeof(int)), .row0 = calloc(n, sizeof(int)),
                            .cnt = calloc(n, sizeof(int)), .displ = calloc(n, sizeof(int)),
                            .bcnt = calloc(n, sizeof(int)), .boff = calloc(n, sizeof(int)) };
    ep->st.ranks = ranks;
    ep->how      = how;
    if (!ep->lo || !ep->hi || !ep->tables || !ep->rows || !ep->row0 || !ep->cnt || !ep->displ || !ep->bcnt ||
        !ep->boff) {
        ep_free(ep);
        return NULL;
    }
    for (int r = 0; r < ranks; r++) dsv4_rank_experts(r, ranks, c->n_exp, &ep->lo[r], &ep->hi[r]);
    ep_stage_init(&ep->stage, m);
    return ep;
}

int dsv4_ep_attach(struct dsv4_model *m, int ranks, enum dsv4_ep_dispatch how, int own_rc, const struct dsv4_err *own,
                   const struct dsv4_logger *lg, struct dsv4_err *err)
{
    struct ep_status  mine = { .rc = own_rc }, *all = NULL;
    if (own_rc == DSV4_OK)
        mine = (struct ep_status){ .exp_lo = m->exp_lo, .exp_hi = m->exp_hi, .held_bytes = ep_held_bytes(m),
                                   .rss_bytes = ep_rss_bytes() };
    int rc = gather_status(ranks, &mine, own, &all, err);
    if (rc == DSV4_OK && !(m->ep = ep_new(m, ranks, how)))
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the expert-parallel tables");
    for (int r = 0; rc == DSV4_OK && r < ranks; r++)
        dsv4_log(lg, DSV4_LOG_INFO, "MPI rank %d: routed experts [%d, %d)%s, %.3f GB of the checkpoint held, %.3f GB resident",
                 r, all[r].exp_lo, all[r].exp_hi, r ? "" : " and the trunk", (double)all[r].held_bytes / 1e9,
                 (double)all[r].rss_bytes / 1e9);
    free(all);
    if (rc) {
        struct ep_cmd c = { .op = EP_CLOSE };
        send_cmd(c, NULL);
        g_mpi.attached = false;
        ep_unlock();
        return rc;
    }
    ep_unlock();
    dsv4_log(lg, DSV4_LOG_INFO, "expert parallelism: %d MPI ranks, %s dispatch", ranks,
             how == DSV4_EP_ROWS ? "rows" : "tokens");
    return DSV4_OK;
}

void dsv4_ep_detach(struct dsv4_model *m, const struct dsv4_logger *lg)
{
    if (!m->ep) return;
    const struct dsv4_ep_stats *st = &m->ep->st;
    dsv4_log(lg, DSV4_LOG_INFO, "expert parallelism: %llu MoE layers, %.3f MB sent, %.3f MB received, %.3f s in MPI",
             (unsigned long long)st->layers, (double)st->bytes_sent / 1e6, (double)st->bytes_received / 1e6,
             st->mpi_seconds);
    struct ep_cmd c = { .op = EP_CLOSE };
    ep_lock();
    send_cmd(c, NULL);
    ep_free(m->ep);
    m->ep          = NULL;
    g_mpi.attached = false;
    ep_unlock();
}

int dsv4_ep_reserve(struct dsv4_ep *ep, int rows, struct dsv4_err *err)
{
    struct ep_cmd c = { .op = EP_RESERVE, .arg = rows };
    ep_lock();
    send_cmd(c, NULL);
    struct dsv4_err  own;
    struct ep_status mine = { .rc = ep_stage_reserve(&ep->stage, rows, ep->ranks, &own) };
    int              rc   = gather_status(ep->ranks, &mine, &own, NULL, err);
    ep_unlock();
    return rc;
}

/* Each rank's part of the dispatch table grp (backend memory): tables, rows and offsets. */
static void parts_of(struct dsv4_ep *ep, const int *grp)
{
    int        TW = ep_table_ints(ep->n_exp), d = ep->d;
    const int *g  = ep_pull(&ep->stage, ep->stage.grp, grp, sizeof(int) * (size_t)TW);
    for (int r = 0; r < ep->ranks; r++) {
        int a, b;
        ep_part_of(g, ep->n_exp, ep->lo[r], ep->hi[r], ep->tables + (size_t)r * (size_t)TW, &a, &b);
        ep->row0[r] = a, ep->rows[r] = b - a, ep->displ[r] = a * d, ep->cnt[r] = (b - a) * d;
    }
}

/* ROWS: each other rank's table, routing weights and rows packed one after the other in the
 * wire buffer (ep_rows_bytes), where one Scatterv takes them; the pairs [a, R k) are theirs
 * (host views hx, hw). Returns the bytes. */
static uint64_t pack_rows(struct dsv4_ep *ep, const float *hx, const float *hw, int a)
{
    int      TW  = ep_table_ints(ep->n_exp), d = ep->d;
    uint8_t *w   = ep->stage.wire;
    size_t   off = 0;
    ep->bcnt[0] = ep->boff[0] = 0;
    for (int r = 1; r < ep->ranks; r++) {
        size_t n = (size_t)ep->rows[r], at = (size_t)(ep->row0[r] - a);
        ep->boff[r] = (int)off;
        memcpy(w + off, ep->tables + (size_t)r * (size_t)TW, sizeof(int32_t) * (size_t)TW);
        off += sizeof(int32_t) * (size_t)TW;
        memcpy(w + off, hw + at, sizeof(float) * n);
        off += sizeof(float) * n;
        ep_to_wire((uint16_t *)(void *)(w + off), hx + at * (size_t)d, n * (size_t)d);
        off += 2 * n * (size_t)d;
        ep->bcnt[r] = (int)(off - (size_t)ep->boff[r]);
    }
    return off;
}

void dsv4_ep_experts_begin(struct dsv4_ep *ep, struct dsv4_backend *be, const struct dsv4_layer_w *L, int li, int R,
                           const float *u, const int *ids, const float *rw, const int *grp, const float *xe,
                           const float *row_w, float *ye, float *scratch)
{
    const struct ep_stage *st = &ep->stage;
    int      d = ep->d, k = ep->k, N = ep->ranks;
    size_t   fd = sizeof(float) * (size_t)d, nk = (size_t)R * (size_t)k;
    double   t0 = now_s();
    struct ep_cmd c = { .op = EP_EXPERTS, .layer = li, .rows = R, .dispatch = (int32_t)ep->how };
    ep_lock(); /* held until dsv4_ep_experts_end: the ranks are inside this layer */
    parts_of(ep, grp);
    uint64_t sent = (uint64_t)(N - 1) * ep_msg_bytes(N);
    /* three collectives a layer: this header (with each rank's pairs), the payload, the results */
    if (ep->how == DSV4_EP_ROWS) {
        send_cmd(c, ep->rows);
        /* the other ranks' pairs: rank 0's come first, the rest follow in rank order */
        int          a  = ep->row0[1];
        size_t       n  = nk - (size_t)a;
        const float *hx = ep_pull(st, st->xe ? st->xe + (size_t)a * (size_t)d : NULL, xe + (size_t)a * (size_t)d, n * fd);
        const float *hw = ep_pull(st, st->row_w ? st->row_w + a : NULL, row_w + a, n * sizeof(float));
        sent += pack_rows(ep, hx, hw, a);
        MPI_Scatterv(st->wire, ep->bcnt, ep->boff, MPI_BYTE, MPI_IN_PLACE, 0, MPI_BYTE, 0, MPI_COMM_WORLD);
    } else {
        send_cmd(c, NULL);
        /* the rows (bf16), the ids, the weights: one broadcast */
        uint8_t *w = st->wire;
        ep_to_wire((uint16_t *)(void *)w, ep_pull(st, st->u, u, (size_t)R * fd), (size_t)R * (size_t)d);
        memcpy(w + 2 * (size_t)R * (size_t)d, ep_pull(st, st->ids, ids, nk * sizeof(int)), nk * sizeof(int));
        memcpy(w + 2 * (size_t)R * (size_t)d + 4 * nk, ep_pull(st, st->rw, rw, nk * sizeof(float)), nk * sizeof(float));
        size_t bytes = 2 * (size_t)R * (size_t)d + 8 * nk;
        MPI_Bcast(w, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        sent += (uint64_t)(N - 1) * bytes;
    }
    ep->st.mpi_seconds += now_s() - t0;
    ep->st.bytes_sent += sent;
    ep->st.layers++;
    dsv4_alloc_guard_exempt(false); /* the engine's own work between: counted as ever */
    /* rank 0's own experts: the first range of pairs (it holds the lowest expert ids) */
    if (ep->tables[0] > 0)
        be->ops->experts(be, L->experts, ep->n_exp, ep->rows[0], ep_table_dev(st, ep->tables), xe, row_w, ep->limit, ye,
                         scratch);
}

void dsv4_ep_experts_end(struct dsv4_ep *ep, float *ye)
{
    const struct ep_stage *st = &ep->stage;
    double    t0   = now_s();
    size_t    a    = (size_t)ep->displ[1], n = 0;
    uint16_t *wire = (uint16_t *)(void *)st->wire;
    dsv4_alloc_guard_exempt(true);
    for (int r = 1; r < ep->ranks; r++) n += (size_t)ep->cnt[r];
    float *h = ep_host(st, st->ye ? st->ye + a : NULL, ye + a);
    /* the rows land at their pairs' places (displ counts from pair 0; the wire holds from a) */
    for (int r = 1; r < ep->ranks; r++) ep->boff[r] = ep->displ[r] - (int)a;
    ep->boff[0] = 0;
    MPI_Gatherv(MPI_IN_PLACE, 0, MPI_UINT16_T, wire, ep->cnt, ep->boff, MPI_UINT16_T, 0, MPI_COMM_WORLD);
    ep_from_wire(h, wire, n);
    ep_push(st, ye + a, h, n * sizeof(float));
    ep->st.bytes_received += 2 * (uint64_t)n;
    ep->st.mpi_seconds += now_s() - t0;
    ep_unlock();
}

int dsv4_ep_bandwidth(const struct dsv4_model *m, size_t bytes, int reps, double *gbps)
{
    if (!m->ep) {
        gbps[0] = ep_read_bandwidth(m, bytes, reps);
        return 1;
    }
    /* all at once: each rank's figure is what it gets while the others read too, as in a step */
    struct ep_cmd c = { .op = EP_BANDWIDTH, .rows = reps, .arg = (int64_t)bytes };
    ep_lock();
    send_cmd(c, NULL);
    double own = ep_read_bandwidth(m, bytes, reps);
    MPI_Gather(&own, 1, MPI_DOUBLE, gbps, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    ep_unlock();
    return m->ep->ranks;
}

void dsv4_ep_stats_of(const struct dsv4_ep *ep, struct dsv4_ep_stats *st)
{
    if (ep) *st = ep->st;
    else memset(st, 0, sizeof(*st)), st->ranks = 1;
}

#else /* no MPI in this build */

int dsv4_mpi_start(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

int dsv4_mpi_ranks(void)
{
    return 1;
}

void dsv4_mpi_finish(void) {}

int dsv4_mpi_serve(void)
{
    return 0;
}

int dsv4_ep_ranks_for(const struct dsv4_engine_params *p, int *ranks, struct dsv4_err *err)
{
    *ranks = 1;
    if (p->ep > 1)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "--ep %d: this build has no MPI (make MPI=1, with libopenmpi-dev)",
                            p->ep);
    return DSV4_OK;
}

int dsv4_ep_announce(const char *dir, const struct dsv4_engine_params *p, int ranks, struct dsv4_err *err)
{
    (void)dir, (void)p, (void)ranks, (void)err;
    return DSV4_OK;
}

int dsv4_ep_attach(struct dsv4_model *m, int ranks, enum dsv4_ep_dispatch how, int own_rc, const struct dsv4_err *own,
                   const struct dsv4_logger *lg, struct dsv4_err *err)
{
    (void)m, (void)ranks, (void)how, (void)own, (void)lg, (void)err;
    return own_rc;
}

void dsv4_ep_detach(struct dsv4_model *m, const struct dsv4_logger *lg)
{
    (void)m, (void)lg;
}

int dsv4_ep_reserve(struct dsv4_ep *ep, int rows, struct dsv4_err *err)
{
    (void)ep, (void)rows, (void)err;
    return DSV4_OK;
}

void dsv4_ep_experts_begin(struct dsv4_ep *ep, struct dsv4_backend *be, const struct dsv4_layer_w *L, int li, int R,
                           const float *u, const int *ids, const float *rw,
                           const int *grp, const float *xe, const float *row_w, float *ye, float *scratch)
{
    (void)ep, (void)be, (void)L, (void)li, (void)R, (void)u, (void)ids, (void)rw, (void)grp, (void)xe;
    (void)row_w, (void)ye, (void)scratch;
}

void dsv4_ep_experts_end(struct dsv4_ep *ep, float *ye)
{
    (void)ep, (void)ye;
}

int dsv4_ep_bandwidth(const struct dsv4_model *m, size_t bytes, int reps, double *gbps)
{
    gbps[0] = ep_read_bandwidth(m, bytes, reps);
    return 1;
}

void dsv4_ep_stats_of(const struct dsv4_ep *ep, struct dsv4_ep_stats *st)
{
    (void)ep;
    memset(st, 0, sizeof(*st));
    st->ranks = 1;
}

#endif
