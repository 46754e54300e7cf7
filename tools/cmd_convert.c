/*
 * cmd_convert.c - `dsv4 convert`: the dsv4-native checkpoint.
 *
 * Format (docs/FORMAT.md): a directory with config.json, the tokenizer files of the source,
 * and one model.safetensors whose header carries {"format": "dsv4-native", "version": "1"}
 * in __metadata__, whose data area starts on a 4096-byte boundary and whose every tensor
 * starts on one (gaps filled by "__pad.N" U8 tensors, so the file stays valid safetensors
 * that any reader opens). Tensors keep the release's layouts (row-major codes with block
 * scales), grouped by layer in forward order, so a decode step walks the file front to back.
 * With --tiles, every projection the AVX512-BF16 kernels run on interleaved 16-row tiles also
 * gets them stored beside it ("NAME.i16", U8, and "SCALE.i16" for FP4's scales; about as many
 * bytes again), so that level loads with no repacking either. Opening it is one mmap and one
 * JSON header parse.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "cli.h"
#include "model/model.h"

static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? 1 : -1;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return -1;
    }
    char   buf[65536];
    size_t n;
    int    rc = 0;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = -1;
    if (ferror(in)) rc = -1;
    fclose(in);
    if (fclose(out) != 0) rc = -1;
    return rc;
}

/* Forward order: globals, then layers.0.., then mtp (name order within each). */
static int rank_of(const char *name)
{
    if (!strncmp(name, "layers.", 7)) return 1 + atoi(name + 7);
    if (!strncmp(name, "mtp.", 4)) return 100000;
    return 0;
}

/* One tensor of the output: a source tensor, or the tiles (part 0) or FP4 scale tiles (part
 * 1) of a projection, made when written. */
struct out_tensor {
    char                      name[300];
    const struct dsv4_tensor *src;
    const struct dsv4_linear *lin;
    int                       part;
    uint64_t                  nbytes;
};

static int cmp_out(const void *a, const void *b)
{
    const struct out_tensor *x = a, *y = b;
    int                      rx = rank_of(x->name), ry = rank_of(y->name);
    if (rx != ry) return rx < ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

struct tile_list {
    struct out_tensor *out;
    size_t             n;
};

static void add_tiles(struct dsv4_linear *l, void *ud)
{
    struct tile_list *T = ud;
    if (!dsv4_i16_eligible(l) || !l->wt) return;
    size_t wb, sb;
    dsv4_i16_sizes(l, &wb, &sb);
    struct out_tensor *o = &T->out[T->n++];
    snprintf(o->name, sizeof(o->name), "%s.i16", l->wt->name);
    o->lin = l, o->part = 0, o->nbytes = wb;
    if (sb && l->st) {
        o = &T->out[T->n++];
        snprintf(o->name, sizeof(o->name), "%s.i16", l->st->name);
        o->lin = l, o->part = 1, o->nbytes = sb;
    }
}

static void count_linear(struct dsv4_linear *l, void *ud)
{
    (void)l;
    *(size_t *)ud += 2;
}

/* The bytes of out entry o: the source tensor's, or tiles packed into buf (grown as needed). */
static const void *out_bytes(const struct out_tensor *o, uint8_t **buf, size_t *cap)
{
    if (o->src) return o->src->data;
    size_t wb, sb;
    dsv4_i16_sizes(o->lin, &wb, &sb);
    if (*cap < wb + sb) {
        free(*buf);
        *cap = wb + sb;
        *buf = malloc(*cap);
        if (!*buf) {
            *cap = 0;
            return NULL;
        }
    }
    dsv4_i16_pack(o->lin, 0, dsv4_i16_groups(o->lin), *buf, sb ? *buf + wb : NULL);
    return o->part ? *buf + wb : *buf;
}

struct convert_opts {
    const char *src, *dst;
    bool        quiet, tiles;
};

static const struct cli_opt CONVERT_OPTS[] = {
    { "-m", NULL, "HF_DIR", "the checkpoint in the official layout", CLI_STR, offsetof(struct convert_opts, src), 0, 0,
      NULL },
    { "-o", NULL, "OUT_DIR", "where to write the dsv4-native checkpoint", CLI_STR, offsetof(struct convert_opts, dst), 0,
      0, NULL },
    { "--tiles", NULL, NULL, "also store the interleaved 16-row tiles of the projections (AVX512-BF16 kernels)",
      CLI_FLAG, offsetof(struct convert_opts, tiles), 0, 0, NULL },
    { "-q", NULL, NULL, "no progress or summary", CLI_FLAG, offsetof(struct convert_opts, quiet), 0, 0, NULL },
};

/* Writes the n tensors of order (total bytes) through wr, with progress on a terminal. */
static int write_tensors(struct dsv4_st_writer *wr, const struct out_tensor *order, size_t n, uint64_t total,
                         bool tiles, bool quiet, struct dsv4_err *err)
{
    int rc = DSV4_OK;
    dsv4_st_writer_set_alignment(wr, 4096);
    dsv4_st_writer_set_metadata(wr, "format", "dsv4-native");
    dsv4_st_writer_set_metadata(wr, "version", "1");
    if (tiles) dsv4_st_writer_set_metadata(wr, "tiles", "i16");
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
        const struct out_tensor *o   = &order[i];
        int64_t                  len = (int64_t)o->nbytes;
        rc = o->src ? dsv4_st_writer_add(wr, o->name, o->src->dtype, o->src->ndim, o->src->shape, err)
                    : dsv4_st_writer_add(wr, o->name, DSV4_DTYPE_U8, 1, &len, err);
    }
    uint64_t done = 0, shown = 0;
    bool     tty  = !quiet && isatty(2);
    uint8_t *buf  = NULL;
    size_t   cap  = 0;
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
        const void *data = out_bytes(&order[i], &buf, &cap);
        rc = data ? dsv4_st_writer_write(wr, data, (size_t)order[i].nbytes, err)
                  : dsv4_err_set(err, DSV4_ENOMEM, "out of memory packing %s", order[i].name);
        done += order[i].nbytes;
        if (tty && (done - shown > ((uint64_t)256 << 20) || i + 1 == n)) {
            fprintf(stderr, "\rdsv4 convert: %5.1f%% of %.2f GB", 100.0 * (double)done / (double)(total ? total : 1),
                    (double)total / 1e9);
            shown = done;
        }
    }
    free(buf);
    if (tty) fprintf(stderr, "\n");
    if (rc) dsv4_st_writer_abort(wr);
    else rc = dsv4_st_writer_close(wr, err);
    return rc;
}

int cmd_convert(int argc, char **argv)
{
    struct convert_opts    co    = { 0 };
    const struct cli_group group = { NULL, CONVERT_OPTS, sizeof(CONVERT_OPTS) / sizeof(CONVERT_OPTS[0]), &co };
    const struct cli_spec  spec  = { "convert", "usage: dsv4 convert -m HF_DIR -o OUT_DIR [--tiles] [-q]\n", &group, 1,
                                     NULL };
    int                    prc   = cli_parse(&spec, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (!co.src || !co.dst) return cli_usage_error(&spec, "-m and -o are required");
    const char *src = co.src, *dst = co.dst;
    bool        quiet = co.quiet, tiles = co.tiles;
    struct dsv4_err        err;
    struct dsv4_config     cfg;
    struct dsv4_checkpoint ck;
    if (dsv4_config_load(&cfg, src, &err) || dsv4_checkpoint_open(&ck, src, &err)) {
        fprintf(stderr, "dsv4 convert: %s\n", err.msg);
        return 1;
    }
    /* refuse to convert a checkpoint that would not load */
    struct dsv4_arena       arena;
    struct dsv4_weights     w;
    struct dsv4_bind_report rep;
    dsv4_arena_init(&arena, 1 << 20);
    int rc = dsv4_weights_bind(&w, &cfg, &ck, &arena, &rep, &err);
    for (int i = 0; i < rep.n_problems; i++) fprintf(stderr, "dsv4 convert: %s\n", rep.problems[i].text);
    dsv4_bind_report_free(&rep);
    if (rc) {
        fprintf(stderr, "dsv4 convert: %s\n", err.msg);
        dsv4_arena_free(&arena);
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "dsv4 convert: cannot create %s: %s\n", dst, strerror(errno));
        dsv4_arena_free(&arena);
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    size_t n_lin = 0;
    if (tiles) dsv4_weights_each_linear(&w, &cfg, count_linear, &n_lin);
    struct out_tensor *order = calloc(ck.n_tensors + n_lin + 1, sizeof(*order));
    size_t             n     = 0;
    uint64_t           total = 0;
    for (size_t i = 0; order && i < ck.n_tensors; i++) {
        const struct dsv4_tensor *t = &ck.tensors[i];
        size_t                    l = strlen(t->name);
        /* padding, and tiles of an earlier conversion (made again below when asked for) */
        if (!strncmp(t->name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) || (l > 4 && !strcmp(t->name + l - 4, ".i16")))
            continue;
        snprintf(order[n].name, sizeof(order[n].name), "%s", t->name);
        order[n].src    = t;
        order[n].nbytes = t->nbytes;
        n++;
    }
    if (order && tiles) {
        struct tile_list T = { order + n, 0 };
        dsv4_weights_each_linear(&w, &cfg, add_tiles, &T);
        n += T.n;
    }
    for (size_t i = 0; i < n; i++) total += order[i].nbytes;
    if (order) qsort(order, n, sizeof(*order), cmp_out);
    char *out = dsv4_path_join(dst, "model.safetensors");
    struct dsv4_st_writer *wr;
    rc = order ? dsv4_st_writer_open(&wr, out, &err) : dsv4_err_set(&err, DSV4_ENOMEM, "out of memory");
    if (rc == DSV4_OK) rc = write_tensors(wr, order, n, total, tiles, quiet, &err);
    if (rc) fprintf(stderr, "dsv4 convert: %s\n", err.msg);
    const char *extra[] = { "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]) && rc == DSV4_OK; i++) {
        char *a = dsv4_path_join(src, extra[i]), *b = dsv4_path_join(dst, extra[i]);
        if (copy_file(a, b) < 0) {
            fprintf(stderr, "dsv4 convert: cannot copy %s to %s\n", a, b);
            rc = DSV4_EIO;
        }
        free(a);
        free(b);
    }
    if (rc == DSV4_OK && !quiet)
        fprintf(stderr, "dsv4 convert: wrote %zu tensors (%.2f GB, page-aligned) to %s\n", n, (double)total / 1e9, out);
    free(out);
    free(order);
    dsv4_arena_free(&arena);
    dsv4_checkpoint_close(&ck);
    return rc ? 1 : 0;
}
