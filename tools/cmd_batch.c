/*
 * cmd_batch.c - `dsv4 batch`: many prompts through the serving scheduler offline.
 *
 * Input: JSON lines, one request each:
 *   {"id": any, "prompt": "text" | "tokens": [ids], "max_tokens": 64, "temperature": 0,
 *    "top_k": 0, "top_p": 1, "min_p": 0, "seed": 0, "stop": [ids], "ignore_eos": false,
 *    "bos": false, "arrival": seconds after start, "deadline": seconds after arrival}
 * Text prompts need DIR/tokenizer.json; EOS ends the output unless ignore_eos.
 * Output: JSON lines in input order with the tokens (and text), the finish reason, usage and
 * per-request timings; then, on stderr, the start-up memory plan and the aggregate figures:
 * throughput, TTFT and inter-token latency P50/P99, scheduler counters.
 *
 * Requests are submitted when their arrival time comes (all at once by default); a request
 * refused because the queue is full is retried at the next step. One thread steps.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

struct breq {
    json_t                    *id;       /* echoed, or NULL */
    int32_t                   *prompt;
    int                        n_prompt;
    int                        max_tokens;
    struct dsv4_sampler_params sp;
    int32_t                   *stop;
    int                        n_stop;
    double                     arrival, deadline;
    /* results */
    bool                       submitted, done;
    int                        refusals;
    uint64_t                   sid;
    double                     t_submit;
    int32_t                   *out;      /* [max_tokens] */
    double                    *t_tok;    /* [max_tokens] event times */
    int                        n_out;
    enum dsv4_finish           fin;
    int32_t                    stop_tok;
    struct dsv4_sched_usage    usage;
    FILE                      *logits_f;
    int                        vocab;
};

/* ------------------------------------------------------------------ input */

static bool parse_ids(json_t *arr, int vocab, int32_t **out, int *n, const char *what, int line)
{
    if (!json_is_array(arr)) {
        fprintf(stderr, "dsv4 batch: line %d: \"%s\" must be an array of token ids\n", line, what);
        return false;
    }
    size_t k = json_array_size(arr);
    *out     = malloc(sizeof(int32_t) * (k + 1));
    *n       = (int)k;
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            fprintf(stderr, "dsv4 batch: line %d: \"%s\"[%zu] is not a token id in [0, %d)\n", line, what, i, vocab);
            return false;
        }
        (*out)[i] = (int32_t)json_integer_value(v);
    }
    return true;
}

static double num_or(json_t *o, const char *key, double def)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

static bool parse_request(json_t *o, int line, const dsv4_tokenizer *tok, int vocab, int32_t eos, struct breq *r)
{
    memset(r, 0, sizeof(*r));
    if (!json_is_object(o)) {
        fprintf(stderr, "dsv4 batch: line %d: not a JSON object\n", line);
        return false;
    }
    json_t *id = json_object_get(o, "id");
    r->id      = id ? json_incref(id) : NULL;
    json_t *pt = json_object_get(o, "prompt"), *tk = json_object_get(o, "tokens");
    if (tk) {
        if (!parse_ids(tk, vocab, &r->prompt, &r->n_prompt, "tokens", line)) return false;
    } else if (json_is_string(pt)) {
        if (!tok) {
            fprintf(stderr, "dsv4 batch: line %d: a text prompt needs DIR/tokenizer.json (or give \"tokens\")\n", line);
            return false;
        }
        const char     *text = json_string_value(pt);
        size_t          len = json_string_length(pt), cap = 3 * len + 2, n = 0;
        struct dsv4_err err;
        r->prompt = malloc(sizeof(int32_t) * cap);
        bool bos  = json_is_true(json_object_get(o, "bos"));
        if (dsv4_tokenizer_encode(tok, text, len, bos ? DSV4_TOKENIZE_BOS : 0, r->prompt, cap, &n, &err)) {
            fprintf(stderr, "dsv4 batch: line %d: %s\n", line, err.msg);
            return false;
        }
        r->n_prompt = (int)n;
    } else {
        fprintf(stderr, "dsv4 batch: line %d: needs \"prompt\" (text) or \"tokens\" (ids)\n", line);
        return false;
    }
    if (r->n_prompt < 1) {
        fprintf(stderr, "dsv4 batch: line %d: empty prompt\n", line);
        return false;
    }
    r->max_tokens = (int)num_or(o, "max_tokens", 64);
    if (r->max_tokens < 1 || r->max_tokens > (1 << 24)) {
        fprintf(stderr, "dsv4 batch: line %d: max_tokens must be in [1, 2^24]\n", line);
        return false;
    }
    dsv4_sampler_params_default(&r->sp);
    r->sp.temperature = (float)num_or(o, "temperature", 0);
    r->sp.top_k       = (int)num_or(o, "top_k", 0);
    r->sp.top_p       = (float)num_or(o, "top_p", 1);
    r->sp.min_p       = (float)num_or(o, "min_p", 0);
    r->sp.seed        = (uint64_t)num_or(o, "seed", 0);
    json_t *st        = json_object_get(o, "stop");
    if (st) {
        if (!parse_ids(st, vocab, &r->stop, &r->n_stop, "stop", line)) return false;
        r->stop = realloc(r->stop, sizeof(int32_t) * (size_t)(r->n_stop + 1));
    } else {
        r->stop = malloc(sizeof(int32_t));
    }
    if (!json_is_true(json_object_get(o, "ignore_eos"))) r->stop[r->n_stop++] = eos;
    r->arrival  = num_or(o, "arrival", 0);
    r->deadline = num_or(o, "deadline", 0);
    r->out      = malloc(sizeof(int32_t) * (size_t)r->max_tokens);
    r->t_tok    = malloc(sizeof(double) * (size_t)r->max_tokens);
    return r->out && r->t_tok;
}

/* ------------------------------------------------------------------ events */

static void on_event(void *ud, const struct dsv4_sched_event *ev)
{
    struct breq *r = ud;
    double       t = cli_now();
    if (ev->kind == DSV4_SCHED_TOKEN) {
        if (r->n_out < r->max_tokens) {
            r->out[r->n_out]   = ev->token;
            r->t_tok[r->n_out] = t;
            r->n_out++;
        }
        if (r->logits_f) fwrite(ev->logits, sizeof(float), (size_t)r->vocab, r->logits_f);
        return;
    }
    r->done     = true;
    r->fin      = ev->finish;
    r->stop_tok = ev->token;
    r->usage    = ev->usage;
    if (r->logits_f) fclose(r->logits_f);
    r->logits_f = NULL;
}

/* ------------------------------------------------------------------ statistics */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile q (0..1) of n sorted values, nearest rank. */
static double pct(const double *v, size_t n, double q)
{
    if (!n) return 0;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

static void print_plan(const struct dsv4_sched_plan *p)
{
    double mib = 1048576.0;
    fprintf(stderr,
            "dsv4 batch: memory plan %.1f MiB: KV pages %d x %.1f KiB = %.1f MiB (%d positions each), slots %d x "
            "%.1f KiB = %.1f MiB, prefix snapshots %d x %.1f KiB = %.1f MiB, step scratch %.1f MiB, logits %.1f MiB, "
            "tables %.1f MiB",
            (double)p->total / mib, p->n_pages, (double)p->page_bytes / 1024.0, (double)p->pages / mib, p->page_tokens,
            p->n_slots, (double)p->slot_bytes / 1024.0, (double)p->slots / mib, p->n_prefix_entries,
            (double)p->snapshot_bytes / 1024.0, (double)p->snapshots / mib, (double)p->step / mib,
            (double)p->logits / mib, (double)p->tables / mib);
    if (p->mem_available)
        fprintf(stderr, "; limit %.1f MiB (available %.1f - weights %.1f - margin %.1f)\n", (double)p->mem_limit / mib,
                (double)p->mem_available / mib, (double)p->weights_bytes / mib, (double)p->margin / mib);
    else if (p->mem_limit != (size_t)-1)
        fprintf(stderr, "; limit %.1f MiB\n", (double)p->mem_limit / mib);
    else
        fprintf(stderr, "; no memory limit known\n");
}

static json_t *result_json(const struct breq *r, size_t index, const dsv4_tokenizer *tok, double t0, bool stamps)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer((json_int_t)index));
    if (r->id) json_object_set(o, "id", r->id);
    json_t *toks = json_array();
    for (int i = 0; i < r->n_out; i++) json_array_append_new(toks, json_integer(r->out[i]));
    json_object_set_new(o, "tokens", toks);
    if (tok) {
        size_t cap = (size_t)r->n_out * dsv4_tokenizer_max_token_bytes(tok) + 1, n = 0;
        char  *buf = malloc(cap);
        if (buf && dsv4_tokenizer_decode(tok, r->out, (size_t)r->n_out, buf, cap, &n, NULL) == DSV4_OK)
            json_object_set_new(o, "text", json_stringn_nocheck(buf, n));
        free(buf);
    }
    json_object_set_new(o, "finish_reason", json_string(r->done ? dsv4_finish_str(r->fin) : "not run"));
    if (r->fin == DSV4_FINISH_STOP) json_object_set_new(o, "stop_token", json_integer(r->stop_tok));
    json_object_set_new(o, "prompt_tokens", json_integer(r->n_prompt));
    json_object_set_new(o, "completion_tokens", json_integer(r->usage.completion_tokens));
    json_object_set_new(o, "cached_tokens", json_integer(r->usage.cached_tokens));
    json_object_set_new(o, "preemptions", json_integer(r->usage.preemptions));
    json_object_set_new(o, "refusals", json_integer(r->refusals));
    json_object_set_new(o, "queue_ms", json_real(r->usage.queue_s * 1e3));
    json_object_set_new(o, "ttft_ms", json_real(r->usage.ttft_s * 1e3));
    json_object_set_new(o, "total_ms", json_real(r->usage.total_s * 1e3));
    if (stamps) {
        json_t *ts = json_array();
        for (int i = 0; i < r->n_out; i++) json_array_append_new(ts, json_real((r->t_tok[i] - t0) * 1e3));
        json_object_set_new(o, "token_ms", ts);
        json_object_set_new(o, "submit_ms", json_real((r->t_submit - t0) * 1e3));
    }
    if (r->n_out > 1) {
        double *gap = malloc(sizeof(double) * (size_t)(r->n_out - 1)), sum = 0;
        for (int i = 1; i < r->n_out; i++) sum += gap[i - 1] = r->t_tok[i] - r->t_tok[i - 1];
        qsort(gap, (size_t)(r->n_out - 1), sizeof(double), cmp_double);
        json_object_set_new(o, "itl_ms_mean", json_real(sum / (r->n_out - 1) * 1e3));
        json_object_set_new(o, "itl_ms_p50", json_real(pct(gap, (size_t)(r->n_out - 1), 0.5) * 1e3));
        json_object_set_new(o, "itl_ms_max", json_real(gap[r->n_out - 2] * 1e3));
        free(gap);
    }
    return o;
}

/* ------------------------------------------------------------------ main */

static bool pair(const char *s, long long *a, long long *b, long long *c)
{
    char *end;
    *a = strtoll(s, &end, 10);
    if (*end != ',') return false;
    *b = strtoll(end + 1, &end, 10);
    if (c) {
        if (*end != ',') return false;
        *c = strtoll(end + 1, &end, 10);
    }
    return *end == 0;
}

static bool set_tiers(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    long long a, b;
    int      *t = (int *)(void *)((char *)base + o->off);
    if (!pair(v, &a, &b, NULL) || a < 1 || b < a || b > INT32_MAX) {
        fprintf(stderr, "dsv4 %s: --tiers needs S,M with 1 <= S <= M\n", cmd);
        return false;
    }
    t[0] = (int)a;
    t[1] = (int)b;
    return true;
}

static bool set_tier_limits(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    long long a, b, c;
    int      *t = (int *)(void *)((char *)base + o->off);
    if (!pair(v, &a, &b, &c) || a < 1 || b < 1 || c < 1 || a > INT32_MAX || b > INT32_MAX || c > INT32_MAX) {
        fprintf(stderr, "dsv4 %s: --tier-limits needs S,M,L, each at least 1\n", cmd);
        return false;
    }
    t[0] = (int)a;
    t[1] = (int)b;
    t[2] = (int)c;
    return true;
}

struct batch_opts {
    const char              *dir, *prompts, *out_path, *logits_dir;
    int                      ctx;  /* 0: the longest request's */
    int                      spec; /* --spec-draft; -1: the default for the checkpoint */
    bool                     stamps;
    struct dsv4_sched_params sp;
};

#define BO(field) offsetof(struct batch_opts, field)
static const struct cli_opt BATCH_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory", CLI_STR, BO(dir), 0, 0, NULL },
    { "--prompts", NULL, "FILE", "JSON lines, one request each ('-' = standard input)", CLI_STR, BO(prompts), 0, 0, NULL },
    { "--out", "-o", "FILE", "JSON lines of results (default standard output)", CLI_STR, BO(out_path), 0, 0, NULL },
    { "--max-seqs", NULL, "N", "sequences running at once (default 8)", CLI_INT, BO(sp.max_seqs), 1, 4096, NULL },
    { "--ctx", NULL, "N", "context per sequence (default: the longest request, at most the model's)", CLI_INT, BO(ctx), 1,
      1 << 30, NULL },
    { "--max-batch-tokens", NULL, "N", "token rows per step (default 512)", CLI_INT, BO(sp.max_batch_tokens), 1, 65536,
      NULL },
    { "--max-prefill-tokens", NULL, "N", "prefill rows per step while sequences decode (default 128; 0 = no bound)",
      CLI_INT, BO(sp.max_prefill_tokens), 0, 65536, NULL },
    { "--prefill-share", NULL, "F",
      "prefill may add F x a decode step's time while sequences decode\n(default 1: inter-token latency up to about 2x; 0 "
      "= off)",
      CLI_FLOAT, BO(sp.prefill_share), 0, 1000, NULL },
    { "--kv-pages", NULL, "N", "KV pages (default: enough for every sequence at full context)", CLI_INT, BO(sp.kv_pages),
      1, 1 << 28, NULL },
    { "--page-tokens", NULL, "N", "positions per KV page (default 256)", CLI_INT, BO(sp.page_tokens), 4, 1 << 20, NULL },
    { "--prefix-entries", NULL, "N", "prefix-cache entries (default 4 per sequence; 0 = off)", CLI_INT,
      BO(sp.prefix_entries), 0, 1 << 24, NULL },
    { "--kv-disk-dir", NULL, "DIR", "prefix cache on disk in DIR: kept across runs (docs/SERVING.md \"Disk tier\")",
      CLI_STR, BO(sp.kv_disk_dir), 0, 0, NULL },
    { "--kv-disk-budget", NULL, "SIZE", "bytes the disk tier may take (suffix K, M, G, T; default 10G)", CLI_BYTES,
      BO(sp.kv_disk_budget), 1 << 20, 1e18, NULL },
    { "--spec-draft", NULL, "K",
      "speculative decoding: tokens the MTP block drafts per step (0 = off;\ndefault off; docs/SPECULATIVE.md)", CLI_INT,
      BO(spec), 0, DSV4_SPEC_MAX_DRAFT, NULL },
    { "--max-queue", NULL, "N", "waiting requests (default 256)", CLI_INT, BO(sp.max_queue), 1, 1 << 24, NULL },
    { "--tiers", NULL, "S,M", "prompt tokens up to which a request is short, medium (default 512,4096)", CLI_CALL,
      BO(sp.tier_tokens), 0, 0, set_tiers },
    { "--tier-limits", NULL, "S,M,L", "running sequences per tier (default N,N,N/4)", CLI_CALL, BO(sp.tier_max_running), 0,
      0, set_tier_limits },
    { "--mem-limit", NULL, "MIB", "memory the plan may take (default: available RAM - weights - margin)", CLI_MIB,
      BO(sp.mem_limit), 1, (double)(1LL << 40), NULL },
    { "--logits-dir", NULL, "DIR", "write each request's logits rows to DIR/INDEX.f32 (float32 [n, vocab])", CLI_STR,
      BO(logits_dir), 0, 0, NULL },
    { "--timestamps", NULL, NULL, "add each token's time (ms since the start) to the results", CLI_FLAG, BO(stamps), 0, 0,
      NULL },
};
#undef BO

/* The requests read from the prompts file. */
struct breqs {
    struct breq *req;
    size_t       n;
    long         longest; /* prompt + max_tokens of the longest */
};

/* Reads the JSON lines of o->prompts; false after a message. */
static bool read_requests(const struct batch_opts *o, const dsv4_tokenizer *tok, const struct dsv4_model_info *info,
                          int32_t eos, struct breqs *R)
{
    FILE *in = strcmp(o->prompts, "-") ? fopen(o->prompts, "r") : stdin;
    if (!in) {
        fprintf(stderr, "dsv4 batch: cannot open %s: %s\n", o->prompts, strerror(errno));
        return false;
    }
    size_t cap = 0, lcap = 0;
    char  *line   = NULL;
    int    lineno = 0;
    bool   ok     = true;
    R->longest    = 1;
    while (ok && getline(&line, &lcap, in) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t je;
        json_t      *j = json_loads(line, 0, &je);
        if (!j) {
            fprintf(stderr, "dsv4 batch: line %d: %s\n", lineno, je.text);
            ok = false;
            break;
        }
        if (R->n == cap) {
            cap    = cap ? 2 * cap : 64;
            R->req = realloc(R->req, sizeof(*R->req) * cap);
        }
        struct breq *r = &R->req[R->n++];
        ok             = parse_request(j, lineno, tok, info->vocab_size, eos, r);
        json_decref(j);
        r->vocab = info->vocab_size;
        if (ok && (long)r->n_prompt + r->max_tokens > R->longest) R->longest = (long)r->n_prompt + r->max_tokens;
    }
    free(line);
    if (in != stdin) fclose(in);
    if (ok && !R->n) fprintf(stderr, "dsv4 batch: no requests in %s\n", o->prompts);
    return ok && R->n;
}

/* Submits the requests whose arrival time has come, in arrival order, from *next on. */
static void submit_due(dsv4_sched *sched, struct breqs *R, const size_t *order, size_t *next, double t0,
                       const char *logits_dir)
{
    struct dsv4_err err;
    double          now = cli_now() - t0;
    for (size_t k = *next; k < R->n && R->req[order[k]].arrival <= now; k++) {
        struct breq *r = &R->req[order[k]];
        if (r->submitted) continue;
        struct dsv4_request q = { .prompt = r->prompt, .n_prompt = r->n_prompt, .max_tokens = r->max_tokens,
                                  .sampling = r->sp, .stop_ids = r->stop, .n_stop = r->n_stop,
                                  .deadline_s = r->deadline, .on_event = on_event, .ud = r };
        if (logits_dir && !r->logits_f) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%zu.f32", logits_dir, order[k]);
            r->logits_f = fopen(path, "wb");
        }
        int src = dsv4_sched_submit(sched, &q, &r->sid, &err);
        if (src == DSV4_EFULL) {
            r->refusals++;
            break; /* keep the arrival order: retry after the next step */
        }
        r->submitted = true;
        r->t_submit  = cli_now();
        if (src) {
            fprintf(stderr, "dsv4 batch: request %zu: %s\n", order[k], err.msg);
            r->done = true;
            r->fin  = DSV4_FINISH_ERROR;
        }
    }
    while (*next < R->n && R->req[order[*next]].submitted) ++*next;
}

/* Runs every request through the scheduler as they arrive; the wall time. */
static double run_requests(dsv4_sched *sched, struct breqs *R, const char *logits_dir, double t0)
{
    struct dsv4_err err;
    size_t         *order = malloc(sizeof(size_t) * R->n);
    for (size_t i = 0; i < R->n; i++) order[i] = i;
    for (size_t i = 1; i < R->n; i++) /* insertion sort, stable */
        for (size_t j = i; j > 0 && R->req[order[j]].arrival < R->req[order[j - 1]].arrival; j--) {
            size_t t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    size_t next = 0;
    while (next < R->n || !dsv4_sched_is_idle(sched)) {
        submit_due(sched, R, order, &next, t0, logits_dir);
        if (dsv4_sched_is_idle(sched)) {
            if (next < R->n) {
                double wait = R->req[order[next]].arrival - (cli_now() - t0);
                if (wait > 0) nanosleep(&(struct timespec){ (time_t)wait, (long)((wait - floor(wait)) * 1e9) }, NULL);
            }
            continue;
        }
        if (dsv4_sched_step(sched, &err)) fprintf(stderr, "dsv4 batch: step failed: %s\n", err.msg);
    }
    free(order);
    return cli_now() - t0;
}

/* The scheduler's counters at the end. */
static void print_sched_summary(dsv4_sched *sched, int spec_draft)
{
    struct dsv4_sched_metrics mt;
    dsv4_sched_metrics(sched, &mt);
    fprintf(stderr,
            "dsv4 batch: %llu steps (%.2f s busy), %llu prefill + %llu decode rows, %llu preemptions, prefix cache "
            "%llu/%llu hits (%llu tokens), %llu refusals\n",
            (unsigned long long)mt.steps, mt.busy_s, (unsigned long long)mt.prefill_tokens,
            (unsigned long long)mt.decode_tokens, (unsigned long long)mt.preemptions,
            (unsigned long long)mt.prefix_hits, (unsigned long long)mt.prefix_lookups,
            (unsigned long long)mt.prefix_hit_tokens, (unsigned long long)mt.refused);
    if (!mt.spec_steps) return;
    fprintf(stderr, "dsv4 batch: speculative: %llu verify steps, %llu drafted, %llu kept (%.1f %%); kept per position:",
            (unsigned long long)mt.spec_steps, (unsigned long long)mt.spec_drafted, (unsigned long long)mt.spec_kept,
            100.0 * (double)mt.spec_kept / (double)mt.spec_drafted);
    for (int i = 0; i < spec_draft; i++) fprintf(stderr, " %.2f", (double)mt.spec_kept_at[i] / (double)mt.spec_steps);
    fprintf(stderr, "\n");
}

/* One JSON line per request, then the pooled latencies on stderr. */
static void write_results(FILE *out, const struct breqs *R, const dsv4_tokenizer *tok, double t0, double wall,
                          bool stamps)
{
    size_t n_ttft = 0, n_itl = 0, total_gap = 0;
    long   gen = 0, prompt = 0;
    for (size_t i = 0; i < R->n; i++) total_gap += R->req[i].n_out > 1 ? (size_t)(R->req[i].n_out - 1) : 0;
    double *ttft = malloc(sizeof(double) * R->n), *itl = malloc(sizeof(double) * (total_gap + 1));
    double  first_tok = 1e300, last_tok = 0;
    for (size_t i = 0; i < R->n; i++) {
        const struct breq *r = &R->req[i];
        json_t            *o = result_json(r, i, tok, t0, stamps);
        char              *s = json_dumps(o, JSON_COMPACT);
        fprintf(out, "%s\n", s);
        free(s);
        json_decref(o);
        gen += r->usage.completion_tokens;
        prompt += r->n_prompt;
        if (r->n_out) {
            ttft[n_ttft++] = r->usage.ttft_s;
            if (r->t_tok[0] < first_tok) first_tok = r->t_tok[0];
            if (r->t_tok[r->n_out - 1] > last_tok) last_tok = r->t_tok[r->n_out - 1];
        }
        for (int k = 1; k < r->n_out; k++) itl[n_itl++] = r->t_tok[k] - r->t_tok[k - 1];
    }
    qsort(ttft, n_ttft, sizeof(double), cmp_double);
    qsort(itl, n_itl, sizeof(double), cmp_double);
    fprintf(stderr,
            "dsv4 batch: %zu requests in %.2f s: %ld prompt tokens, %ld generated; %.2f generated tok/s overall, "
            "%.2f tok/s from first to last token\n",
            R->n, wall, prompt, gen, (double)gen / wall, last_tok > first_tok ? (double)gen / (last_tok - first_tok) : 0);
    fprintf(stderr, "dsv4 batch: TTFT P50 %.1f ms P99 %.1f ms; inter-token latency P50 %.1f ms P99 %.1f ms (%zu gaps)\n",
            pct(ttft, n_ttft, 0.5) * 1e3, pct(ttft, n_ttft, 0.99) * 1e3, pct(itl, n_itl, 0.5) * 1e3,
            pct(itl, n_itl, 0.99) * 1e3, n_itl);
    free(ttft);
    free(itl);
}

static int batch_close(struct breqs *R, dsv4_sched *sched, dsv4_tokenizer *tok, dsv4_engine *e, FILE *out, int rc)
{
    if (out && out != stdout) fclose(out);
    dsv4_sched_free(sched);
    for (size_t i = 0; i < R->n; i++) {
        if (R->req[i].logits_f) fclose(R->req[i].logits_f);
        json_decref(R->req[i].id);
        free(R->req[i].prompt);
        free(R->req[i].stop);
        free(R->req[i].out);
        free(R->req[i].t_tok);
    }
    free(R->req);
    dsv4_tokenizer_free(tok);
    dsv4_engine_close(e);
    return rc;
}

int cmd_batch(int argc, char **argv)
{
    struct batch_opts o = { .spec = -1 };
    dsv4_sched_params_default(&o.sp);
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    ep.log    = cli_log_stderr;
    ep.log_ud = "batch";
    const struct cli_group groups[] = { { NULL, BATCH_OPTS, sizeof(BATCH_OPTS) / sizeof(BATCH_OPTS[0]), &o },
                                        cli_engine_group(&ep, true) };
    const struct cli_spec  spec = { "batch", "usage: dsv4 batch -m DIR --prompts FILE [options]\n", groups, 2, NULL };
    int                    rc   = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!o.dir || !o.prompts) return cli_usage_error(&spec, "-m and --prompts are required");
    struct dsv4_err err;
    dsv4_engine    *e = NULL;
    if (dsv4_engine_open(&e, o.dir, &ep, &err)) {
        fprintf(stderr, "dsv4 batch: %s\n", err.msg);
        return 1;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    o.sp.spec_draft     = o.spec >= 0 ? o.spec : info.has_mtp ? DSV4_SPEC_DRAFT_DEFAULT : 0;
    dsv4_tokenizer *tok = NULL;
    if (dsv4_tokenizer_load(&tok, o.dir, &err)) tok = NULL; /* token-id prompts still work */
    int32_t      eos   = tok ? dsv4_tokenizer_eos(tok) : info.eos_id;
    struct breqs R     = { 0 };
    dsv4_sched  *sched = NULL;
    FILE        *out   = NULL;
    if (!read_requests(&o, tok, &info, eos, &R)) return batch_close(&R, sched, tok, e, out, 1);
    o.sp.max_ctx = o.ctx ? o.ctx : (int)(R.longest < info.max_ctx ? R.longest : info.max_ctx);
    if (dsv4_sched_create(e, &o.sp, &sched, &err)) {
        fprintf(stderr, "dsv4 batch: %s\n", err.msg);
        return batch_close(&R, sched, tok, e, out, 1);
    }
    struct dsv4_sched_plan plan;
    dsv4_sched_get_plan(sched, &plan);
    print_plan(&plan);
    if (o.logits_dir) mkdir(o.logits_dir, 0777);
    double t0   = cli_now();
    double wall = run_requests(sched, &R, o.logits_dir, t0);
    out         = o.out_path ? fopen(o.out_path, "w") : stdout;
    if (!out) {
        fprintf(stderr, "dsv4 batch: cannot create %s: %s\n", o.out_path, strerror(errno));
        return batch_close(&R, sched, tok, e, out, 1);
    }
    write_results(out, &R, tok, t0, wall, o.stamps);
    print_sched_summary(sched, o.sp.spec_draft);
    return batch_close(&R, sched, tok, e, out, 0);
}
