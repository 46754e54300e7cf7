/*
 * dump.c - the stage dumps of a step (dsv4 align, the stage tests) on any backend.
 *
 * The dumped tensors live in step buffers, the backend's memory. A host-visible backend's
 * rows are handed to the sink in place; any other backend's are downloaded first into a host
 * buffer of the step, allocated when the sink is set (never while decoding), sized for the
 * widest rows a step dumps. The downloads are not counted as the step's transfers: a step
 * without a sink makes none.
 */
#include <stdlib.h>

#include "model/runtime.h"

/* The widest row of floats a stage dump of backend memory carries (forward.c, attention.c,
 * compress.c; the logits are dumped from the caller's host buffer). */
static size_t widest_row(const struct dsv4_config *c)
{
    size_t w = (size_t)c->hc * (size_t)c->d_model;
    size_t cand[] = { (size_t)c->n_head * (size_t)c->d_head, (size_t)c->q_lora_rank, (size_t)c->d_head,
                      (size_t)c->d_idx_head, (size_t)c->d_model };
    for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++)
        if (cand[i] > w) w = cand[i];
    return w;
}

int dsv4_step_set_dump(struct dsv4_step *S, struct dsv4_dump_sink sink, struct dsv4_err *err)
{
    S->dump = sink;
    if (!sink.fn || S->m->backend->host_visible || S->dump_host) return DSV4_OK;
    size_t n = (size_t)S->max_rows * widest_row(&S->m->cfg);
    S->dump_host = malloc(sizeof(float) * n);
    if (!S->dump_host) {
        S->dump = (struct dsv4_dump_sink){ NULL, NULL };
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a %.1f MiB dump buffer",
                            (double)(sizeof(float) * n) / 1048576.0);
    }
    S->dump_floats = n;
    return DSV4_OK;
}

void dsv4_dump_read(struct dsv4_step *S, void *dst, const void *src, size_t bytes)
{
    const struct dsv4_model *m = S->m;
    m->backend->download(m->backend_impl, dst, src, bytes);
    m->backend->sync(m->backend_impl);
}

void dsv4_dump_dev(struct dsv4_step *S, const char *stage, int il, int seq, int pos, int n, int width,
                   const float *data)
{
    if (!S->dump.fn) return;
    size_t floats = (size_t)n * (size_t)width;
    if (!S->m->backend->host_visible) {
        DSV4_ASSERT(floats <= S->dump_floats);
        dsv4_dump_read(S, S->dump_host, data, sizeof(float) * floats);
        data = S->dump_host;
    }
    S->dump.fn(S->dump.ud, stage, il, seq, pos, n, width, data);
}
