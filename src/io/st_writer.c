/*
 * st_writer.c - streaming safetensors writer.
 *
 * Tensors are declared first (name, dtype, shape), so the header with every data_offsets
 * entry can be written before any data; the data then streams through in declaration order.
 * This keeps multi-GB synthetic checkpoints cheap: only the header is ever in memory. The
 * header is padded with spaces to a multiple of 8 bytes, as the reference writer does.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io.h"

struct dsv4_st_writer {
    FILE    *f;
    char    *path;
    json_t  *header;   /* ordered object */
    json_t  *metadata; /* object of strings or NULL */
    uint64_t total;    /* bytes declared */
    uint64_t written;  /* data bytes written */
    bool     started;
    size_t   align;    /* 0, or the page alignment of data and tensors */
    int      n_pad;
    uint64_t *pads;    /* [n_pad][2]: begin and length of each padding tensor, in order */
    int      next_pad; /* first padding tensor not yet written */
    uint64_t pad_total; /* bytes of all padding tensors */
    uint64_t pad_written;
};

int dsv4_st_writer_open(struct dsv4_st_writer **out, const char *path, struct dsv4_err *err)
{
    *out                     = NULL;
    struct dsv4_st_writer *w = calloc(1, sizeof(*w));
    if (!w) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    w->path   = strdup(path);
    w->header = json_object();
    w->f      = fopen(path, "wb");
    if (!w->f || !w->path || !w->header) {
        int e = errno;
        if (w->f) fclose(w->f);
        json_decref(w->header);
        free(w->path);
        free(w);
        return dsv4_err_set(err, DSV4_EIO, "cannot create %s: %s", path, strerror(e));
    }
    *out = w;
    return DSV4_OK;
}

static int add_entry(struct dsv4_st_writer *w, const char *name, enum dsv4_dtype dtype, int ndim, const int64_t *shape,
                     struct dsv4_err *err);

int dsv4_st_writer_set_alignment(struct dsv4_st_writer *w, size_t align)
{
    if (align & (align - 1)) return DSV4_EINVAL;
    w->align = align;
    return DSV4_OK;
}

int dsv4_st_writer_add(struct dsv4_st_writer *w, const char *name, enum dsv4_dtype dtype, int ndim,
                       const int64_t *shape, struct dsv4_err *err)
{
    if (w->align && w->total % w->align) {
        char    pn[64];
        int64_t gap = (int64_t)(w->align - w->total % w->align);
        uint64_t *np = realloc(w->pads, sizeof(uint64_t) * 2 * (size_t)(w->n_pad + 1));
        if (!np) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        w->pads                 = np;
        w->pads[2 * w->n_pad]     = w->total;
        w->pads[2 * w->n_pad + 1] = (uint64_t)gap;
        w->pad_total += (uint64_t)gap;
        snprintf(pn, sizeof(pn), DSV4_ST_PAD_PREFIX "%d", w->n_pad++);
        int rc = add_entry(w, pn, DSV4_DTYPE_U8, 1, &gap, err);
        if (rc) return rc;
    }
    return add_entry(w, name, dtype, ndim, shape, err);
}

static int add_entry(struct dsv4_st_writer *w, const char *name, enum dsv4_dtype dtype, int ndim, const int64_t *shape,
                     struct dsv4_err *err)
{
    if (w->started) return dsv4_err_set(err, DSV4_EINVAL, "%s: tensor '%s' declared after data", w->path, name);
    if (json_object_get(w->header, name))
        return dsv4_err_set(err, DSV4_EINVAL, "%s: tensor '%s' declared twice", w->path, name);
    uint64_t n = dsv4_dtype_size(dtype);
    json_t  *js = json_array();
    for (int i = 0; i < ndim; i++) {
        n *= (uint64_t)shape[i];
        json_array_append_new(js, json_integer(shape[i]));
    }
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(dsv4_dtype_name(dtype)));
    json_object_set_new(e, "shape", js);
    json_t *off = json_array();
    json_array_append_new(off, json_integer((json_int_t)w->total));
    json_array_append_new(off, json_integer((json_int_t)(w->total + n)));
    json_object_set_new(e, "data_offsets", off);
    json_object_set_new(w->header, name, e);
    w->total += n;
    return DSV4_OK;
}

int dsv4_st_writer_set_metadata(struct dsv4_st_writer *w, const char *key, const char *value)
{
    if (!w->metadata) w->metadata = json_object();
    return json_object_set_new(w->metadata, key, json_string(value)) == 0 ? DSV4_OK : DSV4_ENOMEM;
}

static int write_header(struct dsv4_st_writer *w, struct dsv4_err *err)
{
    json_t *h = json_object();
    if (w->metadata) json_object_set(h, "__metadata__", w->metadata);
    json_object_update(h, w->header);
    char *s = json_dumps(h, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(h);
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    size_t n     = strlen(s);
    size_t align = w->align > 8 ? w->align : 8;
    size_t pad   = (align - (8 + n) % align) % align;
    if (align == 8) pad = (8 - n % 8) % 8;
    uint8_t len[8];
    uint64_t hl = n + pad;
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(hl >> (8 * i));
    bool ok = fwrite(len, 1, 8, w->f) == 8 && fwrite(s, 1, n, w->f) == n;
    for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', w->f) != EOF;
    free(s);
    w->started = true;
    if (!ok) return dsv4_err_set(err, DSV4_EIO, "write error on %s: %s", w->path, strerror(errno));
    return DSV4_OK;
}

int dsv4_st_writer_write(struct dsv4_st_writer *w, const void *data, size_t n, struct dsv4_err *err)
{
    if (!w->started) {
        int rc = write_header(w, err);
        if (rc) return rc;
    }
    /* all or nothing: the caller's bytes must fit the declared tensors */
    if ((w->written - w->pad_written) + n > w->total - w->pad_total)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: more data written than declared", w->path);
    const uint8_t *p = data;
    while (n > 0 || (w->next_pad < w->n_pad && w->written == w->pads[2 * w->next_pad])) {
        if (w->next_pad < w->n_pad && w->written == w->pads[2 * w->next_pad]) {
            /* zeros for the padding tensor that starts here */
            static const uint8_t zeros[4096];
            uint64_t             left = w->pads[2 * w->next_pad + 1];
            while (left > 0) {
                size_t k = left < sizeof(zeros) ? (size_t)left : sizeof(zeros);
                if (fwrite(zeros, 1, k, w->f) != k)
                    return dsv4_err_set(err, DSV4_EIO, "write error on %s: %s", w->path, strerror(errno));
                left -= k;
                w->written += k;
                w->pad_written += k;
            }
            w->next_pad++;
            continue;
        }
        uint64_t lim = w->next_pad < w->n_pad ? w->pads[2 * w->next_pad] - w->written : w->total - w->written;
        size_t   k   = n < lim ? n : (size_t)lim;
        if (k == 0) return dsv4_err_set(err, DSV4_EINVAL, "%s: more data written than declared", w->path);
        if (fwrite(p, 1, k, w->f) != k)
            return dsv4_err_set(err, DSV4_EIO, "write error on %s: %s", w->path, strerror(errno));
        w->written += k;
        p += k;
        n -= k;
    }
    return DSV4_OK;
}

static void destroy(struct dsv4_st_writer *w)
{
    free(w->pads);
    json_decref(w->header);
    json_decref(w->metadata);
    free(w->path);
    free(w);
}

int dsv4_st_writer_close(struct dsv4_st_writer *w, struct dsv4_err *err)
{
    int rc = DSV4_OK;
    if (!w->started) rc = write_header(w, err);
    if (rc == DSV4_OK && w->written != w->total)
        rc = dsv4_err_set(err, DSV4_EINVAL, "%s: %llu of %llu declared data bytes written", w->path,
                          (unsigned long long)w->written, (unsigned long long)w->total);
    if (fclose(w->f) != 0 && rc == DSV4_OK)
        rc = dsv4_err_set(err, DSV4_EIO, "write error on %s: %s", w->path, strerror(errno));
    destroy(w);
    return rc;
}

void dsv4_st_writer_abort(struct dsv4_st_writer *w)
{
    if (!w) return;
    fclose(w->f);
    unlink(w->path);
    destroy(w);
}
