/* test_util.c - small file and process helpers for the tests. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/cpu/cpu.h"
#include "dsv4.h"
#include "test.h"

const char *test_backend;

void test_engine_params(struct dsv4_engine_params *ep)
{
    dsv4_engine_params_default(ep);
    if (test_backend) ep->backend = test_backend;
}

const char *test_backend_arg(void)
{
    static char arg[128];
    if (!test_backend) return "";
    snprintf(arg, sizeof(arg), " --backend %s", test_backend);
    return arg;
}

int test_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    if (fclose(f) != 0 || w != n) return -1;
    return 0;
}

void *test_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char  *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[len] = '\0';
    if (n) *n = len;
    return buf;
}

int test_run(const char *cmd, char **out)
{
    char full[8192];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char  *buf = malloc(cap);
    size_t r;
    char   tmp[4096];
    while ((r = fread(tmp, 1, sizeof(tmp), p)) > 0) {
        if (len + r + 1 > cap) {
            while (len + r + 1 > cap) cap *= 2;
            buf = realloc(buf, cap);
        }
        memcpy(buf + len, tmp, r);
        len += r;
    }
    buf[len] = '\0';
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void test_levels_not_here(struct test_ctx *t, int top, int highest)
{
    for (int l = top + 1; l <= highest && dsv4_cpu_level_built((enum dsv4_cpu_level)l); l++)
        test_not_here(t, dsv4_cpu_level_name((enum dsv4_cpu_level)l));
}
