/*
 * cmd_run.c - `dsv4 run`: generate from a prompt (text through the model directory's
 * tokenizer.json, or token ids), streaming the output as it comes, then one line with the
 * prefill and decode speeds. With --kv-disk-dir the prompt goes through the prompt cache
 * (dsv4_prompt_cache_eval): a stored prefix is loaded instead of evaluated, and the state at
 * the prompt's deepest page boundary is stored for the next run. A directory another process
 * holds is an error (exit 1), not a silent run without the cache.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

struct run_opts {
    const char *dir, *prompt, *tok_text;
    int         n_gen, ctx, spec;
    bool        bos, print_ids;
};

#define RO(field) offsetof(struct run_opts, field)
static const struct cli_opt RUN_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory", CLI_STR, RO(dir), 0, 0, NULL },
    { "--prompt", "-p", "TEXT", "prompt text, encoded with DIR/tokenizer.json (no BOS unless --bos)", CLI_STR,
      RO(prompt), 0, 0, NULL },
    { "--tokens", NULL, "LIST", "prompt as token ids (commas, spaces or newlines)", CLI_STR, RO(tok_text), 0, 0, NULL },
    { "-n", NULL, "N", "tokens to generate (default 64); stops earlier at EOS", CLI_INT, RO(n_gen), 0, 1 << 24, NULL },
    { "--ctx", NULL, "N", "context length (default: prompt + N)", CLI_INT, RO(ctx), 1, 1 << 30, NULL },
    { "--bos", NULL, NULL, "start the prompt with BOS", CLI_FLAG, RO(bos), 0, 0, NULL },
    { "--ids", NULL, NULL, "print token ids instead of text", CLI_FLAG, RO(print_ids), 0, 0, NULL },
    { "--spec-draft", NULL, "K",
      "speculative decoding: K tokens drafted by the MTP block per step, verified\nin one (default 0 = off; "
      "docs/SPECULATIVE.md)",
      CLI_INT, RO(spec), 0, DSV4_SPEC_MAX_DRAFT, NULL },
};
#undef RO

/* The decode loop's state and figures. */
struct run_gen {
    dsv4_session             *s;
    dsv4_sampler             *smp;
    const dsv4_tokenizer     *tok; /* NULL: print ids */
    int                       max_ctx, spec, generated, steps, drafted;
    int32_t                   info_eos; /* the model's EOS id (without a tokenizer) */
    int                       kept_at[DSV4_SPEC_MAX_DRAFT];
};

/* The prompt's ids (text through the tokenizer, or the --tokens list); 0, or the exit status. */
static int prompt_ids(const struct run_opts *o, const dsv4_tokenizer *tok, int32_t **ids, int *n_ids)
{
    struct dsv4_err err;
    if (!o->prompt) return cli_parse_tokens("run", o->tok_text, ids, n_ids) ? 0 : 2;
    size_t len = strlen(o->prompt), cap = 3 * len + 2, n = 0;
    *ids       = malloc(sizeof(int32_t) * cap);
    if (!*ids || dsv4_tokenizer_encode(tok, o->prompt, len, o->bos ? DSV4_TOKENIZE_BOS : 0, *ids, cap, &n, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", *ids ? err.msg : "out of memory");
        return 1;
    }
    *n_ids = (int)n;
    if (n == 0) {
        fprintf(stderr, "dsv4 run: the prompt encodes to no tokens\n");
        return 1;
    }
    return 0;
}

/* Samples and prints up to n_gen tokens after the prompt (speculative steps when g->spec > 0),
 * stopping at eos; false after an engine error. */
static bool generate(struct run_gen *g, int n_gen, int32_t eos)
{
    struct dsv4_err              err;
    struct dsv4_tokenizer_stream ts;
    size_t                       tcap = g->tok ? 3 * (dsv4_tokenizer_max_token_bytes(g->tok) + 3) : 0, n = 0;
    char                        *text = g->tok ? malloc(tcap + 8) : NULL;
    bool                         ok   = true;
    if (g->tok) dsv4_tokenizer_stream_init(&ts);
    int     n_pend = 0;
    int32_t pend[DSV4_SPEC_MAX_DRAFT + 1]; /* chosen tokens not printed yet; the last is not fed */
    pend[n_pend++] = dsv4_sampler_sample(g->smp, dsv4_session_logits(g->s), NULL);
    while (g->generated < n_gen) {
        int32_t next = pend[0];
        if (next == eos) break;
        if (!g->tok) printf("%s%d", g->generated ? " " : "", next);
        else if (dsv4_tokenizer_stream_push(g->tok, &ts, next, text, tcap, &n, &err) == DSV4_OK) fwrite(text, 1, n, stdout);
        fflush(stdout);
        g->generated++;
        memmove(pend, pend + 1, sizeof(int32_t) * (size_t)--n_pend);
        if (n_pend) continue; /* evaluated already by the speculative step */
        if (g->generated == n_gen) break;
        int room = g->max_ctx - dsv4_session_pos(g->s);
        if (room <= 0) {
            fprintf(stderr, "\ndsv4 run: context of %d tokens is full\n", g->max_ctx);
            break;
        }
        int k = g->spec < room - 1 ? g->spec : room - 1;
        if (dsv4_session_spec_step(g->s, next, k, g->smp, pend, &n_pend, NULL, &err)) {
            fprintf(stderr, "\ndsv4 run: %s\n", err.msg);
            ok = false;
            break;
        }
        if (k > 0) {
            g->steps++, g->drafted += k;
            for (int i = 0; i < n_pend - 1; i++) g->kept_at[i]++;
        }
    }
    if (ok && g->tok) {
        dsv4_tokenizer_stream_flush(&ts, text, &n);
        fwrite(text, 1, n, stdout);
    }
    free(text);
    return ok;
}

static void report(const struct run_gen *g, int n_ids, double t0, double t1, double t2)
{
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s); decode: %d tokens in %.3f s (%.2f tok/s)\n", n_ids,
            t1 - t0, n_ids / (t1 - t0), g->generated, t2 - t1, g->generated > 0 ? g->generated / (t2 - t1) : 0.0);
    if (!g->steps) return;
    int kept = 0;
    for (int i = 0; i < g->spec; i++) kept += g->kept_at[i];
    fprintf(stderr, "speculative: %d steps of %d drafts, %d drafted, %d kept (%.1f %%), %.2f tokens a step; kept "
                    "per position:", g->steps, g->spec, g->drafted, kept, 100.0 * kept / g->drafted,
            (double)(kept + g->steps) / g->steps);
    for (int i = 0; i < g->spec; i++) fprintf(stderr, " %.2f", (double)g->kept_at[i] / g->steps);
    fprintf(stderr, "\n");
}

/* Opens the engine, a session sized for the prompt and the tokens to come, and the sampler. */
static int open_run(const struct run_opts *o, struct dsv4_engine_params *ep, const struct cli_sampling *cs, int n_ids,
                    dsv4_engine **e, struct run_gen *g)
{
    struct dsv4_err err;
    ep->log    = cli_log_stderr;
    ep->log_ud = (void *)"run";
    if (dsv4_engine_open(e, o->dir, ep, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        return 1;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(*e, &info);
    struct dsv4_session_params ssp;
    dsv4_session_params_default(&ssp);
    ssp.max_ctx = o->ctx ? o->ctx : n_ids + o->n_gen;
    if (ssp.max_ctx > info.max_ctx) ssp.max_ctx = info.max_ctx;
    g->spec = o->spec >= 0 ? o->spec : info.has_mtp ? DSV4_SPEC_DRAFT_DEFAULT : 0;
    if (g->spec > 0 && !info.has_mtp) {
        fprintf(stderr, "dsv4 run: --spec-draft needs a checkpoint with an MTP block\n");
        return 1;
    }
    ssp.mtp        = g->spec > 0;
    ssp.spec_draft = g->spec;
    g->max_ctx     = ssp.max_ctx;
    g->info_eos    = info.eos_id;
    if (n_ids > ssp.max_ctx) {
        fprintf(stderr, "dsv4 run: the prompt has %d tokens, more than the context of %d\n", n_ids, ssp.max_ctx);
        return 1;
    }
    if (dsv4_session_create(*e, &ssp, &g->s, &err) || dsv4_sampler_create(&g->smp, info.vocab_size, &cs->sp, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts     o = { .n_gen = 64, .spec = -1 };
    struct cli_sampling cs = { 0 };
    struct cli_kv_disk  kd = { 0 };
    dsv4_sampler_params_default(&cs.sp);
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group groups[] = { { NULL, RUN_OPTS, sizeof(RUN_OPTS) / sizeof(RUN_OPTS[0]), &o },
                                        cli_sampler_group(&cs), cli_kv_disk_group(&kd), cli_engine_group(&ep, true) };
    const struct cli_spec  spec = { "run", "usage: dsv4 run -m DIR (-p TEXT | --tokens LIST) [options]\n", groups, 4,
                                    NULL };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!o.dir || (!o.prompt == !o.tok_text)) return cli_usage_error(&spec, "-m and one of -p / --tokens are required");
    struct dsv4_err err;
    dsv4_tokenizer *tok   = NULL;
    dsv4_engine    *e     = NULL;
    struct run_gen  g     = { 0 };
    dsv4_prompt_cache *pc = NULL;
    int32_t        *ids   = NULL;
    int             n_ids = 0;
    if (o.prompt || !o.print_ids) {
        int trc = dsv4_tokenizer_load(&tok, o.dir, &err);
        if (trc && o.prompt) {
            fprintf(stderr, "dsv4 run: %s\n", err.msg);
            return 1;
        }
    }
    if ((rc = prompt_ids(&o, tok, &ids, &n_ids)) || (rc = open_run(&o, &ep, &cs, n_ids, &e, &g))) goto done;
    if (!cli_prompt_cache_open("run", &kd, g.s, &pc)) {
        rc = 1;
        goto done;
    }
    g.tok      = o.print_ids ? NULL : tok; /* no tokenizer: show ids */
    int32_t eos = tok ? dsv4_tokenizer_eos(tok) : g.info_eos;
    double  t0  = cli_now();
    rc          = 1;
    if (cli_prompt_cache_eval("run", pc, g.s, ids, n_ids, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        goto done;
    }
    double t1 = cli_now();
    if (!generate(&g, o.n_gen, eos)) goto done;
    double t2 = cli_now();
    printf("\n");
    fflush(stdout); /* the text, then the figures on stderr */
    report(&g, n_ids, t0, t1, t2);
    rc = 0;
done:
    free(ids);
    dsv4_prompt_cache_close(pc);
    dsv4_sampler_free(g.smp);
    dsv4_session_free(g.s);
    dsv4_engine_close(e);
    dsv4_tokenizer_free(tok);
    return rc;
}
