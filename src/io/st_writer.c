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

int dsv4_st_writer_add(struct dsv4_st_writer *w, const char *name, enum dsv4_dtype dtype, int ndim,
                       const int64_t *shape, struct dsv4_err *err)
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
    size_t n   = strlen(s);
    size_t pad = (8 - n % 8) % 8;
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
    if (w->written + n > w->total)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: more data written than declared", w->path);
    if (n && fwrite(data, 1, n, w->f) != n)
        return dsv4_err_set(err, DSV4_EIO, "write error on %s: %s", w->path, strerror(errno));
    w->written += n;
    return DSV4_OK;
}

static void destroy(struct dsv4_st_writer *w)
{
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
