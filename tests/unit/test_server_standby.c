/*
 * test_server_standby.c - the hot standby (docs/SERVER.md "Standby", docs/DEPLOY.md "Hot
 * standby"): a server started with --standby loads and warms the model but answers
 * /health 503 {"status":"standby"} and every API request 503 "standby: not promoted", with
 * dsv4_server_state{state="standby"} 1; SIGUSR1 or POST /admin/promote (with the API key)
 * promotes it, after which /health is 200 "ok" and a chat request is answered. An
 * unauthenticated promotion is refused: 401 without the key, 403 on a server that has no
 * key at all (it can be promoted only by signal), and the server stays in standby.
 * Also the warm-up every server does: its weights mapped before /health is ok (smaps).
 */
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <time.h>

#include "test_server_standby.h"

/* ignore_eos: the tiny model samples its end-of-turn token first now and then (seen once in
 * CI: a promoted server that "generated no tokens") */
static const char *CHAT = "{\"model\":\"srv-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"in the beginning\"}],"
                          "\"max_tokens\":4,\"ignore_eos\":true}";

static const char *status_of(json_t *r)
{
    return test_str(json_string_value(json_object_get(r, "status")));
}

/* The error message of an OpenAI-shaped error body. */
static const char *error_of(json_t *r)
{
    return test_str(json_string_value(json_object_get(json_object_get(r, "error"), "message")));
}

/* dsv4_server_state is 1 for state alone (of ready and standby). */
static void check_state_metric(struct test_ctx *t, struct tsrv *s, const char *state)
{
    char *text = NULL, want[96], other[96];
    bool  standby = !strcmp(state, "standby");
    snprintf(want, sizeof(want), "dsv4_server_state{state=\"%s\"} 1", state);
    snprintf(other, sizeof(other), "dsv4_server_state{state=\"%s\"} 0", standby ? "ready" : "standby");
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    CHECKF(text && strstr(text, want) && strstr(text, other), "metrics: want %s and %s", want, other);
    free(text);
}

/* /health, the API and the state metric of a server in standby. */
static void check_standby(struct test_ctx *t, struct tsrv *s, const char *headers)
{
    json_t *r = NULL;
    CHECK(tsrv_get(s, "/health", &r, NULL) == 503);
    CHECKF(r && !strcmp(status_of(r), "standby"), "standby /health status: %s", status_of(r));
    json_decref(r);
    r = NULL;
    CHECK(tsrv_post(s, "/v1/chat/completions", CHAT, headers, &r) == 503);
    CHECKF(r && strstr(error_of(r), "standby: not promoted"), "standby chat error: %s", error_of(r));
    json_decref(r);
    check_state_metric(t, s, "standby");
}

/* Polls /health until it is 200 "ok" (promotion takes effect at once; the poll only
 * allows for the signal's delivery). */
static bool wait_ok(struct tsrv *s, double timeout_s)
{
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    for (int i = 0; i < (int)(timeout_s * 50); i++) {
        json_t *r  = NULL;
        int     st = tsrv_get(s, "/health", &r, NULL);
        bool    ok = st == 200 && r && !strcmp(status_of(r), "ok");
        json_decref(r);
        if (ok) return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

/* After promotion: a chat request is answered with its tokens. */
static void check_serving(struct test_ctx *t, struct tsrv *s, const char *headers)
{
    json_t *r = NULL;
    CHECK(tsrv_post(s, "/v1/chat/completions", CHAT, headers, &r) == 200);
    json_t *usage = json_object_get(r, "usage");
    CHECKF(json_integer_value(json_object_get(usage, "completion_tokens")) >= 1, "promoted: no tokens generated");
    json_decref(r);
    check_state_metric(t, s, "ready");
}

void tsby_test_signal(struct test_ctx *t, const char *model_dir)
{
    struct tsrv s;
    if (!tsrv_start(t, &s, model_dir, "--standby --max-seqs 2 --ctx 512")) return;
    check_standby(t, &s, NULL);
    /* without a key the endpoint refuses: promotion is by signal only */
    json_t *r = NULL;
    CHECK(tsrv_post(&s, "/admin/promote", "", NULL, &r) == 403);
    CHECKF(r && strstr(error_of(r), "--api-key"), "promote without a server key: %s", error_of(r));
    json_decref(r);
    check_standby(t, &s, NULL);
    CHECK(kill(s.sig_pid, SIGUSR1) == 0);
    CHECKF(wait_ok(&s, 10), "SIGUSR1 did not promote the standby");
    check_serving(t, &s, NULL);
    CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "the promoted server did not drain and exit 0");
}

void tsby_test_endpoint(struct test_ctx *t, const char *model_dir)
{
    struct tsrv s;
    const char *auth = "Authorization: Bearer sekret\r\n";
    if (!tsrv_start(t, &s, model_dir, "--standby --api-key sekret --max-seqs 2 --ctx 512")) return;
    check_standby(t, &s, auth);
    json_t *r = NULL;
    CHECK(tsrv_post(&s, "/admin/promote", "", NULL, &r) == 401);
    json_decref(r);
    r = NULL;
    CHECK(tsrv_post(&s, "/admin/promote", "", "Authorization: Bearer wrong!\r\n", &r) == 401);
    json_decref(r);
    CHECK(tsrv_get(&s, "/admin/promote", &r, NULL) == 405);
    json_decref(r);
    check_standby(t, &s, auth); /* none of those promoted it */
    r = NULL;
    CHECK(tsrv_post(&s, "/admin/promote", "", auth, &r) == 200);
    CHECK(r && json_is_true(json_object_get(r, "promoted")) && !strcmp(status_of(r), "ok"));
    json_decref(r);
    CHECK(wait_ok(&s, 1));
    check_serving(t, &s, auth);
    r = NULL; /* a second promotion changes nothing and says so */
    CHECK(tsrv_post(&s, "/admin/promote", "", auth, &r) == 200);
    CHECK(r && json_is_false(json_object_get(r, "promoted")) && !strcmp(status_of(r), "ok"));
    json_decref(r);
    CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "the promoted server did not drain and exit 0");
}

/* The bytes of dir's *.safetensors files, and how many of them process pid has mapped in its
 * page tables (the Rss of those files' mappings in /proc/pid/smaps). */
static long long safetensors_bytes(const char *dir)
{
    long long      total = 0;
    DIR           *d     = opendir(dir);
    struct dirent *e;
    char           path[PATH_MAX + 256];
    struct stat    st;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (!stat(path, &st)) total += (long long)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

static long long mapped_bytes(pid_t pid, const char *dir)
{
    char path[64], line[PATH_MAX + 256], real[PATH_MAX];
    if (!realpath(dir, real)) return -1;
    snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long kb = 0, v;
    bool      in = false;
    while (fgets(line, sizeof(line), f)) {
        const char *slash = strchr(line, '/');
        if (strchr(line, '-') && strchr(line, '-') < strchr(line, ' ')) { /* a mapping's header line */
            size_t n = slash ? strcspn(slash, "\n") : 0;
            in       = slash && n > 12 && !strncmp(slash, real, strlen(real)) && !strncmp(slash + n - 12, ".safetensors", 12);
        } else if (in && sscanf(line, "Rss: %lld kB", &v) == 1) {
            kb += v;
        }
    }
    fclose(f);
    return kb * 1024;
}

void tsby_test_weights_mapped(struct test_ctx *t, const char *model_dir)
{
    long long files = safetensors_bytes(model_dir);
    CHECKF(files > 0, "no *.safetensors in %s", model_dir);
    /* one process (not under mpirun: there rank 0 maps only what it holds) on the cpu backend
     * whatever the run's (a device's upload is not read in place), at the scalar level, whose
     * kernels read every projection in place (no tiles made at load) */
    static const char *const args[2] = { "--backend cpu --cpu-level scalar",
                                         "--backend cpu --cpu-level scalar --lazy-weights" };
    for (int lazy = 0; lazy < 2; lazy++) {
        struct tsrv s;
        if (!tsrv_start_mpi(t, &s, model_dir, args[lazy], 1)) return;
        long long m = mapped_bytes(s.sig_pid, model_dir);
        if (lazy) CHECKF(m >= 0 && m < files / 2, "--lazy-weights: %lld of %lld checkpoint bytes mapped at start", m, files);
        else CHECKF(m >= files * 9 / 10, "%lld of %lld checkpoint bytes mapped when /health is ok", m, files);
        CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "exit status after SIGTERM (log: %s)", s.log);
    }
}
