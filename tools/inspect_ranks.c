/*
 * inspect_ranks.c - `dsv4 inspect --ranks N`: memory per rank of expert parallelism
 * (src/model/rank_plan.h has the layout), from a checkpoint's tensors or, with --config, from
 * the tensors the config implies (the official Flash and Pro configs are in models/configs/).
 * KV and scratch are sized for the default backend as this machine creates it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect_ranks.h"

/* The default backend, created as an engine would (its level, all threads). */
static int open_backend(const struct dsv4_backend_kind **kind, void **impl, char *desc, size_t cap,
                        struct dsv4_err *err)
{
    *kind = dsv4_backend_find(NULL);
    if (!*kind) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this build has no backend");
    struct dsv4_backend_params bp = { .opts = NULL, .n_threads = 0, .lg = NULL, .profile = false };
    int                        rc = (*kind)->create(impl, &bp, err);
    if (rc == DSV4_OK) {
        char d[100];
        (*kind)->describe(*impl, d, sizeof(d));
        snprintf(desc, cap, "%s", d);
    }
    return rc;
}

static int report_begin(struct rank_report *r, const struct dsv4_config *c, struct dsv4_err *err)
{
    int rc = dsv4_rank_params_check(c, &r->p, err);
    if (rc) return rc;
    r->mem = calloc((size_t)r->p.n_ranks, sizeof(*r->mem));
    if (!r->mem) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    dsv4_rank_mem_init(c, &r->p, r->mem);
    return DSV4_OK;
}

int rank_report_checkpoint(struct rank_report *r, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                           struct dsv4_weights *w, struct dsv4_err *err)
{
    int rc = report_begin(r, c, err);
    if (rc) return rc;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t = &ck->tensors[i];
        if (strncmp(t->name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) == 0) continue; /* alignment padding */
        dsv4_rank_add_tensor(c, &r->p, r->mem, t->name, t->nbytes);
        r->n_tensors++;
    }
    const struct dsv4_backend_kind *kind;
    void                           *impl;
    if ((rc = open_backend(&kind, &impl, r->backend, sizeof(r->backend), err))) return rc;
    dsv4_rank_add_repack(c, &r->p, r->mem, w, ck, kind, impl);
    r->repack_known = true;
    rc              = dsv4_rank_plan_finish(c, &r->p, r->mem, kind, impl, &r->single, err);
    kind->destroy(impl);
    return rc;
}

struct layout_sum {
    struct rank_report       *r;
    const struct dsv4_config *c;
};

static void add_layout(void *ud, const char *name, enum dsv4_dtype dtype, int ndim, const int64_t shape[2])
{
    struct layout_sum *L = ud;
    uint64_t           n = (uint64_t)shape[0] * (ndim > 1 ? (uint64_t)shape[1] : 1);
    dsv4_rank_add_tensor(L->c, &L->r->p, L->r->mem, name, n * dsv4_dtype_size(dtype));
    L->r->n_tensors++;
}

int rank_report_config(struct rank_report *r, const struct dsv4_config *c, struct dsv4_err *err)
{
    int rc = report_begin(r, c, err);
    if (rc) return rc;
    struct layout_sum L = { r, c };
    if ((rc = dsv4_weights_layout(c, true, add_layout, &L, err))) return rc;
    const struct dsv4_backend_kind *kind;
    void                           *impl;
    if ((rc = open_backend(&kind, &impl, r->backend, sizeof(r->backend), err))) return rc;
    rc = dsv4_rank_plan_finish(c, &r->p, r->mem, kind, impl, &r->single, err);
    kind->destroy(impl);
    return rc;
}

void rank_report_free(struct rank_report *r)
{
    free(r->mem);
    r->mem = NULL;
}

static void print_row(const char *label, const struct dsv4_rank_mem *m, bool repack_known, double unit)
{
    char rp[32];
    if (repack_known) snprintf(rp, sizeof(rp), "%10.2f", (double)m->repack / unit);
    else snprintf(rp, sizeof(rp), "%10s", "-");
    printf("  %-24s %10.2f %s %10.2f %10.2f %10.2f\n", label, (double)m->weights / unit, rp,
           (double)m->kv / unit, (double)m->scratch / unit, (double)m->total / unit);
}

void rank_report_print(const struct rank_report *r)
{
    const struct dsv4_rank_params *p    = &r->p;
    bool                           gib  = r->single.total >= (10ull << 30);
    double                         unit = gib ? 1073741824.0 : 1048576.0;
    printf("\nranks        %d: rank r owns routed experts [floor(r*E/N), floor((r+1)*E/N)) of every MoE layer (MTP "
           "included); rank 0 holds every other weight, the KV cache and the step's scratch\n",
           p->n_ranks);
    printf("             KV for --ctx %d --seqs %d, scratch for --step-tokens %d, sized for %s\n", p->ctx, p->seqs,
           p->step_tokens, r->backend);
    if (!r->repack_known)
        printf("             repack: unknown without the weights (the CPU level's tiles depend on the scale values; "
               "they take about the bytes of the tensors they replace)\n");
    printf("  %-24s %10s %10s %10s %10s %10s  (%s)\n", "rank  experts", "weights", "repack", "KV", "scratch",
           "total", gib ? "GiB" : "MiB");
    for (int i = 0; i < p->n_ranks; i++) {
        char label[40];
        snprintf(label, sizeof(label), "%-5d %d..%d", i, r->mem[i].e0, r->mem[i].e1 - 1);
        print_row(label, &r->mem[i], r->repack_known, unit);
    }
    print_row("single process", &r->single, r->repack_known, unit);
}

static json_t *mem_json(const struct dsv4_rank_mem *m, bool repack_known)
{
    return json_pack("{s:[i,i], s:I, s:I, s:o, s:I, s:I, s:I}", "experts", m->e0, m->e1, "weights_bytes",
                     (json_int_t)m->weights, "expert_bytes", (json_int_t)m->experts, "repack_bytes",
                     repack_known ? json_integer((json_int_t)m->repack) : json_null(), "kv_bytes", (json_int_t)m->kv,
                     "scratch_bytes", (json_int_t)m->scratch, "total_bytes", (json_int_t)m->total);
}

json_t *rank_report_json(const struct rank_report *r)
{
    json_t *per = json_array();
    for (int i = 0; i < r->p.n_ranks; i++) {
        json_t *m = json_pack("{s:i}", "rank", i), *sizes = mem_json(&r->mem[i], r->repack_known);
        json_object_update(m, sizes);
        json_decref(sizes);
        json_array_append_new(per, m);
    }
    return json_pack("{s:i, s:i, s:i, s:i, s:s, s:o, s:o}", "n", r->p.n_ranks, "ctx", r->p.ctx, "seqs", r->p.seqs,
                     "step_tokens", r->p.step_tokens, "backend", r->backend, "per_rank", per, "single_process",
                     mem_json(&r->single, r->repack_known));
}
