/*
 * cmd_convert.c - `dsv4 convert`: the dsv4-native checkpoint.
 *
 * Format (docs/FORMAT.md): a directory with config.json, the tokenizer files of the source,
 * and one model.safetensors whose header carries {"format": "dsv4-native", "version": "1"}
 * in __metadata__, whose data area starts on a 4096-byte boundary and whose every tensor
 * starts on one (gaps filled by "__pad.N" U8 tensors, so the file stays valid safetensors
 * that any reader opens). Tensors are stored in the layouts the CPU kernels read directly
 * (the release's row-major codes with block scales, see docs/PERF.md), grouped by layer in
 * forward order, so a decode step walks the file front to back. Opening it is one mmap and
 * one JSON header parse; nothing is copied or converted at start-up.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static int cmp_tensor(const void *a, const void *b)
{
    const struct dsv4_tensor *x = *(const struct dsv4_tensor *const *)a, *y = *(const struct dsv4_tensor *const *)b;
    int                       rx = rank_of(x->name), ry = rank_of(y->name);
    if (rx != ry) return rx < ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

int cmd_convert(int argc, char **argv)
{
    const char *src = NULL, *dst = NULL;
    bool        quiet = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dsv4 convert -m HF_DIR -o OUT_DIR [-q]\n");
            return 0;
        } else if (!strcmp(argv[i], "-m")) {
            if (!(src = cli_value("convert", argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-o")) {
            if (!(dst = cli_value("convert", argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "-q")) {
            quiet = true;
        } else {
            fprintf(stderr, "dsv4 convert: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!src || !dst) {
        fprintf(stderr, "usage: dsv4 convert -m HF_DIR -o OUT_DIR\n");
        return 2;
    }
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
    dsv4_arena_free(&arena);
    if (rc) {
        fprintf(stderr, "dsv4 convert: %s\n", err.msg);
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "dsv4 convert: cannot create %s: %s\n", dst, strerror(errno));
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    const struct dsv4_tensor **order = malloc(sizeof(*order) * ck.n_tensors);
    size_t                     n     = 0;
    uint64_t                   total = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        if (!strncmp(ck.tensors[i].name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX))) continue;
        order[n++] = &ck.tensors[i];
        total += ck.tensors[i].nbytes;
    }
    qsort(order, n, sizeof(*order), cmp_tensor);
    char *out = dsv4_path_join(dst, "model.safetensors");
    struct dsv4_st_writer *wr;
    rc = dsv4_st_writer_open(&wr, out, &err);
    if (rc == DSV4_OK) {
        dsv4_st_writer_set_alignment(wr, 4096);
        dsv4_st_writer_set_metadata(wr, "format", "dsv4-native");
        dsv4_st_writer_set_metadata(wr, "version", "1");
        for (size_t i = 0; i < n && rc == DSV4_OK; i++)
            rc = dsv4_st_writer_add(wr, order[i]->name, order[i]->dtype, order[i]->ndim, order[i]->shape, &err);
        uint64_t done = 0, shown = 0;
        bool     tty  = !quiet && isatty(2);
        for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
            rc = dsv4_st_writer_write(wr, order[i]->data, (size_t)order[i]->nbytes, &err);
            done += order[i]->nbytes;
            if (tty && (done - shown > ((uint64_t)256 << 20) || i + 1 == n)) {
                fprintf(stderr, "\rdsv4 convert: %5.1f%% of %.2f GB", 100.0 * (double)done / (double)(total ? total : 1),
                        (double)total / 1e9);
                shown = done;
            }
        }
        if (tty) fprintf(stderr, "\n");
        if (rc) dsv4_st_writer_abort(wr);
        else rc = dsv4_st_writer_close(wr, &err);
    }
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
    dsv4_checkpoint_close(&ck);
    return rc ? 1 : 0;
}
