/*
 * cpu_backend.c - the CPU backend's lifecycle (backend.h, struct dsv4_backend_kind): create
 * from explicit parameters (level, threads), the op table of the level (reference or fast),
 * the weight preparation at load (interleaved 16-row tiles for the VDPBF16PS kernels, or
 * read-ahead of the release layout), and the scratch a step plan needs. The model layer
 * reaches the CPU backend only through this table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"

struct tiles_plan {
    const struct dsv4_checkpoint *ck;
    bool                *gone;    /* [n_tensors]: tensors the tiles stand in for (never read) */
    size_t               bytes, n, n_stored, replaced;
    struct dsv4_linear **elig;    /* the projections held as tiles, in each_linear's order */
    size_t               n_elig, cap_elig;
    bool                 oom;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* The tiles `dsv4 convert --tiles` stored for tensor t ("NAME.i16", docs/FORMAT.md), when
 * present with the expected size; NULL otherwise. */
static const void *stored_tiles(const struct dsv4_checkpoint *ck, const struct dsv4_tensor *t, size_t bytes)
{
    char name[300];
    if (!t || snprintf(name, sizeof(name), "%s.i16", t->name) >= (int)sizeof(name)) return NULL;
    const struct dsv4_tensor *s = dsv4_checkpoint_find(ck, name);
    return s && s->dtype == DSV4_DTYPE_U8 && s->ndim == 1 && s->nbytes == bytes ? s->data : NULL;
}

/* Lists the projections that will be held as tiles (eligibility reads every scale: once). */
static void plan_tiles(struct dsv4_linear *l, void *ud)
{
    struct tiles_plan *P = ud;
    if (P->oom || !dsv4_i16_eligible(l)) return;
    if (P->n_elig == P->cap_elig) {
        size_t               nc = P->cap_elig ? 2 * P->cap_elig : 256;
        struct dsv4_linear **ne = realloc(P->elig, nc * sizeof(*ne));
        if (!ne) {
            P->oom = true;
            return;
        }
        P->elig = ne, P->cap_elig = nc;
    }
    P->elig[P->n_elig++] = l;
    P->replaced += (l->wt ? (size_t)l->wt->nbytes : 0) + (l->st ? (size_t)l->st->nbytes : 0);
    if (l->wt) P->gone[l->wt - P->ck->tensors] = true;
    if (l->st) P->gone[l->st - P->ck->tensors] = true;
}

/* The tiles `dsv4 convert --tiles` stored, where present (used where they are mapped); the
 * bytes the others need. */
static void find_stored(struct tiles_plan *P, struct dsv4_cpu_tiles *preps)
{
    for (size_t i = 0; i < P->n_elig; i++) {
        const struct dsv4_linear *l = P->elig[i];
        size_t                    wb, sb;
        dsv4_i16_sizes(l, &wb, &sb);
        const void *wi = stored_tiles(P->ck, l->wt, wb), *si = sb ? stored_tiles(P->ck, l->st, sb) : NULL;
        if (wi && (si || !sb)) {
            preps[i] = (struct dsv4_cpu_tiles){ wi, si };
            P->n_stored++;
            continue;
        }
        P->bytes += align64(wb) + align64(sb);
        P->n++;
    }
}

struct pack_job {
    const struct dsv4_linear *l;
    void                     *wi, *si;
};

static void pack_groups(void *ctx, int64_t g0, int64_t g1, int tid)
{
    (void)tid;
    const struct pack_job *J = ctx;
    dsv4_i16_pack(J->l, (int)g0, (int)g1, J->wi, J->si);
}

/* madvise over the whole pages inside [p, p + n), so that advice never reaches a
 * neighbouring tensor's bytes; advice the kernel does not know is ignored. */
static void advise_inside(const void *p, size_t n, int advice)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, advice);
}

/* Packs l into the tiles at *at (advanced past them), recorded in *t. */
static void pack_tiles(struct dsv4_pool *pool, const struct dsv4_linear *l, uint8_t **at, struct dsv4_cpu_tiles *t)
{
    size_t wb, sb;
    dsv4_i16_sizes(l, &wb, &sb);
    struct pack_job J = { .l = l, .wi = *at, .si = sb ? *at + align64(wb) : NULL };
    dsv4_pool_for(pool, dsv4_i16_groups(l), 1, 4, pack_groups, &J);
    *t = (struct dsv4_cpu_tiles){ J.wi, J.si };
    *at += align64(wb) + align64(sb);
#ifdef MADV_PAGEOUT
    /* the source pages are not read again: give them back now, or the page cache, full of
     * them, pushes out the tensors that are read in place (the embedding, a 1 GB table of
     * which each token touches one row) */
    if (l->wt) advise_inside(l->wt->data, l->wt->nbytes, MADV_PAGEOUT);
    if (l->st) advise_inside(l->st->data, l->st->nbytes, MADV_PAGEOUT);
#endif
}

/* Asks the kernel to read ahead every tensor that will be read in place (not the ones the
 * tiles replaced, nor stored tiles that are not used), so that the first requests do not
 * fault them in from disk row by row. gone: as in struct tiles_plan, or NULL. */
static void prefetch_in_place(const struct dsv4_weight_set *ws, const bool *gone, bool tiles_used,
                              const struct dsv4_logger *lg)
{
    const struct dsv4_checkpoint *ck    = ws->ck;
    size_t                        bytes = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t = &ck->tensors[i];
        size_t nl = strlen(t->name);
        if ((gone && gone[i]) || (!tiles_used && nl > 4 && !strcmp(t->name + nl - 4, ".i16"))) continue;
        if (ws->holds && !ws->holds(ws->ctx, t)) continue;
        advise_inside(t->data, t->nbytes, MADV_WILLNEED);
        bytes += t->nbytes;
    }
    dsv4_log(lg, DSV4_LOG_INFO, "read-ahead asked for %.2f GB of weights read in place", (double)bytes / 1e9);
}

/* The tiles of the planned projections into cpu->preps: the stored ones where they are
 * mapped, the others packed into one anonymous mapping of the backend's. */
static int make_tiles(struct dsv4_cpu *cpu, struct tiles_plan *P, const struct dsv4_logger *lg)
{
    find_stored(P, cpu->preps);
    if (P->n_stored) dsv4_log(lg, DSV4_LOG_INFO, "%zu projections use the tiles stored in the checkpoint", P->n_stored);
    if (!P->bytes) return DSV4_OK;
    double t0  = now_s();
    void  *mem = mmap(NULL, P->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return DSV4_ENOMEM;
    madvise(mem, P->bytes, MADV_HUGEPAGE);
    cpu->tiles       = mem;
    cpu->tiles_bytes = P->bytes;
    uint8_t *at      = mem;
    dsv4_log(lg, DSV4_LOG_INFO, "repacking %zu projections (%.2f GB) into 16-row tiles", P->n, (double)P->bytes / 1e9);
    for (size_t i = 0; i < P->n_elig; i++)
        if (!cpu->preps[i].wi) pack_tiles(cpu->pool, P->elig[i], &at, &cpu->preps[i]);
    dsv4_log(lg, DSV4_LOG_INFO, "repacked in %.2f s", now_s() - t0);
    return DSV4_OK;
}

/*
 * On the levels with VDPBF16PS, the projections are copied once into interleaved 16-row
 * tiles (repack.c), the layout of the kernels that give the same bits at any batch size and
 * run the prefill GEMM near the machine's peak. The copy is anonymous memory (transparent
 * huge pages asked for), owned by the backend; the checkpoint's pages are no longer touched
 * by the kernels, so the page cache may drop them. Option tiles=0 keeps the release layout.
 */
static int cpu_prepare_weights(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                               struct dsv4_err *err)
{
    struct dsv4_cpu          *cpu = impl;
    const struct dsv4_logger *lg  = p->lg;
    if (cpu->ref || !cpu->kb || !cpu->kb->dotb_i16 || !cpu->repack) {
        prefetch_in_place(ws, NULL, false, lg);
        return DSV4_OK;
    }
    struct tiles_plan P = { .ck = ws->ck, .gone = calloc(ws->ck->n_tensors + 1, sizeof(bool)) };
    if (!P.gone) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    ws->each_linear(ws->ctx, plan_tiles, &P);
    /* one struct dsv4_cpu_tiles per projection held as tiles: what its descriptor's prep names */
    cpu->preps = P.oom ? NULL : calloc(P.n_elig + 1, sizeof(*cpu->preps));
    int rc     = cpu->preps ? make_tiles(cpu, &P, lg) : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (rc == DSV4_ENOMEM && cpu->preps)
        dsv4_err_set(err, rc, "out of memory for the %.2f GB of interleaved weight tiles (tiles off: --no-tiles or "
                     "DSV4_TILES=0, runs on the checkpoint's own layout)", (double)P.bytes / 1e9);
    if (!rc) {
        for (size_t i = 0; i < P.n_elig; i++) P.elig[i]->prep = &cpu->preps[i];
        cpu->replaced = P.replaced;
        prefetch_in_place(ws, P.gone, true, lg);
    }
    free(P.elig);
    free(P.gone);
    return rc;
}

/* ------------------------------------------------------------------ the backend */

/* The CPU's options (backend.h dsv4_backend_params.opts). */
struct cpu_opts {
    const char *backend;
    char        level[32], gemm_min[64];
    bool        tiles;
    struct dsv4_err *err;
};

static int cpu_opt(const char *key, const char *val, void *ud)
{
    struct cpu_opts *o = ud;
    if (!strcmp(key, "level") || !strcmp(key, "gemm_min")) {
        char  *dst = key[0] == 'l' ? o->level : o->gemm_min;
        size_t cap = key[0] == 'l' ? sizeof(o->level) : sizeof(o->gemm_min);
        if (strlen(val) >= cap)
            return dsv4_err_set(o->err, DSV4_EINVAL, "backend '%s': option %s '%s' is too long", o->backend, key, val);
        snprintf(dst, cap, "%s", val);
    } else if (!strcmp(key, "tiles") && (!strcmp(val, "0") || !strcmp(val, "1"))) {
        o->tiles = val[0] == '1';
    } else if (!strcmp(key, "tiles")) {
        return dsv4_err_set(o->err, DSV4_EINVAL, "backend '%s': option tiles takes 0 or 1, not '%s'", o->backend, val);
    } else {
        return dsv4_err_set(o->err, DSV4_EINVAL, "backend '%s': no option '%s' (it takes level, gemm_min, tiles)",
                            o->backend, key);
    }
    return DSV4_OK;
}

/* Creates the CPU state from the options: level (default: this CPU's best), gemm_min (the
 * crossovers measured for this core), tiles (1). */
static int create_named(void **impl, const struct dsv4_backend_params *p, const char *name, struct dsv4_err *err)
{
    struct cpu_opts o = { .backend = name, .tiles = true, .err = err };
    *impl             = NULL;
    int rc            = dsv4_backend_opts_each(p->opts, name, err, cpu_opt, &o);
    if (rc) return rc;
    struct dsv4_cpu *cpu = NULL;
    rc = dsv4_cpu_create(&cpu, o.level[0] ? o.level : NULL, o.gemm_min[0] ? o.gemm_min : NULL, p->n_threads, err);
    if (cpu) cpu->repack = o.tiles;
    *impl = cpu;
    return rc;
}

static int cpu_create(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err)
{
    return create_named(impl, p, "cpu", err);
}

static int staged_create(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err)
{
    return create_named(impl, p, "cpu-staged", err);
}

static void cpu_destroy(void *impl)
{
    dsv4_cpu_free(impl);
}

static const struct dsv4_backend_ops *cpu_ops(void *impl)
{
    const struct dsv4_cpu *cpu = impl;
    return cpu->ref ? &dsv4_cpu_ref_ops : &dsv4_cpu_fast_ops;
}

static void cpu_describe(void *impl, char *buf, size_t cap)
{
    const struct dsv4_cpu *cpu = impl;
    snprintf(buf, cap, "cpu %s, %d threads", dsv4_cpu_name(cpu), cpu->n_threads);
}

static void cpu_settings(void *impl, struct dsv4_backend_settings *s)
{
    const struct dsv4_cpu *cpu = impl;
    s->level                   = dsv4_cpu_name(cpu);
    s->n_threads               = cpu->n_threads;
    for (int i = 0; i < 3; i++) s->gemm_min[i] = cpu->gemm_min[i];
    s->tiles = cpu->repack;
}

static size_t cpu_scratch_floats(void *impl, const struct dsv4_plan_dims *dims)
{
    const struct dsv4_cpu *cpu = impl;
    return dsv4_cpu_scratch_floats(dims, cpu ? cpu->n_threads : 1, cpu && cpu->fp4x);
}

/* ------------------------------------------------------------------ memory: host buffers */

static void *cpu_alloc(void *impl, size_t bytes, enum dsv4_mem_kind kind)
{
    (void)impl, (void)kind;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes); /* touched now, not while decoding */
    return p;
}

static void cpu_free(void *impl, void *buf, size_t bytes)
{
    (void)impl, (void)bytes;
    free(buf);
}

static void cpu_move(void *impl, void *dst, const void *src, size_t bytes)
{
    (void)impl;
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_sync(void *impl)
{
    (void)impl; /* ops return when done */
}

/* Host memory: MemAvailable and MemTotal of /proc/meminfo. */
static int cpu_memory(void *impl, size_t *avail, size_t *total)
{
    (void)impl;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return DSV4_EIO;
    char               line[256];
    unsigned long long a = 0, t = 0;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "MemAvailable: %llu kB", &a);
        sscanf(line, "MemTotal: %llu kB", &t);
    }
    fclose(f);
    *avail = (size_t)a * 1024;
    *total = (size_t)t * 1024;
    return a > 0 && t > 0 ? DSV4_OK : DSV4_EIO;
}

/* The checkpoint pages read in place: all but those the tiles replaced. */
static size_t cpu_weights_resident(void *impl, size_t mapped)
{
    const struct dsv4_cpu *cpu = impl;
    return mapped - (cpu->replaced < mapped ? cpu->replaced : 0);
}

/* ------------------------------------------------------------------ machine figures */

struct bw_job {
    const uint64_t *buf;
    uint64_t        sums[64];
};

static void bw_sum(void *ctx, int64_t i0, int64_t i1, int tid)
{
    struct bw_job *j = ctx;
    uint64_t       a = 0, b = 0, c = 0, d = 0;
    int64_t        i = i0;
    for (; i + 4 <= i1; i += 4) {
        a += j->buf[i];
        b += j->buf[i + 1];
        c += j->buf[i + 2];
        d += j->buf[i + 3];
    }
    for (; i < i1; i++) a += j->buf[i];
    j->sums[tid & 63] += a + b + c + d; /* kept, so the reads are not optimised away */
}

/* Best of reps sum reductions over buf on the backend's pool. */
static double cpu_read_bandwidth(void *impl, const void *buf, size_t bytes, int reps)
{
    struct dsv4_cpu *cpu  = impl;
    struct bw_job    j    = { buf, { 0 } };
    size_t           n    = bytes / 8;
    double           best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        dsv4_pool_for(cpu->pool, (int64_t)n, 8, 1, bw_sum, &j);
        double t = now_s() - t0;
        if ((double)n * 8 / t / 1e9 > best) best = (double)n * 8 / t / 1e9;
    }
    return best;
}

struct peak_job {
    double (*peak)(long n);
    long   n;
    double flops[64];
};

static void peak_run(void *ctx, int64_t i0, int64_t i1, int tid)
{
    struct peak_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->flops[tid & 63] += j->peak(j->n);
}

/* The peak of a kernel table on every thread at once (one pass of the chains per thread,
 * best of 3); 0 when the table has no peak loop. */
static double kernels_peak(struct dsv4_pool *pool, const struct dsv4_kernels *k)
{
    if (!k || !k->peak) return 0;
    int    nt   = dsv4_pool_threads(pool);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        struct peak_job j  = { k->peak, 20 * 1000 * 1000, { 0 } };
        double          t0 = now_s();
        dsv4_pool_for(pool, nt, 1, 1, peak_run, &j);
        double t = now_s() - t0, f = 0;
        for (int i = 0; i < 64; i++) f += j.flops[i];
        if (f / t / 1e9 > best) best = f / t / 1e9;
    }
    return best;
}

static void cpu_peaks(void *impl, double *f32, double *bf16)
{
    struct dsv4_cpu *cpu = impl;
    *f32                 = cpu->ref ? 0 : kernels_peak(cpu->pool, cpu->k);
    *bf16                = cpu->ref ? 0 : kernels_peak(cpu->pool, cpu->kb);
}

/* Every entry but the name, create, host_visible and prepare_weights, shared by the two CPU
 * kinds. */
#define CPU_KIND_ENTRIES                                                                                           \
    .destroy = cpu_destroy, .ops = cpu_ops, .describe = cpu_describe, .settings = cpu_settings,                     \
    .scratch_floats = cpu_scratch_floats,                                                                           \
    .describe_op = dsv4_cpu_describe_op, .level = dsv4_cpu_level_at, /* cpu_describe.c */                           \
    .alloc = cpu_alloc, .free = cpu_free, .upload = cpu_move, .download = cpu_move, .copy = cpu_move,               \
    .sync = cpu_sync, .memory = cpu_memory, .weights_resident = cpu_weights_resident,                               \
    .read_bandwidth = cpu_read_bandwidth, .peaks = cpu_peaks, .prepared_suffix = "i16",                              \
    .export_prepared = dsv4_i16_export /* repack.c; found again by stored_tiles */

const struct dsv4_backend_kind dsv4_backend_cpu = { .name = "cpu", .create = cpu_create, .host_visible = true,
                                                    CPU_KIND_ENTRIES, .prepare_weights = cpu_prepare_weights };

/* ------------------------------------------------------------------ cpu-staged */

struct place_job {
    struct dsv4_cpu *cpu;
    uint8_t         *at;    /* the next free byte of cpu->placed (placing) */
    size_t           bytes; /* what the tables take, each 64-byte aligned (sizing) */
};

static void size_table(const void **t, size_t bytes, void *ud)
{
    (void)t;
    ((struct place_job *)ud)->bytes += align64(bytes);
}

static void place_table(const void **t, size_t bytes, void *ud)
{
    struct place_job *J = ud;
    cpu_move(J->cpu, J->at, *t, bytes); /* upload */
    *t = J->at;
    J->at += align64(bytes);
}

/*
 * As the CPU's, then every table of each_tensor (the checkpoint's embedding, norms, mixers,
 * sinks, APE, routing tables, and the RoPE frequencies the model computed) is uploaded into
 * one buffer of this backend and repointed there, as a device backend must: the ops then
 * read no table where the host put it. One copy of those tables more in memory (the
 * checkpoint's pages stay mapped; the memory plan counts them twice, erring safe).
 */
static int staged_prepare_weights(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                                  struct dsv4_err *err)
{
    struct dsv4_cpu *cpu = impl;
    int              rc  = cpu_prepare_weights(impl, ws, p, err);
    if (rc) return rc;
    struct place_job J = { .cpu = cpu };
    ws->each_tensor(ws->ctx, size_table, &J);
    if (!J.bytes) return DSV4_OK;
    cpu->placed = cpu_alloc(impl, J.bytes, DSV4_MEM_WEIGHTS);
    if (!cpu->placed)
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the %.2f GB of tables placed in backend memory",
                            (double)J.bytes / 1e9);
    J.at = cpu->placed;
    ws->each_tensor(ws->ctx, place_table, &J);
    return DSV4_OK;
}

/*
 * The CPU ops behind the device-memory path: the same kind, but it tells the model that its
 * buffers are not host memory, so the model reads results only through download (logits)
 * and writes KV only through upload and copy, and it places the tables the ops read in its
 * own memory (staged_prepare_weights). It proves, test by test, that the model layer needs
 * nothing from a backend but the two tables (tests/unit/test_forward.c).
 */
const struct dsv4_backend_kind dsv4_backend_cpu_staged = { .name = "cpu-staged", .create = staged_create,
                                                           .host_visible = false, CPU_KIND_ENTRIES,
                                                           .prepare_weights = staged_prepare_weights };
