/* test_util.c - small file and process helpers for the tests. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "dsv4.h"
#include "test.h"

const char *test_backend;
int         test_mpi_ranks;

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

dsv4_session *test_session_new(struct test_ctx *t, dsv4_engine *e, int max_ctx, int max_chunk)
{
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = max_ctx;
    sp.max_chunk = max_chunk;
    dsv4_session   *s = NULL;
    struct dsv4_err err;
    CHECKF(dsv4_session_create(e, &sp, &s, &err) == DSV4_OK, "session: %s", err.msg);
    return s;
}

bool test_backend_usable(const char *name, char *why, size_t cap, enum test_skip_kind *kind)
{
    const struct dsv4_backend_kind *k = dsv4_backend_find(name);
    *kind                             = TEST_SKIP_MISSING;
    if (!k) {
        snprintf(why, cap, "this build has no backend '%s': tools/install_deps.sh test, then make", name);
        return false;
    }
    if (TEST_SANITIZED && !strcmp(name, "vulkan")) {
        /* seen on Debian 12 (Mesa 22.3): the loader's Mesa drivers parse driconf with glibc's
         * regexec at vkCreateInstance, and under ASan's regexec interceptor that deadlocks */
        *kind = TEST_SKIP_MACHINE;
        snprintf(why, cap, "Mesa's Vulkan drivers deadlock in regexec under the sanitizers; the plain build "
                           "(make test) runs this");
        return false;
    }
    void                      *impl = NULL;
    struct dsv4_backend_params p    = { .n_threads = 1 };
    struct dsv4_err            err;
    if (k->create(&impl, &p, &err)) {
        snprintf(why, cap, "backend %s cannot start here: %s (tools/install_deps.sh test installs "
                           "mesa-vulkan-drivers)", name, err.msg);
        return false;
    }
    k->destroy(impl);
    return true;
}

bool test_need_backend(struct test_ctx *t, const char *name)
{
    char                why[768];
    enum test_skip_kind kind;
    if (test_backend_usable(name, why, sizeof(why), &kind)) return true;
    test_skip(t, kind, "%s", why);
    return false;
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

bool test_light(void)
{
    const char *v = getenv("DSV4_TEST_LIGHT");
    return TEST_SANITIZED || (v && *v && strcmp(v, "0"));
}

void test_quant_e4m3_row(const float *x, int n, int B, float *q)
{
    for (int b = 0; b < n; b += B) {
        int   e    = b + B < n ? b + B : n;
        float amax = 0;
        for (int k = b; k < e; k++) amax = fmaxf(amax, fabsf(x[k]));
        float s = dsv4_act_scale(amax, 448.0f, 1e-4f);
        for (int k = b; k < e; k++) q[k] = dsv4_f32_from_e4m3(dsv4_e4m3_from_f32(x[k] / s)) * s;
    }
}
