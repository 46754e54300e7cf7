/*
 * metrics.c - the numbers behind GET /metrics, in the Prometheus text exposition format
 * (version 0.0.4): counters of requests by endpoint and status, of tokens and of finish
 * reasons; histograms of time to first token, inter-token latency, end-to-end latency,
 * queue wait, forward-call time and tokens per forward call; and gauges read from the
 * worker and the scheduler at scrape time (running and waiting requests per tier, KV pages,
 * fragmentation, prefix-cache hit ratio, preemptions, steps, state).
 *
 * Every name starts with dsv4_, but for the two process_ gauges of the Prometheus client
 * libraries' convention (resident memory, start time), which dashboards and alerts expect
 * under those names. Bucket bounds are fixed here, chosen to span a tiny test
 * model on loopback (a millisecond) up to a large model on a small CPU (minutes).
 *
 * Locking: one mutex (m->mu) guards every field; updates are a few additions, so
 * connection threads and the worker never wait on each other for long. Rendering copies
 * nothing: it holds the lock while it formats.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

enum { MAX_BUCKETS = 24, MAX_STATUS_ROWS = 96 };

struct hist {
    const char  *name;
    const char  *help;
    const double *le;     /* upper bounds, ascending */
    int          n_le;
    long         count[MAX_BUCKETS]; /* per bucket, not cumulative */
    long         n;
    double       sum;
};

struct status_row {
    int  ep;
    int  status;
    long n;
};

struct srv_metrics {
    pthread_mutex_t   mu;
    /* Protected by mu. */
    struct hist       h[SRV_H_COUNT];
    long              c[SRV_C_COUNT];
    struct status_row rows[MAX_STATUS_ROWS];
    int               n_rows;
    long              connections;
    double            start_time; /* Unix seconds at srv_metrics_new: the process start, near enough */
};

static const double LE_LATENCY[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,    5,     10,   20,    40,   80,  160 };
static const double LE_E2E[]     = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640 };
static const double LE_TOKENS[]  = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096 };

static const char *const EP_NAME[SRV_EP_COUNT] = { "chat_completions", "completions", "models", "messages",
                                                   "count_tokens",     "responses",   "health",  "metrics",
                                                   "promote",          "webui",       "other" };

static void hist_init(struct hist *h, const char *name, const char *help, const double *le, int n_le)
{
    h->name = name;
    h->help = help;
    h->le   = le;
    h->n_le = n_le;
}

struct srv_metrics *srv_metrics_new(void)
{
    struct srv_metrics *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    m->start_time = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
    hist_init(&m->h[SRV_H_TTFT], "dsv4_time_to_first_token_seconds",
              "Time from accepting a request to its first generated token.", LE_LATENCY, N(LE_LATENCY));
    hist_init(&m->h[SRV_H_ITL], "dsv4_inter_token_latency_seconds",
              "Time between two consecutive generated tokens of one request.", LE_LATENCY, N(LE_LATENCY));
    hist_init(&m->h[SRV_H_E2E], "dsv4_e2e_request_latency_seconds",
              "Time from accepting a request to its last generated token.", LE_E2E, N(LE_E2E));
    hist_init(&m->h[SRV_H_STEP], "dsv4_step_seconds", "Time of one scheduler step (one batched forward pass).",
              LE_LATENCY, N(LE_LATENCY));
    hist_init(&m->h[SRV_H_BATCH], "dsv4_batch_tokens", "Token rows of one scheduler step (the batch size: decode rows plus prefill chunks).",
              LE_TOKENS, N(LE_TOKENS));
    hist_init(&m->h[SRV_H_QUEUE], "dsv4_queue_wait_seconds",
              "Time from accepting a request to its admission to a sequence.", LE_LATENCY, N(LE_LATENCY));
#undef N
    return m;
}

void srv_metrics_free(struct srv_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(struct srv_metrics *m, enum srv_endpoint ep, int status)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < m->n_rows && !(m->rows[i].ep == (int)ep && m->rows[i].status == status)) i++;
    if (i == m->n_rows && m->n_rows < MAX_STATUS_ROWS) m->rows[m->n_rows++] = (struct status_row){ (int)ep, status, 0 };
    if (i < m->n_rows) m->rows[i].n++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_observe(struct srv_metrics *m, enum srv_hist h, double v)
{
    if (!m || !(v >= 0)) return;
    pthread_mutex_lock(&m->mu);
    struct hist *x = &m->h[h];
    int          b = 0;
    while (b < x->n_le && v > x->le[b]) b++;
    x->count[b]++; /* b == n_le: only the +Inf bucket */
    x->n++;
    x->sum += v;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_add(struct srv_metrics *m, enum srv_counter c, long n)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->c[c] += n;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_connections(struct srv_metrics *m, int delta)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->connections += delta;
    pthread_mutex_unlock(&m->mu);
}

/* ------------------------------------------------------------------ exposition */

static void head(struct srv_buf *b, const char *name, const char *type, const char *help)
{
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value: integers without a fraction, others with enough digits to round-trip. */
static void value(struct srv_buf *b, double v)
{
    if (isinf(v)) srv_buf_puts(b, v > 0 ? "+Inf" : "-Inf");
    else if (isnan(v)) srv_buf_puts(b, "NaN");
    else if (v == floor(v) && fabs(v) < 1e15) srv_buf_printf(b, "%.0f", v);
    else {
        char s[32];
        for (int prec = 6; prec <= 17; prec++) { /* the shortest text that reads back the same */
            snprintf(s, sizeof(s), "%.*g", prec, v);
            if (strtod(s, NULL) == v) break;
        }
        srv_buf_puts(b, s);
    }
}

static void sample(struct srv_buf *b, const char *name, const char *labels, double v)
{
    srv_buf_puts(b, name);
    if (labels && labels[0]) srv_buf_printf(b, "{%s}", labels);
    srv_buf_puts(b, " ");
    value(b, v);
    srv_buf_puts(b, "\n");
}

static void render_hist(struct srv_buf *b, const struct hist *h)
{
    head(b, h->name, "histogram", h->help);
    long cum = 0;
    for (int i = 0; i <= h->n_le; i++) {
        cum += h->count[i];
        srv_buf_printf(b, "%s_bucket{le=\"", h->name);
        if (i == h->n_le) srv_buf_puts(b, "+Inf");
        else value(b, h->le[i]);
        srv_buf_printf(b, "\"} %ld\n", cum);
    }
    srv_buf_printf(b, "%s_sum ", h->name);
    value(b, h->sum);
    srv_buf_printf(b, "\n%s_count %ld\n", h->name, h->n);
}

/* Label values escape \, " and newline. */
static void label_value(struct srv_buf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            char e[2] = { '\\', *s };
            srv_buf_put(b, e, 2);
        } else if (*s == '\n') {
            srv_buf_puts(b, "\\n");
        } else {
            srv_buf_put(b, s, 1);
        }
    }
}

/* The engine's options in effect (the worker's startup line says the same). */
static void render_engine(struct srv_buf *b, const struct srv_worker_stats *ws)
{
    if (!ws->has_engine) return;
    const struct dsv4_engine_settings *es = &ws->engine;
    head(b, "dsv4_engine_info", "gauge", "Constant 1, labelled with the options the engine runs with.");
    srv_buf_puts(b, "dsv4_engine_info{backend=\"");
    label_value(b, es->backend);
    srv_buf_puts(b, "\",level=\"");
    label_value(b, es->level);
    srv_buf_printf(b,
                   "\",threads=\"%d\",gemm_min=\"%d,%d,%d\",tiles=\"%s\",revision=\"%s\",profile=\"%s\","
                   "ep_ranks=\"%d\",ep_dispatch=\"%s\"} 1\n",
                   es->n_threads, es->gemm_min[0], es->gemm_min[1], es->gemm_min[2], es->tiles ? "on" : "off",
                   es->revision == DSV4_REVISION_INITIAL ? "initial" : "current", es->profiling ? "on" : "off",
                   es->ep_ranks, es->ep_dispatch == DSV4_EP_TOKENS ? "tokens" : "rows");
}

/* The prefix cache's disk tier (--kv-disk-dir); nothing when it is off. */
static void render_kv_disk(struct srv_buf *b, const struct dsv4_sched_metrics *sm)
{
    static const struct {
        const char *name, *help;
        size_t      off;
    } C[] = {
        { "dsv4_kv_disk_hits_total", "Prefix-cache entries read back from disk.",
          offsetof(struct dsv4_sched_metrics, kv_disk_hits) },
        { "dsv4_kv_disk_misses_total", "Disk lookups (where the RAM chain ended) that found no valid entry.",
          offsetof(struct dsv4_sched_metrics, kv_disk_misses) },
        { "dsv4_kv_disk_bytes_read_total", "Bytes read from the disk tier.",
          offsetof(struct dsv4_sched_metrics, kv_disk_bytes_read) },
        { "dsv4_kv_disk_bytes_written_total", "Bytes of records written to the disk tier.",
          offsetof(struct dsv4_sched_metrics, kv_disk_bytes_written) },
        { "dsv4_kv_disk_evictions_total", "Disk records removed to stay within the budget.",
          offsetof(struct dsv4_sched_metrics, kv_disk_evictions) },
        { "dsv4_kv_disk_corrupt_total", "Invalid disk records found and removed.",
          offsetof(struct dsv4_sched_metrics, kv_disk_corrupt) },
        { "dsv4_kv_disk_write_errors_total", "Disk writes that failed (writes stop after the first).",
          offsetof(struct dsv4_sched_metrics, kv_disk_write_errors) },
        { "dsv4_kv_disk_writes_dropped_total", "Disk writes dropped because the write queue was full.",
          offsetof(struct dsv4_sched_metrics, kv_disk_writes_dropped) },
        { "dsv4_kv_disk_refused_total", "Disk writes refused for the budget (a record larger than all of it, or no room).",
          offsetof(struct dsv4_sched_metrics, kv_disk_refused) },
    };
    if (!sm->kv_disk_on) return;
    for (size_t i = 0; i < sizeof(C) / sizeof(C[0]); i++) {
        head(b, C[i].name, "counter", C[i].help);
        sample(b, C[i].name, NULL, (double)*(const uint64_t *)(const void *)((const char *)sm + C[i].off));
    }
    head(b, "dsv4_kv_disk_queue_depth", "gauge", "Disk writes queued or in progress.");
    sample(b, "dsv4_kv_disk_queue_depth", NULL, sm->kv_disk_queue_depth);
    /* a summary without quantiles: the average read is _sum / _count */
    head(b, "dsv4_kv_disk_load_seconds", "summary",
         "Reads of whole records from disk (prefetched or synchronous): their wall time.");
    sample(b, "dsv4_kv_disk_load_seconds_sum", NULL, sm->kv_disk_load_s);
    sample(b, "dsv4_kv_disk_load_seconds_count", NULL, (double)sm->kv_disk_loads);
}

/* ------------------------------------------------------------------ process */

/* Resident memory in bytes (the second field of /proc/self/statm, in pages); -1 where
 * there is no /proc. Read at each scrape: a slow climb across hours is what the RSS alert
 * of deploy/prometheus/alerts.yml looks for. */
static double resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    unsigned long size = 0, resident = 0;
    int           got  = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return got == 2 && page > 0 ? (double)resident * (double)page : -1;
}

/* The process_ gauges under the Prometheus client convention's names. Start time is the
 * metrics' creation, a moment after exec: a restart shows as a step, which is its use. */
static void render_process(struct srv_buf *b, const struct srv_metrics *m)
{
    double rss = resident_bytes();
    if (rss >= 0) {
        head(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        sample(b, "process_resident_memory_bytes", NULL, rss);
    }
    head(b, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
    sample(b, "process_start_time_seconds", NULL, m->start_time);
}

char *srv_metrics_render(struct srv_metrics *m, const struct srv_worker_stats *ws, const char *model, size_t *len)
{
    static const char *const tier[SRV_N_TIERS] = { "short", "medium", "long" };
    struct srv_buf           b                 = { 0 };
    char                     lab[64];
    pthread_mutex_lock(&m->mu);

    head(&b, "dsv4_info", "gauge", "Constant 1, labelled with the served model and the dsv4 version.");
    srv_buf_puts(&b, "dsv4_info{model=\"");
    label_value(&b, model ? model : "");
    srv_buf_puts(&b, "\",version=\"" DSV4_VERSION_STRING "\"} 1\n");
    render_engine(&b, ws);

    head(&b, "dsv4_server_state", "gauge", "1 for the server's current state, 0 for the others.");
    for (int i = 0; i < SRV_STATE_COUNT; i++) {
        snprintf(lab, sizeof(lab), "state=\"%s\"", i == SRV_STATE_READY ? "ready" : srv_state_name(i));
        sample(&b, "dsv4_server_state", lab, (int)ws->state == i);
    }

    head(&b, "dsv4_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int i = 0; i < m->n_rows; i++)
        srv_buf_printf(&b, "dsv4_http_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", EP_NAME[m->rows[i].ep],
                       m->rows[i].status, m->rows[i].n);
    head(&b, "dsv4_http_connections", "gauge", "Open HTTP connections.");
    sample(&b, "dsv4_http_connections", NULL, (double)m->connections);
    head(&b, "dsv4_http_request_timeouts_total", "counter",
         "Connections closed because their request did not arrive within --request-timeout (slow senders).");
    sample(&b, "dsv4_http_request_timeouts_total", NULL, (double)m->c[SRV_C_HTTP_REQUEST_TIMEOUT]);

    head(&b, "dsv4_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    sample(&b, "dsv4_prompt_tokens_total", NULL, (double)m->c[SRV_C_PROMPT_TOKENS]);
    head(&b, "dsv4_prompt_tokens_cached_total", "counter", "Prompt tokens resumed from the prefix cache.");
    sample(&b, "dsv4_prompt_tokens_cached_total", NULL, (double)m->c[SRV_C_CACHED_TOKENS]);
    head(&b, "dsv4_generation_tokens_total", "counter", "Tokens generated.");
    sample(&b, "dsv4_generation_tokens_total", NULL, (double)m->c[SRV_C_GEN_TOKENS]);

    head(&b, "dsv4_requests_finished_total", "counter", "Generation requests ended, by finish reason.");
    static const struct {
        enum srv_counter c;
        const char      *reason;
    } fin[] = { { SRV_C_FINISH_STOP, "stop" },           { SRV_C_FINISH_LENGTH, "length" },
                { SRV_C_FINISH_TOOL_CALLS, "tool_calls" }, { SRV_C_FINISH_CANCELLED, "cancelled" },
                { SRV_C_FINISH_SLOW, "slow_client" },    { SRV_C_FINISH_ERROR, "error" },
                { SRV_C_FINISH_SHUTDOWN, "shutdown" } };
    for (size_t i = 0; i < sizeof(fin) / sizeof(fin[0]); i++) {
        snprintf(lab, sizeof(lab), "reason=\"%s\"", fin[i].reason);
        sample(&b, "dsv4_requests_finished_total", lab, (double)m->c[fin[i].c]);
    }

    for (int h = 0; h < SRV_H_COUNT; h++) render_hist(&b, &m->h[h]);

    head(&b, "dsv4_requests_running", "gauge", "Requests holding a sequence, by prompt-length tier.");
    for (int t = 0; t < SRV_N_TIERS; t++) {
        snprintf(lab, sizeof(lab), "tier=\"%s\"", tier[t]);
        sample(&b, "dsv4_requests_running", lab, ws->running[t]);
    }
    head(&b, "dsv4_requests_waiting", "gauge", "Accepted requests waiting for a sequence, by prompt-length tier.");
    for (int t = 0; t < SRV_N_TIERS; t++) {
        snprintf(lab, sizeof(lab), "tier=\"%s\"", tier[t]);
        sample(&b, "dsv4_requests_waiting", lab, ws->waiting[t]);
    }
    const struct dsv4_sched_metrics *sm = &ws->sched;
    head(&b, "dsv4_max_sequences", "gauge", "Sequences that can run at once (KV slots).");
    sample(&b, "dsv4_max_sequences", NULL, ws->max_seqs);
    head(&b, "dsv4_queue_capacity", "gauge", "Requests that may wait before new ones get 429.");
    sample(&b, "dsv4_queue_capacity", NULL, ws->max_queue);
    head(&b, "dsv4_kv_pages_used", "gauge", "KV pages in use, by running sequences or the prefix cache.");
    sample(&b, "dsv4_kv_pages_used", NULL, sm->pages_total - sm->pages_free);
    head(&b, "dsv4_kv_pages_free", "gauge", "KV pages free.");
    sample(&b, "dsv4_kv_pages_free", NULL, sm->pages_free);
    head(&b, "dsv4_kv_pages_cached", "gauge", "KV pages held by the prefix cache.");
    sample(&b, "dsv4_kv_pages_cached", NULL, sm->pages_cached);
    head(&b, "dsv4_kv_fragmentation_ratio", "gauge", "Share of the positions of used KV pages that hold no token yet.");
    double used_pos = (double)(sm->pages_total - sm->pages_free) * ws->page_tokens;
    sample(&b, "dsv4_kv_fragmentation_ratio", NULL, used_pos > 0 ? (double)sm->fragmentation / used_pos : 0.0);
    head(&b, "dsv4_prefix_cache_hit_ratio", "gauge", "Prefix-cache lookups that found a prefix, over all lookups.");
    sample(&b, "dsv4_prefix_cache_hit_ratio", NULL,
           sm->prefix_lookups ? (double)sm->prefix_hits / (double)sm->prefix_lookups : 0.0);
    head(&b, "dsv4_prefix_cache_entries", "gauge", "Entries in the prefix cache.");
    sample(&b, "dsv4_prefix_cache_entries", NULL, sm->prefix_entries);
    head(&b, "dsv4_kept_sequences", "gauge", "Finished sequences kept as they ended for a next turn (--keep-finished).");
    sample(&b, "dsv4_kept_sequences", NULL, sm->seqs_kept);
    head(&b, "dsv4_kept_resumes_total", "counter", "Requests that resumed at a kept sequence's end.");
    sample(&b, "dsv4_kept_resumes_total", NULL, (double)sm->kept_resumes);
    head(&b, "dsv4_kept_resume_tokens_total", "counter", "Prompt tokens not recomputed thanks to kept sequences.");
    sample(&b, "dsv4_kept_resume_tokens_total", NULL, (double)sm->kept_resume_tokens);
    head(&b, "dsv4_kept_evictions_total", "counter", "Kept sequences freed for a request that needed a slot or pages.");
    sample(&b, "dsv4_kept_evictions_total", NULL, (double)sm->kept_evictions);
    head(&b, "dsv4_preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of KV pages.");
    sample(&b, "dsv4_preemptions_total", NULL, (double)sm->preemptions);
    head(&b, "dsv4_batch_rows_total", "counter", "Token rows run by scheduler steps, by kind.");
    sample(&b, "dsv4_batch_rows_total", "kind=\"prefill\"", (double)sm->prefill_tokens);
    sample(&b, "dsv4_batch_rows_total", "kind=\"decode\"", (double)sm->decode_tokens);
    head(&b, "dsv4_spec_verify_steps_total", "counter", "Speculative verify steps (one sequence's drafts checked).");
    sample(&b, "dsv4_spec_verify_steps_total", NULL, (double)sm->spec_steps);
    head(&b, "dsv4_spec_draft_tokens_total", "counter", "Tokens drafted by the MTP block.");
    sample(&b, "dsv4_spec_draft_tokens_total", NULL, (double)sm->spec_drafted);
    head(&b, "dsv4_spec_accepted_tokens_total", "counter", "Drafted tokens kept by verification.");
    sample(&b, "dsv4_spec_accepted_tokens_total", NULL, (double)sm->spec_kept);
    head(&b, "dsv4_spec_accepted_by_position_total", "counter",
         "Verify steps that kept the draft at this position (acceptance: over dsv4_spec_verify_steps_total).");
    for (int i = 0; i < DSV4_SPEC_MAX_DRAFT; i++) {
        snprintf(lab, sizeof(lab), "position=\"%d\"", i);
        sample(&b, "dsv4_spec_accepted_by_position_total", lab, (double)sm->spec_kept_at[i]);
    }
    head(&b, "dsv4_steps_total", "counter", "Scheduler steps (batched forward passes).");
    sample(&b, "dsv4_steps_total", NULL, (double)sm->steps);
    head(&b, "dsv4_step_busy_seconds_total", "counter", "Time spent in scheduler steps.");
    sample(&b, "dsv4_step_busy_seconds_total", NULL, sm->busy_s);
    render_kv_disk(&b, sm);
    render_process(&b, m);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        srv_buf_free(&b);
        return NULL;
    }
    srv_buf_put(&b, "", 1); /* NUL */
    if (len) *len = b.len - 1;
    return b.p;
}
