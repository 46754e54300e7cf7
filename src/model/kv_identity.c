/*
 * kv_identity.c - the identity of a model's prefix-cache payloads on disk (kv_tier.h): a
 * SHA-256 over everything that decides what a page and a snapshot hold and how they are laid
 * out, so that a record written by another model, revision, checkpoint layout or build of
 * the KV layout is never read back.
 *
 * Hashed, as text: the payload version, the revision, the row format, whether the
 * checkpoint has MTP and whether the snapshots carry its state, DSV4_SPEC_MAX_DRAFT (ring
 * rows), the page size, page and snapshot bytes, the KV dims, the bytes of config.json,
 * every tensor's name, dtype and shape, and a sample of its data: its first and last 64 bytes
 * (a fine-tune or a re-conversion with the same shapes changes them; hashing every weight
 * would cost a full read of the checkpoint at every start-up). And `compute`: the backend,
 * its level and the options that choose kernels (the caller's text), since the levels agree
 * to a tolerance, not to the bit (docs/BACKENDS.md): KV written at one level and resumed at
 * another would not be the bits a cold run there computes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_disk.h"
#include "model/runtime.h"

/* bump when kv.h's page or snapshot layout, or the meaning of a key, changes (2: SHA-256 chain keys) */
enum { KV_PAYLOAD_VERSION = 2 };

struct text {
    char  *p;
    size_t n, cap;
    bool   oom;
};

static void put(struct text *t, const void *bytes, size_t n)
{
    if (t->oom) return;
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->n + n) cap *= 2;
        char *q = realloc(t->p, cap);
        if (!q) {
            t->oom = true;
            return;
        }
        t->p = q, t->cap = cap;
    }
    memcpy(t->p + t->n, bytes, n);
    t->n += n;
}

/* "name value\n" */
static void putv(struct text *t, const char *name, long long v)
{
    char line[160];
    int  n = snprintf(line, sizeof(line), "%s %lld\n", name, v);
    put(t, line, (size_t)n);
}

static void put_config(struct text *t, const struct dsv4_model *m)
{
    char *path = dsv4_path_join(m->ck.dir, "config.json"), *text = NULL;
    size_t len = 0;
    struct dsv4_err err;
    if (path && dsv4_read_file(path, &text, &len, 16u << 20, &err) == DSV4_OK) put(t, text, len);
    else put(t, "no config.json\n", 15); /* a single-file checkpoint: the dims and tensors below */
    free(text);
    free(path);
}

/* A tensor's first and last 64 bytes (fewer when it is smaller). */
static void put_sample(struct text *t, const struct dsv4_tensor *tn)
{
    if (!tn->data || !tn->nbytes) return;
    size_t n = tn->nbytes < 64 ? tn->nbytes : 64;
    put(t, tn->data, n);
    put(t, (const uint8_t *)tn->data + tn->nbytes - n, n);
}

int dsv4_model_kv_identity(const struct dsv4_model *m, const char *compute, bool mtp_state, int page_tokens,
                           size_t page_bytes, size_t snap_bytes, uint8_t out[DSV4_KV_DISK_ID_BYTES])
{
    struct text               t = { 0 };
    const struct dsv4_kv_dims *k = &m->cfg.kv;
    putv(&t, "dsv4 kv payload", KV_PAYLOAD_VERSION);
    put(&t, compute, strlen(compute));
    put(&t, "\n", 1);
    putv(&t, "revision", m->revision);
    putv(&t, "row_fmt", m->row_fmt);
    putv(&t, "has_mtp", m->w.has_mtp);
    putv(&t, "mtp_state", mtp_state);
    putv(&t, "spec_max_draft", DSV4_SPEC_MAX_DRAFT);
    putv(&t, "page_tokens", page_tokens);
    putv(&t, "page_bytes", (long long)page_bytes);
    putv(&t, "snap_bytes", (long long)snap_bytes);
    const int dims[] = { k->n_layer, k->n_mtp, k->window, k->d_model, k->hc, k->d_head, k->d_rope, k->d_idx_head };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) putv(&t, "dim", dims[i]);
    for (int il = 0; il < k->n_layer + k->n_mtp; il++) putv(&t, "ratio", k->kind[il].ratio);
    put_config(&t, m);
    for (size_t i = 0; i < m->ck.n_tensors; i++) {
        const struct dsv4_tensor *tn = &m->ck.tensors[i];
        char                      shape[256];
        put(&t, tn->name, strlen(tn->name));
        put(&t, " ", 1);
        put(&t, dsv4_dtype_name(tn->dtype), strlen(dsv4_dtype_name(tn->dtype)));
        put(&t, " ", 1);
        dsv4_shape_str(tn->ndim, tn->shape, shape, sizeof(shape));
        put(&t, shape, strlen(shape));
        put(&t, "\n", 1);
        put_sample(&t, tn);
    }
    if (t.oom) {
        free(t.p);
        return DSV4_ENOMEM;
    }
    dsv4_kv_disk_identity(t.p, t.n, out);
    free(t.p);
    return DSV4_OK;
}
