/*
 * op_check.c - the op checker's engine (op_check.h): the levels and their contexts, the runs
 * of a case (reference first), the comparison of outputs, the report.
 *
 * The reference is the CPU backend at level "ref" (the table dsv4_cpu_ref_ops), single
 * threaded; the contexts checked have two threads by default so that every op's work split
 * is exercised. Every context gets the scratch its kind's scratch_floats asks for the case's
 * plan widths, no more: an op that needs more than its backend says fails its own assert.
 * Memory of a case comes from a list freed when the case ends; when an allocation fails the
 * op's check stops there (longjmp back to run_op) and is reported failed.
 *
 * A backend whose buffers are not host memory (kind->host_visible false) gets everything the
 * contract puts in backend memory through its memory half: a run's scratch and outputs are
 * its own buffers (outputs uploaded from their initial values, downloaded after the run),
 * and chk_in hands it an uploaded twin of each host input, one per case allocation and run.
 * The checker never reads or writes those buffers in place, so a backend whose memory the
 * host cannot touch is checked as it would be used.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend/op_check_int.h"

enum { MAX_SLOTS = 8, MAX_WEIGHTS = 48 };

/* The widths of the presets of tools/gen.c (preset_shape): one row per preset. */
const struct chk_model chk_models[3] = {
    { "tiny-a", 256, 4, 128, 64, 128, 2, 64, 16, 4, 128, 4, 8, 2, 128, 4, 16, 4 },
    { "tiny-b", 256, 4, 128, 64, 128, 2, 64, 128, 4, 128, 16, 8, 2, 128, 4, 128, 4 },
    { "flash", 4096, 64, 512, 64, 1024, 8, 1024, 128, 64, 128, 512, 256, 6, 2048, 4, 128, 4 },
};

enum slot_kind { SLOT_F32, SLOT_INT, SLOT_BYTES };

struct slot {
    enum slot_kind kind;
    size_t         n, elem;
    void          *ref, *got;
    void          *dev; /* the run's output in backend memory (mirrored runs), read back into got */
    struct chk_tol tol;
    const float   *mag;
};

/* A host allocation of the case, and a buffer of the backend's made for one run: a twin of
 * host allocation `of` (chk_in), or (of SIZE_MAX) an output or scratch. */
struct host_mem {
    void  *p;
    size_t bytes;
};
struct dev_mem {
    void  *impl, *p;
    size_t bytes, of;
};

struct level {
    char  name[24];
    bool  here;
    void *impl; /* the context for cases without weights */
};

struct chk {
    const struct dsv4_check_opts   *o;
    struct dsv4_check_report       *r;
    const struct dsv4_backend_kind *kind, *cpu;
    void                           *ref_impl;
    int                             n_levels;
    struct level                    lv[DSV4_CHECK_MAX_LEVELS];
    enum dsv4_op                    op;
    int                             n_cases; /* of this op so far: seeds the case */
    jmp_buf                         oom;

    /* the case */
    bool                  open;
    char                  what[96];
    struct dsv4_plan_dims dims;
    struct dsv4_linear   *w[MAX_WEIGHTS], saved[MAX_WEIGHTS];
    int                   n_w;
    unsigned long long    seed;
    struct slot           slot[MAX_SLOTS];
    void (*custom)(struct chk *h, void *ud);
    void                 *custom_ud;
    struct host_mem      *mem;
    size_t                n_mem, cap_mem;
    struct dev_mem       *dev; /* the run's backend buffers (mirrored runs), freed when it ends */
    size_t                n_dev, cap_dev;

    /* the run: level -1 is the reference; variant 1 runs on prepared weights */
    int                  level, variant;
    bool                 run_failed;
    double               run_used; /* the run's largest difference, as a fraction of the tolerance */
    void                *run_impl; /* a context made for this run, or NULL */
    float               *scratch;
    struct dsv4_backend  be;
    struct dsv4_prof    *prof;
    const struct dsv4_backend_ops *prof_inner;
};

/* ------------------------------------------------------------------ memory and inputs */

/* Grows a list of n elements of size elem to hold one more (longjmp when out of memory). */
static void *grow(struct chk *h, void *list, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap) return list;
    size_t nc = *cap ? 2 * *cap : 64;
    void  *nl = realloc(list, nc * elem);
    if (!nl) longjmp(h->oom, 1);
    *cap = nc;
    return nl;
}

static void *raw_alloc(struct chk *h, size_t bytes)
{
    h->mem  = grow(h, h->mem, h->n_mem, &h->cap_mem, sizeof(*h->mem));
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) longjmp(h->oom, 1);
    h->mem[h->n_mem++] = (struct host_mem){ p, bytes };
    return p;
}

/* Whether this run moves data through the backend's memory half (a level's run of a kind
 * whose buffers are not host memory; the reference is the CPU's, host memory). */
static bool mirrored(const struct chk *h)
{
    return h->level >= 0 && !h->kind->host_visible;
}

/* A zero-filled buffer of the run's backend, freed when the run ends; of: as struct dev_mem. */
static void *dev_alloc(struct chk *h, size_t bytes, size_t of)
{
    h->dev  = grow(h, h->dev, h->n_dev, &h->cap_dev, sizeof(*h->dev));
    void *p = h->kind->alloc(h->be.impl, bytes ? bytes : 1, DSV4_MEM_ACT);
    if (!p) longjmp(h->oom, 1);
    h->dev[h->n_dev++] = (struct dev_mem){ h->be.impl, p, bytes ? bytes : 1, of };
    return p;
}

static void free_dev(struct chk *h)
{
    for (size_t i = 0; i < h->n_dev; i++) h->kind->free(h->dev[i].impl, h->dev[i].p, h->dev[i].bytes);
    h->n_dev = 0;
}

void *chk_in(struct chk *h, const void *host)
{
    if (!host || !mirrored(h)) return (void *)host;
    const uint8_t *p = host;
    for (size_t i = 0; i < h->n_mem; i++) {
        const uint8_t *b = h->mem[i].p;
        if (p < b || p >= b + (h->mem[i].bytes ? h->mem[i].bytes : 1)) continue;
        for (size_t j = 0; j < h->n_dev; j++)
            if (h->dev[j].of == i) return (uint8_t *)h->dev[j].p + (p - b);
        uint8_t *d = dev_alloc(h, h->mem[i].bytes, i);
        h->kind->upload(h->be.impl, d, b, h->mem[i].bytes);
        return d + (p - b);
    }
    DSV4_ASSERT(!"op_check: chk_in of memory that is not the case's");
    return NULL;
}

void *chk_work(struct chk *h, size_t bytes)
{
    return mirrored(h) ? dev_alloc(h, bytes, SIZE_MAX) : chk_alloc(h, bytes);
}

void *chk_alloc(struct chk *h, size_t bytes)
{
    void *p = raw_alloc(h, bytes);
    memset(p, 0, bytes);
    return p;
}

float *chk_floats(struct chk *h, size_t n)
{
    return chk_alloc(h, n * sizeof(float));
}

uint64_t chk_u64(struct chk *h)
{
    /* splitmix64 */
    uint64_t z = (h->seed += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double chk_uniform(struct chk *h)
{
    return (double)(chk_u64(h) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

void chk_fill_bf16(struct chk *h, float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) x[i] = dsv4_round_bf16((float)chk_uniform(h) * amp);
}

struct dsv4_plan_dims chk_dims(void)
{
    return (struct dsv4_plan_dims){ 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0 };
}

/* ------------------------------------------------------------------ reporting */

static struct dsv4_check_cell *cell(struct chk *h)
{
    return &h->r->cell[h->op][h->level];
}

void chk_fail(struct chk *h, const char *fmt, ...)
{
    if (h->level < 0 || h->level >= h->n_levels) return; /* only runs of a level are judged */
    struct dsv4_check_cell *c = cell(h);
    if (c->status != DSV4_CHECK_FAIL) {
        int n = snprintf(c->why, sizeof(c->why), "%s%s: ", h->what, h->variant ? " (prepared weights)" : "");
        if (n > 0 && (size_t)n < sizeof(c->why)) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->why + n, sizeof(c->why) - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    c->status     = DSV4_CHECK_FAIL;
    h->run_failed = true;
}

void chk_note(struct chk *h, size_t values, size_t differ, double max_abs, double max_used)
{
    if (h->level < 0 || h->level >= h->n_levels) return;
    struct dsv4_check_cell *c = cell(h);
    c->values += values;
    c->differ += differ;
    if (max_abs > c->max_abs) c->max_abs = max_abs;
    if (max_used > c->max_used) c->max_used = max_used;
    if (max_used > h->run_used) h->run_used = max_used;
}

/* Fails the check of one level (no run) with a reason, e.g. its context cannot be made. */
static void fail_level(struct chk *h, int level, int variant, const char *why)
{
    int l = h->level, v = h->variant;
    h->level = level, h->variant = variant;
    chk_fail(h, "%s", why);
    h->level = l, h->variant = v;
}

/* ------------------------------------------------------------------ slots */

static struct slot *slot_for(struct chk *h, int i, enum slot_kind kind, size_t n, size_t elem)
{
    if (i < 0 || i >= MAX_SLOTS) {
        DSV4_ASSERT(!"op_check: slot index out of range");
    }
    struct slot *s = &h->slot[i];
    if (h->level < 0) {
        *s = (struct slot){ .kind = kind, .n = n, .elem = elem };
        s->ref = raw_alloc(h, n * elem);
        return s;
    }
    /* the same slot as the reference's run: the case asks for the same outputs every run */
    DSV4_ASSERT(s->ref && s->kind == kind && s->n == n);
    s->got = raw_alloc(h, n * elem);
    return s;
}

static void *slot_buf(struct chk *h, struct slot *s, const void *init)
{
    void *p = h->level < 0 ? s->ref : s->got;
    if (init) memcpy(p, init, s->n * s->elem);
    else memset(p, 0xa5, s->n * s->elem); /* floats: a NaN; ints: negative */
    if (!mirrored(h)) return p;
    /* the op writes the backend's buffer, starting from the same bytes; got gets them back */
    s->dev = dev_alloc(h, s->n * s->elem, SIZE_MAX);
    h->kind->upload(h->be.impl, s->dev, p, s->n * s->elem);
    return s->dev;
}

/* The outputs of a mirrored run, downloaded into the slots' got, then waited for. */
static void read_back(struct chk *h)
{
    if (!mirrored(h)) return;
    for (int i = 0; i < MAX_SLOTS; i++)
        if (h->slot[i].got && h->slot[i].dev)
            h->kind->download(h->be.impl, h->slot[i].got, h->slot[i].dev, h->slot[i].n * h->slot[i].elem);
    h->kind->sync(h->be.impl);
}

float *chk_out_f32(struct chk *h, int i, size_t n, struct chk_tol tol, const float *init, const float *mag)
{
    struct slot *s = slot_for(h, i, SLOT_F32, n, sizeof(float));
    s->tol         = tol;
    s->mag         = mag;
    return slot_buf(h, s, init);
}

int *chk_out_int(struct chk *h, int i, size_t n, const int *init)
{
    return slot_buf(h, slot_for(h, i, SLOT_INT, n, sizeof(int)), init);
}

uint8_t *chk_out_bytes(struct chk *h, int i, size_t n, const uint8_t *init)
{
    return slot_buf(h, slot_for(h, i, SLOT_BYTES, n, 1), init);
}

const void *chk_ref(const struct chk *h, int i)
{
    return h->slot[i].ref;
}

const void *chk_got(const struct chk *h, int i)
{
    return h->slot[i].got;
}

void chk_custom(struct chk *h, void (*fn)(struct chk *h, void *ud), void *ud)
{
    h->custom    = fn;
    h->custom_ud = ud;
}

static bool tol_exact(struct chk_tol t)
{
    return t.rel == 0 && t.abs == 0 && t.mag == 0;
}

void chk_compare_slot(struct chk *h, int i)
{
    struct slot *s = &h->slot[i];
    if (!s->ref || !s->got) return;
    size_t differ = 0, bad = 0, first = 0;
    double max_abs = 0, max_used = 0, fa = 0, fb = 0, fl = 0;
    for (size_t k = 0; k < s->n; k++) {
        if (!memcmp((const uint8_t *)s->ref + k * s->elem, (const uint8_t *)s->got + k * s->elem, s->elem)) continue;
        differ++;
        double r, g, allowed = 0;
        if (s->kind == SLOT_F32) {
            r = ((const float *)s->ref)[k], g = ((const float *)s->got)[k];
            allowed = s->tol.rel * fabs(r) + s->tol.abs + (s->mag ? s->tol.mag * s->mag[k] : 0);
        } else if (s->kind == SLOT_INT) {
            r = ((const int *)s->ref)[k], g = ((const int *)s->got)[k];
        } else {
            r = ((const uint8_t *)s->ref)[k], g = ((const uint8_t *)s->got)[k];
        }
        double e = fabs(g - r);
        if (isnan(r) && isnan(g) && !tol_exact(s->tol)) e = 0; /* any NaN for a NaN, where not bit-exact */
        bool ok = s->kind == SLOT_F32 && !tol_exact(s->tol) && e <= allowed;
        if (!isnan(e) && e > max_abs) max_abs = e;
        if (ok && allowed > 0 && e / allowed > max_used) max_used = e / allowed;
        if (!ok && bad++ == 0) first = k, fa = g, fb = r, fl = allowed;
    }
    chk_note(h, s->n, differ, max_abs, max_used);
    if (bad > (size_t)s->tol.bad_per_mille * s->n / 1000) {
        if (s->kind == SLOT_F32 && !tol_exact(s->tol))
            chk_fail(h, "output %d: %zu of %zu values off, first [%zu] %.9g, reference %.9g (allowed %.3g)", i, bad,
                     s->n, first, fa, fb, fl);
        else
            chk_fail(h, "output %d: %zu of %zu values not identical, first [%zu] %.9g, reference %.9g", i, bad, s->n,
                     first, fa, fb);
    }
}

/* ------------------------------------------------------------------ runs */

static const struct dsv4_backend_ops *level_ops(struct chk *h, void *impl)
{
    return h->level < 0 ? &dsv4_cpu_ref_ops : h->kind->ops(impl);
}

/* Every projection of the case into prepare_weights. */
static void each_weight(void *ctx, void (*fn)(struct dsv4_linear *l, void *ud), void *ud)
{
    struct chk *h = ctx;
    for (int i = 0; i < h->n_w; i++) fn(h->w[i], ud);
}

/* The other tables of the case (norm weights, mixers, sinks, APE, frequencies, routing
 * tables) are not offered: a backend that keeps them in its memory gets them through chk_in,
 * uploaded per run, as it gets activations. */
static void each_no_tensor(void *ctx, void (*fn)(const void **t, size_t bytes, void *ud), void *ud)
{
    (void)ctx, (void)fn, (void)ud;
}

/* The options of a context of level l (backend.h: the two keys every backend takes): the
 * level ("default" for a kind without levels: none) and whether weights may be repacked. */
static void level_opts(const struct chk *h, int l, bool tiles, char *buf, size_t cap)
{
    if (strcmp(h->lv[l].name, "default")) snprintf(buf, cap, "level=%s,tiles=%d", h->lv[l].name, tiles);
    else snprintf(buf, cap, "tiles=%d", tiles);
}

/* A level refused the case's weights as unsupported (a format it does not take): counted and
 * the first message kept, the case not run there. */
static void note_refusal(struct chk *h, int l, const char *msg)
{
    struct dsv4_check_cell *c = &h->r->cell[h->op][l];
    if (!c->refused++) snprintf(c->refusal, sizeof(c->refusal), "%.60s: %.130s", h->what, msg);
}

/* A fresh context of level l for a case with weights, prepared with or without tiles;
 * false when it could not be made (a failure is recorded) or, for the prepared layout, when
 * preparing left every descriptor as it was (nothing more to check). */
static bool make_weight_ctx(struct chk *h, int l, bool tiles)
{
    char opts[64];
    level_opts(h, l, tiles, opts, sizeof(opts));
    struct dsv4_backend_params p = { .opts = opts, .n_threads = h->o->n_threads ? h->o->n_threads : 2 };
    struct dsv4_err            err;
    if (h->kind->create(&h->run_impl, &p, &err)) {
        h->run_impl = NULL;
        fail_level(h, l, tiles, err.msg);
        return false;
    }
    struct dsv4_checkpoint none;
    memset(&none, 0, sizeof(none)); /* no stored tiles to find, no tensors to read ahead */
    struct dsv4_weight_set ws = { .ck = &none, .each_linear = each_weight, .each_tensor = each_no_tensor, .ctx = h };
    for (int i = 0; i < h->n_w; i++) h->saved[i] = *h->w[i];
    int  rc      = h->kind->prepare_weights ? h->kind->prepare_weights(h->run_impl, &ws, &p, &err) : DSV4_OK;
    bool changed = false;
    for (int i = 0; i < h->n_w; i++) changed |= memcmp(&h->saved[i], h->w[i], sizeof(struct dsv4_linear)) != 0;
    if (rc || (tiles && !changed)) {
        if (rc == DSV4_EUNSUPPORTED) note_refusal(h, l, err.msg);
        else if (rc) fail_level(h, l, tiles, err.msg);
        for (int i = 0; i < h->n_w; i++) *h->w[i] = h->saved[i];
        h->kind->destroy(h->run_impl);
        h->run_impl = NULL;
        return false;
    }
    return true;
}

static void start_run(struct chk *h, void *impl)
{
    const struct dsv4_backend_kind *k = h->level < 0 ? h->cpu : h->kind;
    size_t                          n = k->scratch_floats(impl, &h->dims);
    h->be      = (struct dsv4_backend){ .ops = level_ops(h, impl), .impl = impl, .scratch_len = n };
    h->scratch = mirrored(h) ? dev_alloc(h, (n ? n : 1) * sizeof(float), SIZE_MAX)
                             : raw_alloc(h, (n ? n : 1) * sizeof(float));
    h->be.scratch = h->scratch;
    if (h->level >= 0 && h->o->profile) {
        /* one profiler per op table: a level with another table starts a new trace */
        if (h->prof && h->prof_inner != h->be.ops) {
            dsv4_prof_finish(h->prof, NULL);
            h->prof = NULL;
        }
        if (!h->prof) {
            h->prof       = dsv4_prof_create(h->o->profile, h->be.ops, (size_t)1 << 18);
            h->prof_inner = h->be.ops;
        }
        if (h->prof) {
            h->be.ops  = &dsv4_prof_ops;
            h->be.prof = h->prof;
        }
    }
    if (h->level >= 0) {
        struct dsv4_check_cell *c = cell(h);
        if (c->status == DSV4_CHECK_NOT_RUN) c->status = DSV4_CHECK_OK;
        c->runs++;
        h->run_failed = false;
        h->run_used   = 0;
    }
}

static void end_run(struct chk *h)
{
    if (h->level >= 0 && h->level < h->n_levels && h->scratch) {
        struct dsv4_check_cell *c      = cell(h);
        size_t                  differ = c->differ;
        read_back(h);
        if (h->custom) h->custom(h, h->custom_ud);
        else
            for (int i = 0; i < MAX_SLOTS; i++) chk_compare_slot(h, i);
        if (h->o->verbose)
            fprintf(h->o->verbose, "  %-15s %-11s %s%s: %s (%zu values differ, largest %.0f%% of the tolerance)\n",
                    dsv4_op_name(h->op), h->lv[h->level].name, h->what, h->variant ? " (prepared weights)" : "",
                    h->run_failed ? "FAIL" : "ok", c->differ - differ, 100 * h->run_used);
        for (int i = 0; i < MAX_SLOTS; i++) h->slot[i].got = h->slot[i].dev = NULL;
    }
    free_dev(h);
    h->scratch = NULL; /* freed with the case, or with the run's buffers */
    if (h->run_impl) {
        for (int i = 0; i < h->n_w; i++) *h->w[i] = h->saved[i];
        h->kind->destroy(h->run_impl);
        h->run_impl = NULL;
    }
}

static void end_case(struct chk *h)
{
    for (size_t i = 0; i < h->n_mem; i++) free(h->mem[i].p);
    h->n_mem = 0;
    h->open  = false;
}

void chk_case(struct chk *h, const struct dsv4_plan_dims *dims, const char *fmt, ...)
{
    if (h->open) end_case(h);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->what, sizeof(h->what), fmt, ap);
    va_end(ap);
    h->open    = true;
    h->dims    = *dims;
    h->n_w     = 0;
    h->custom  = NULL;
    h->level   = -2;
    h->variant = 0;
    memset(h->slot, 0, sizeof(h->slot));
    /* the inputs of a case depend only on the op and the case's place in its table */
    h->seed = 0x5eedull * 1000003u + (unsigned long long)h->op * 7919u + (unsigned long long)h->n_cases++;
}

void chk_weights(struct chk *h, struct dsv4_linear *const *ls, int n)
{
    DSV4_ASSERT(n <= MAX_WEIGHTS);
    for (int i = 0; i < n; i++) h->w[i] = ls[i];
    h->n_w = n;
}

bool chk_is_reference(const struct chk *h)
{
    return h->level == -1;
}

struct dsv4_backend *chk_next(struct chk *h)
{
    end_run(h);
    if (h->level == -2) {
        h->level = -1;
        if (!dsv4_op_entry(&dsv4_cpu_ref_ops, h->op)) {
            for (int l = 0; l < h->n_levels; l++)
                if (h->lv[l].here) fail_level(h, l, 0, "the reference table has no entry for this op");
            end_case(h);
            return NULL;
        }
        start_run(h, h->ref_impl);
        return &h->be;
    }
    for (;;) {
        /* next (level, variant): the release layout, then prepared weights where they differ */
        if (h->level >= 0 && h->variant == 0 && h->n_w > 0) h->variant = 1;
        else h->level++, h->variant = 0;
        if (h->level >= h->n_levels) {
            end_case(h);
            return NULL;
        }
        struct level *L = &h->lv[h->level];
        if (!L->here) continue;
        if (!dsv4_op_entry(h->kind->ops(L->impl), h->op)) {
            h->r->cell[h->op][h->level].status = DSV4_CHECK_MISSING;
            h->variant = 1; /* the next step moves to the next level */
            continue;
        }
        if (h->n_w > 0) {
            if (!make_weight_ctx(h, h->level, h->variant == 1)) continue;
            start_run(h, h->run_impl);
        } else {
            start_run(h, L->impl);
        }
        return &h->be;
    }
}

/* ------------------------------------------------------------------ the check */

static const struct chk_op *find_spec(enum dsv4_op op)
{
    const struct chk_op *tables[] = { chk_ops_rows, chk_ops_kv, chk_ops_moe };
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (const struct chk_op *s = tables[t]; s->run; s++)
            if (s->op == op) return s;
    return NULL;
}

const char *dsv4_op_check_tolerance(enum dsv4_op op)
{
    const struct chk_op *s = find_spec(op);
    return s ? s->tol : "(no cases)";
}

static void run_op(struct chk *h, const struct chk_op *spec)
{
    if (setjmp(h->oom)) {
        /* out of memory inside a case: what the case made is freed, the op fails */
        h->scratch = NULL;
        free_dev(h);
        if (h->run_impl) {
            for (int i = 0; i < h->n_w; i++) *h->w[i] = h->saved[i];
            h->kind->destroy(h->run_impl);
            h->run_impl = NULL;
        }
        end_case(h);
        for (int l = 0; l < h->n_levels; l++)
            if (h->lv[l].here) fail_level(h, l, 0, "out of memory");
        return;
    }
    spec->run(h);
    if (h->open) end_case(h);
}

static int setup_levels(struct chk *h, struct dsv4_err *err)
{
    const struct dsv4_backend_kind *k = h->kind;
    if (h->o->level) {
        /* one level: whether the machine has it, from the kind's list ("ref" is not listed) */
        bool here = true, h2;
        for (int i = 0; k->level && k->level(i, &h2); i++)
            if (!strcmp(k->level(i, &h2), h->o->level)) here = h2;
        snprintf(h->lv[0].name, sizeof(h->lv[0].name), "%s", h->o->level);
        h->lv[0].here = here;
        h->n_levels   = 1;
    } else if (k->level) {
        bool here;
        for (int i = 0; h->n_levels < DSV4_CHECK_MAX_LEVELS && k->level(i, &here); i++) {
            snprintf(h->lv[h->n_levels].name, sizeof(h->lv[0].name), "%s", k->level(i, &here));
            h->lv[h->n_levels++].here = here;
        }
    } else {
        snprintf(h->lv[0].name, sizeof(h->lv[0].name), "default");
        h->lv[0].here = true;
        h->n_levels   = 1;
    }
    for (int l = 0; l < h->n_levels; l++) {
        if (!h->lv[l].here) continue;
        char opts[64];
        level_opts(h, l, true, opts, sizeof(opts));
        struct dsv4_backend_params p = { .opts = opts, .n_threads = h->o->n_threads ? h->o->n_threads : 2 };
        int rc = k->create(&h->lv[l].impl, &p, err);
        if (rc) return rc;
    }
    return DSV4_OK;
}

int dsv4_op_check(const struct dsv4_check_opts *o, struct dsv4_check_report *r, struct dsv4_err *err)
{
    memset(r, 0, sizeof(*r));
    struct chk *h = calloc(1, sizeof(*h));
    if (!h) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    h->o    = o;
    h->r    = r;
    h->kind = o->kind ? o->kind : dsv4_backend_find(o->backend);
    h->cpu  = dsv4_backend_find("cpu");
    int rc  = DSV4_OK;
    if (!h->kind || !h->cpu) {
        rc = dsv4_err_set(err, DSV4_EINVAL, "this build has no backend '%s'", o->backend ? o->backend : "cpu");
        goto out;
    }
    struct dsv4_backend_params rp = { .opts = "level=ref", .n_threads = 1 };
    if ((rc = h->cpu->create(&h->ref_impl, &rp, err))) goto out;
    if ((rc = setup_levels(h, err))) goto out;
    void *best = NULL; /* the describe line of the highest level run */
    for (int l = 0; l < h->n_levels; l++) best = h->lv[l].impl ? h->lv[l].impl : best;
    if (best) {
        h->kind->describe(best, r->backend, sizeof(r->backend));
        size_t n = strlen(r->backend);
        snprintf(r->backend + n, sizeof(r->backend) - n, " (the highest level run)");
    } else {
        snprintf(r->backend, sizeof(r->backend), "%s (no level asked for runs on this machine)", h->kind->name);
    }
    r->n_levels = h->n_levels;
    for (int l = 0; l < h->n_levels; l++) {
        snprintf(r->level[l], sizeof(r->level[l]), "%s", h->lv[l].name);
        r->here[l] = h->lv[l].here;
    }
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        if (o->op >= 0 && o->op != op) continue;
        r->selected[op] = true;
        h->op           = (enum dsv4_op)op;
        h->n_cases      = 0;
        const struct chk_op *spec = find_spec((enum dsv4_op)op);
        if (!spec) {
            for (int l = 0; l < h->n_levels; l++)
                if (h->lv[l].here) fail_level(h, l, 0, "the op checker has no cases for this op");
            continue;
        }
        run_op(h, spec);
    }
out:
    if (h->prof) dsv4_prof_finish(h->prof, NULL);
    for (int l = 0; l < h->n_levels; l++)
        if (h->lv[l].impl) h->kind->destroy(h->lv[l].impl);
    if (h->ref_impl) h->cpu->destroy(h->ref_impl);
    free(h->mem);
    free(h->dev);
    free(h);
    return rc;
}

int dsv4_op_check_failures(const struct dsv4_check_report *r)
{
    int n = 0;
    for (int op = 0; op < DSV4_OP_COUNT; op++)
        for (int l = 0; l < r->n_levels; l++)
            n += r->cell[op][l].status == DSV4_CHECK_FAIL || r->cell[op][l].status == DSV4_CHECK_MISSING;
    return n;
}

void dsv4_op_check_print(const struct dsv4_check_report *r, FILE *f)
{
    fprintf(f, "%s against the scalar reference (cpu ref)\n", r->backend);
    fprintf(f, "%-15s", "op");
    for (int l = 0; l < r->n_levels; l++) fprintf(f, " %-11s", r->level[l]);
    fprintf(f, " tolerance\n");
    int n_ok = 0, n_absent = 0;
    for (int l = 0; l < r->n_levels; l++) n_absent += !r->here[l];
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        if (!r->selected[op]) continue;
        fprintf(f, "%-15s", dsv4_op_name((enum dsv4_op)op));
        for (int l = 0; l < r->n_levels; l++) {
            const struct dsv4_check_cell *c = &r->cell[op][l];
            char                          s[24];
            switch (c->status) {
            case DSV4_CHECK_OK:
                if (!c->differ) snprintf(s, sizeof(s), "exact");
                else if (c->max_used > 0) snprintf(s, sizeof(s), "ok %.0f%%", c->max_used < 0.01 ? 1 : 100 * c->max_used);
                else snprintf(s, sizeof(s), "ok");
                n_ok++;
                break;
            case DSV4_CHECK_FAIL: snprintf(s, sizeof(s), "FAIL"); break;
            case DSV4_CHECK_MISSING: snprintf(s, sizeof(s), "missing"); break;
            default: snprintf(s, sizeof(s), "-"); break;
            }
            fprintf(f, " %-11s", s);
        }
        fprintf(f, " %s\n", dsv4_op_check_tolerance((enum dsv4_op)op));
    }
    fprintf(f, "exact: every output bit-identical to the reference; ok N%%: within the tolerance, the largest "
               "difference N%% of the one allowed there; -: not run (the CPU lacks the level)\n");
    int n_fail = dsv4_op_check_failures(r);
    for (int op = 0; op < DSV4_OP_COUNT; op++)
        for (int l = 0; l < r->n_levels; l++) {
            const struct dsv4_check_cell *c = &r->cell[op][l];
            if (c->status == DSV4_CHECK_FAIL)
                fprintf(f, "FAIL %s at %s: %s\n", dsv4_op_name((enum dsv4_op)op), r->level[l], c->why);
            else if (c->status == DSV4_CHECK_MISSING)
                fprintf(f, "FAIL %s at %s: missing from the backend's op table\n", dsv4_op_name((enum dsv4_op)op),
                        r->level[l]);
            if (c->refused)
                fprintf(f, "refused %s at %s: %d case%s, the first %s\n", dsv4_op_name((enum dsv4_op)op), r->level[l],
                        c->refused, c->refused == 1 ? "" : "s", c->refusal);
        }
    if (n_fail) fprintf(f, "%d of %d op checks failed\n", n_fail, n_fail + n_ok);
    else fprintf(f, "all %d op checks passed (%d level%s not on this machine)\n", n_ok, n_absent, n_absent == 1 ? "" : "s");
}
