/*
 * ep_stage.c - host copies of a MoE layer's buffers for expert parallelism on a backend whose
 * memory the host cannot read (cpu-staged, Vulkan; ep_proto.h: struct ep_stage). MPI sends
 * and receives host memory: on such a backend the rows go through these copies, on the CPU
 * the host pointers are the buffers themselves and nothing is copied.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist/ep_proto.h"
#include "model/runtime.h"

void ep_stage_init(struct ep_stage *st, const struct dsv4_model *m)
{
    memset(st, 0, sizeof(*st));
    st->kind   = m->backend;
    st->impl   = m->backend_impl;
    st->staged = !m->backend->host_visible;
    st->n_exp  = m->cfg.n_exp;
    st->d      = m->cfg.d_model;
    st->k      = m->cfg.n_exp_used;
}

void ep_stage_free(struct ep_stage *st)
{
    free(st->host);
    free(st->wire);
    st->wire = NULL;
    if (st->table_dev) st->kind->free(st->impl, st->table_dev, sizeof(int) * (size_t)ep_table_ints(st->n_exp));
    st->host      = NULL;
    st->table_dev = NULL;
    st->rows      = 0;
}

int ep_stage_reserve(struct ep_stage *st, int rows, int ranks, struct dsv4_err *err)
{
    if (rows <= st->rows) return DSV4_OK;
    size_t TW = (size_t)ep_table_ints(st->n_exp);
    if (!st->table_dev && !(st->table_dev = st->kind->alloc(st->impl, sizeof(int) * TW, DSV4_MEM_ACT)))
        return dsv4_err_set(err, DSV4_ENOMEM, "out of backend memory for a group table");
    size_t d = (size_t)st->d, r = (size_t)rows, pairs = r * (size_t)st->k;
    /* the most MPI carries at once: every rank's ROWS payload (tables, weights, rows), or
     * the TOKENS broadcast (rows, ids, weights), or the rows gathered back */
    size_t rows_all = sizeof(int32_t) * TW * (size_t)ranks + sizeof(float) * pairs + 2 * pairs * d;
    size_t tokens   = 2 * r * d + 8 * pairs;
    size_t bytes    = rows_all > tokens ? rows_all : tokens;
    if (bytes > INT_MAX) /* MPI counts are ints (V4-Pro: steps up to ~24 000 rows) */
        return dsv4_err_set(err, DSV4_EINVAL,
                            "a step of %d rows needs %zu MB in one MPI message, more than MPI's int counts carry: "
                            "take smaller steps (--max-batch-tokens, --chunk)", rows, bytes >> 20);
    uint8_t *wire   = malloc(bytes);
    if (!wire) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for %zu MB of expert rows", bytes >> 20);
    free(st->wire);
    st->wire       = wire;
    st->wire_bytes = bytes;
    if (!st->staged) {
        st->rows = rows;
        return DSV4_OK;
    }
    /* xe, ye [pairs, d]; row_w [pairs]; u [rows, d]; ids, rw [rows, k]; grp [TW] */
    size_t n = 2 * pairs * d + pairs + r * d + 2 * pairs + TW;
    float *h = calloc(n, sizeof(float));
    if (!h) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for %zu MB of expert rows", n * 4 >> 20);
    free(st->host);
    st->host  = h;
    st->xe    = h;
    st->ye    = st->xe + pairs * d;
    st->row_w = st->ye + pairs * d;
    st->u     = st->row_w + pairs;
    st->ids   = (int *)(void *)(st->u + r * d);
    st->rw    = (float *)(void *)(st->ids + pairs);
    st->grp   = (int *)(void *)(st->rw + pairs);
    st->rows  = rows;
    return DSV4_OK;
}

const void *ep_pull(const struct ep_stage *st, void *host, const void *dev, size_t bytes)
{
    if (!st->staged) return dev;
    if (bytes) st->kind->download(st->impl, host, dev, bytes);
    st->kind->sync(st->impl);
    return host;
}

void ep_push(const struct ep_stage *st, void *dev, const void *host, size_t bytes)
{
    if (st->staged && bytes) st->kind->upload(st->impl, dev, host, bytes);
}

void *ep_host(const struct ep_stage *st, void *host, void *dev)
{
    return st->staged ? host : dev;
}

int *ep_table_dev(const struct ep_stage *st, const int *table)
{
    /* the experts op reads its group table from backend memory */
    st->kind->upload(st->impl, st->table_dev, table, sizeof(int) * (size_t)ep_table_ints(st->n_exp));
    return st->table_dev;
}
