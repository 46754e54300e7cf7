/*
 * vk_op_step.c - step_begin: the step descriptor (backend.h) uploaded once per step into a
 * device buffer the whole-step ops of that step read (shaders/step.glsl): a header, each
 * sequence's row0 / n / p0 and the device addresses of its slot and page base, then the page
 * tables, pos, tok and each row's sequence (struct vk_step_head).
 *
 * One buffer, overwritten by each step_begin through dsv4_vk_upload, which records the copy
 * in the open command buffer in order with the ops, a barrier after each: the ops of an
 * earlier step recorded before it have read the buffer by the time the copy runs, and the
 * later step's ops see only their own descriptor, so two steps in one command buffer are
 * safe without a buffer per step. The metadata area is not used: it is reset whenever a
 * command buffer is submitted (a download inside the step). The buffer is grown when a step
 * needs more; the old one is freed only after what is recorded has finished (it may still
 * be read). One descriptor per backend: two contexts running steps at once on one backend
 * would need one per context (struct dsv4_backend holds nothing for it yet).
 *
 * Page tables, pos and tok are host arrays in the engine; when one is backend memory (some
 * op-checker cases) it is copied device to device into its place, also in order.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk.h"

/* Pages of sequence s's table the step's ops may read: those of its positions so far. */
static int seq_pages(const struct dsv4_step_desc *d, int s)
{
    const struct dsv4_step_seq *q = &d->seq[s];
    if (!q->n || !q->page || d->page_tokens <= 0) return 0;
    return (q->p0 + q->n + d->page_tokens - 1) / d->page_tokens;
}

/* A buffer of at least bytes in *buf (capacity *cap), doubling; what is recorded finishes
 * first, since it may read the old one. */
static void *grow(struct dsv4_vk *v, void **buf, size_t *cap, size_t bytes, const char *what)
{
    if (*buf && *cap >= bytes) return *buf;
    size_t want = *cap * 2 > bytes ? *cap * 2 : bytes;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_finish(v);
    pthread_mutex_unlock(&v->mu);
    if (*buf) dsv4_vk_free(v, *buf, *cap);
    *buf = dsv4_vk_alloc(v, want, DSV4_MEM_ACT);
    *cap = *buf ? want : 0;
    if (!*buf) {
        pthread_mutex_lock(&v->mu);
        dsv4_vk_fault(v, "no device memory for %s (%zu bytes)", what, want);
        pthread_mutex_unlock(&v->mu);
        return NULL;
    }
    dsv4_log(v->lg, DSV4_LOG_INFO, "vulkan: %s grown to %zu bytes", what, want);
    return *buf;
}

void *dsv4_vk_step_work(struct dsv4_vk *v, size_t bytes)
{
    return grow(v, &v->step.work, &v->step.work_cap, bytes, "the step's work space");
}

/* An int array of the descriptor into the image at element e: copied now from the host, or
 * (backend memory) marked for a device copy after the upload. */
static void put_ints(struct dsv4_vk *v, int32_t *img, uint32_t e, const int32_t *src, int n, const int32_t **later)
{
    *later = NULL;
    if (!n || !src) return;
    if (dsv4_vk_owns(v, src)) *later = src;
    else memcpy(img + e, src, sizeof(int32_t) * (size_t)n);
}

/* The image of desc (its bytes in *bytes); the device addresses resolved under v->mu. */
static int32_t *build_image(struct dsv4_vk *v, const struct dsv4_step_desc *d, size_t *bytes,
                            const int32_t **later, uint32_t *at)
{
    size_t head = sizeof(struct vk_step_head) + sizeof(struct vk_step_seq) * (size_t)d->n_seqs;
    size_t ints = 3 * (size_t)d->n_rows;
    for (int s = 0; s < d->n_seqs; s++) ints += (size_t)seq_pages(d, s);
    *bytes = head + 4 * ints;
    if (v->step.img_cap < *bytes) {
        int32_t *ni = realloc(v->step.img, *bytes);
        if (!ni) return NULL;
        v->step.img = ni, v->step.img_cap = *bytes;
    }
    int32_t *img = v->step.img;
    memset(img, 0, *bytes);
    struct vk_step_head *h   = (struct vk_step_head *)(void *)img;
    struct vk_step_seq  *sq  = (struct vk_step_seq *)(void *)(h + 1);
    uint32_t             e   = (uint32_t)(head / 4);
    int                  n_r = d->n_rows;
    pthread_mutex_lock(&v->mu);
    for (int s = 0; s < d->n_seqs; s++) {
        const struct dsv4_step_seq *q = &d->seq[s];
        int                         np = seq_pages(d, s);
        sq[s] = (struct vk_step_seq){ q->row0, q->n, q->p0, (int32_t)e, 0, 0 };
        if (q->n && q->slot) sq[s].slot = dsv4_vk_addr(v, q->slot, 1);
        if (q->n && q->page_base) sq[s].base = dsv4_vk_addr(v, q->page_base, 1);
        at[s] = e;
        put_ints(v, img, e, q->page, np, &later[s]);
        e += (uint32_t)np;
    }
    pthread_mutex_unlock(&v->mu);
    *h = (struct vk_step_head){ .n_seqs = d->n_seqs, .n_rows = n_r, .page_tokens = d->page_tokens,
                                .page_bytes = d->page_bytes, .pos = e, .tok = e + (uint32_t)n_r,
                                .rowseq = e + 2 * (uint32_t)n_r };
    put_ints(v, img, h->pos, d->pos, n_r, &later[d->n_seqs]);
    put_ints(v, img, h->tok, d->tok, n_r, &later[d->n_seqs + 1]);
    at[d->n_seqs] = h->pos, at[d->n_seqs + 1] = h->tok;
    for (int s = 0; s < d->n_seqs; s++)
        for (int t = 0; t < d->seq[s].n; t++) img[h->rowseq + (uint32_t)(d->seq[s].row0 + t)] = s;
    return img;
}

void dsv4_vk_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc)
{
    struct dsv4_vk *v = be->impl;
    pthread_mutex_lock(&v->mu);
    v->step.begun = false; /* until this one is uploaded: an op of it fails rather than read the last */
    pthread_mutex_unlock(&v->mu);
    size_t n_later = (size_t)desc->n_seqs + 2, bytes;
    if (v->step.later_cap < n_later) {
        const int32_t **nl = realloc(v->step.later, n_later * sizeof(*nl));
        if (nl) v->step.later = nl;
        uint32_t *na = nl ? realloc(v->step.at, n_later * sizeof(*na)) : NULL;
        if (na) v->step.at = na, v->step.later_cap = n_later;
    }
    const int32_t **later = v->step.later;
    uint32_t       *at    = v->step.at;
    int32_t        *img   = v->step.later_cap >= n_later ? build_image(v, desc, &bytes, later, at) : NULL;
    if (img && grow(v, &v->step.buf, &v->step.cap, bytes, "the step descriptor")) {
        dsv4_vk_upload(v, v->step.buf, img, bytes);
        for (size_t i = 0; i < n_later; i++) {
            if (!later[i]) continue;
            size_t n = i < (size_t)desc->n_seqs ? (size_t)seq_pages(desc, (int)i) : (size_t)desc->n_rows;
            dsv4_vk_copy(v, (uint8_t *)v->step.buf + 4 * (size_t)at[i], later[i], 4 * n);
        }
        pthread_mutex_lock(&v->mu);
        v->step.dva = dsv4_vk_addr(v, v->step.buf, bytes);
        v->step.n_seqs = desc->n_seqs, v->step.n_rows = desc->n_rows, v->step.page_tokens = desc->page_tokens;
        v->step.page_bytes = desc->page_bytes;
        v->step.begun      = v->step.dva != 0;
        pthread_mutex_unlock(&v->mu);
    } else if (!img) {
        pthread_mutex_lock(&v->mu);
        dsv4_vk_fault(v, "step_begin: out of host memory");
        pthread_mutex_unlock(&v->mu);
    }
}

void dsv4_vk_step_free(struct dsv4_vk *v)
{
    free(v->step.img);
    free(v->step.later);
    free(v->step.at);
    memset(&v->step, 0, sizeof(v->step)); /* the device buffers go with the block table */
}

VkDeviceAddress dsv4_vk_step_addr(struct dsv4_vk *v, const struct dsv4_step_desc *desc, const char *op)
{
    const struct vk_step *s = &v->step;
    if (!s->begun || s->n_seqs != desc->n_seqs || s->n_rows != desc->n_rows || s->page_tokens != desc->page_tokens ||
        s->page_bytes != desc->page_bytes) {
        dsv4_vk_fault(v, "%s: not the step step_begin took", op);
        return 0;
    }
    return s->dva;
}
