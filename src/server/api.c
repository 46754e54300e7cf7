/*
 * api.c - the entry points of the API side: the table of dialects, and srv_api_parse, which
 * bounds and parses a body and hands the JSON object to its dialect's parser.
 *
 * The table is the one place that knows every dialect: the request core and the output
 * pipeline (api_output.c) reach a dialect only through it, so adding a dialect is a module
 * and a line here (see api.h for the order of calls).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "server/api.h"

const struct srv_dialect *srv_dialect_of(enum srv_api_kind kind)
{
    static const struct srv_dialect *const table[] = {
        [SRV_API_CHAT]       = &srv_dialect_chat,
        [SRV_API_COMPLETION] = &srv_dialect_completion,
        [SRV_API_MESSAGES]   = &srv_dialect_anthropic,
        [SRV_API_COUNT]      = &srv_dialect_anthropic, /* its parser stops at the prompt */
        [SRV_API_RESPONSES]  = &srv_dialect_responses,
    };
    return table[kind];
}

int srv_api_parse(const struct srv_api_ctx *c, enum srv_api_kind kind, const char *body, size_t len,
                  struct srv_gen *g, struct srv_api_error *e)
{
    const struct srv_dialect *d = srv_dialect_of(kind);
    memset(g, 0, sizeof(*g));
    g->kind    = kind;
    g->created = (long long)time(NULL);
    dsv4_sampler_params_default(&g->sp);
    srv_api_make_id(g->id, sizeof(g->id), d->id_prefix);
    int depth = srv_json_depth(body, len);
    if (depth > c->max_json_depth)
        return srv_api_fail(e, 400, NULL, "the JSON body nests %d levels deep; the limit is %d", depth,
                            c->max_json_depth);
    json_error_t jerr;
    json_t      *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return srv_api_fail(e, 400, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                            jerr.column);
    int rc = json_is_object(o) ? d->parse(c, o, g, e) : srv_api_fail(e, 400, NULL, "the body must be a JSON object");
    json_decref(o);
    if (rc) srv_gen_free(g);
    return rc;
}

void srv_gen_free(struct srv_gen *g)
{
    free(g->prompt);
    g->prompt = NULL;
    free(g->forced);
    g->forced = NULL;
    dsv4_constraint_free(g->constraint);
    g->constraint = NULL;
    json_decref(g->conv);
    json_decref(g->echo);
    g->conv = g->echo = NULL;
}
