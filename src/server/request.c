/*
 * request.c - the core every request goes through, whatever its dialect: sampling, stop
 * strings, speculative decoding and the limit on generated tokens. Each is read here once;
 * a dialect only says where its fields differ (the field names, the ranges of struct
 * srv_sampling_spec).
 *
 * The limit (srv_req_limit) is one rule for the three dialects (docs/SERVER.md,
 * "max_tokens"): a limit above the model's max_position_embeddings could never be met by
 * any server, so it is a client error (400); a limit the model could hold but this server's
 * context (--ctx, less the prompt) cannot is clipped to what the context leaves, and an
 * answer cut there ends as one that reached its limit (finish_reason "length", stop_reason
 * "max_tokens", status "incomplete"). Coding agents send large limits as a matter of course
 * (32000 and more) and work on with a clipped answer; a 400 would stop them.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

/* presence_penalty, frequency_penalty (OpenAI: [-2, 2]), repetition_penalty (vLLM: (0, 2]...
 * taken up to 10) and logit_bias ({"token id": bias in [-100, 100]}, at most 300). */
static int parse_penalties(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    double pp = 0, fp = 0, rp = 1;
    if (srv_json_num(o, "presence_penalty", -2, 2, false, &pp, e) ||
        srv_json_num(o, "frequency_penalty", -2, 2, false, &fp, e) ||
        srv_json_num(o, "repetition_penalty", 0, 10, true, &rp, e))
        return -1;
    g->sp.presence_penalty   = (float)pp;
    g->sp.frequency_penalty  = (float)fp;
    g->sp.repetition_penalty = (float)rp;
    json_t *lb = srv_json_field(o, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb)) return srv_api_fail(e, 400, "logit_bias", "'logit_bias' must be an object {\"token id\": bias}");
    if (json_object_size(lb) > DSV4_MAX_LOGIT_BIAS)
        return srv_api_fail(e, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", json_object_size(lb),
                            DSV4_MAX_LOGIT_BIAS);
    const char *key;
    json_t     *v;
    json_object_foreach(lb, key, v) {
        char     *end = NULL;
        long long id  = strtoll(key, &end, 10);
        if (!key[0] || *end || id < 0 || id >= c->vocab)
            return srv_api_fail(e, 400, "logit_bias", "logit_bias key '%.40s' is not a token id (0 to %d)", key, c->vocab - 1);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return srv_api_fail(e, 400, "logit_bias", "logit_bias[%s] must be a number in [-100, 100]", key);
        g->sp.bias_id[g->sp.n_bias] = (int32_t)id;
        g->sp.bias[g->sp.n_bias++]  = (float)json_number_value(v);
    }
    return 0;
}

int srv_req_sampling(const struct srv_api_ctx *c, json_t *o, const struct srv_sampling_spec *spec, struct srv_gen *g,
                     struct srv_api_error *e)
{
    double    temp = 1.0, top_p = 1.0, min_p = 0.0;
    long long top_k = 0, seed = 0;
    if (srv_json_num(o, "temperature", 0, spec->temp_max, false, &temp, e) ||
        srv_json_num(o, "top_p", 0, 1, true, &top_p, e) || srv_json_num(o, "min_p", 0, 1, false, &min_p, e) ||
        srv_json_int(o, "top_k", spec->top_k_min, 1 << 30, &top_k, e))
        return -1;
    g->sp.temperature = (float)temp;
    g->sp.top_p       = (float)top_p;
    g->sp.min_p       = (float)min_p;
    g->sp.top_k       = top_k < 0 ? 0 : (int)top_k;
    if (srv_json_field(o, "seed")) {
        if (srv_json_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e)) return -1;
        g->sp.seed = (uint64_t)seed;
    } else {
        g->sp.seed = srv_random_u64();
    }
    return parse_penalties(c, o, g, e);
}

int srv_req_stop(json_t *o, const char *key, bool one_ok, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *v = srv_json_field(o, key);
    if (!v) return 0;
    json_t  *one[1] = { v };
    json_t **items  = one;
    size_t   n      = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SRV_MAX_STOP)
            return srv_api_fail(e, 400, key, "'%s' has %zu strings; at most %d are supported", key, n, SRV_MAX_STOP);
        items = NULL;
    } else if (!one_ok || !json_is_string(v)) {
        return srv_api_fail(e, 400, key, "'%s' must be %san array of strings", key, one_ok ? "a string or " : "");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items ? items[i] : json_array_get(v, i);
        if (!json_is_string(s))
            return srv_api_fail(e, 400, key, "'%s' must be %san array of strings", key, one_ok ? "a string or " : "");
        size_t len = json_string_length(s);
        if (len == 0 || len > SRV_MAX_STOP_LEN || strlen(json_string_value(s)) != len)
            return srv_api_fail(e, 400, key, "each stop string must have 1 to %d bytes and no NUL", SRV_MAX_STOP_LEN);
        memcpy(g->stop[g->n_stop], json_string_value(s), len + 1);
        g->n_stop++;
    }
    return 0;
}

/* "speculative": {"draft": K}: K tokens drafted by the MTP block per step, 0 = off (absent:
 * the server's --spec-draft); docs/SERVER.md */
int srv_req_speculative(json_t *o, struct srv_gen *g, struct srv_api_error *e)
{
    json_t *spec = srv_json_field(o, "speculative");
    if (!spec) return 0;
    long long k = -1;
    if (!json_is_object(spec) || json_object_size(spec) != 1 || !json_object_get(spec, "draft"))
        return srv_api_fail(e, 400, "speculative", "'speculative' must be an object {\"draft\": K}");
    if (srv_json_int(spec, "draft", 0, DSV4_SPEC_MAX_DRAFT, &k, e)) return -1;
    g->spec_draft = k == 0 ? -1 : (int)k;
    return 0;
}

int srv_req_limit(const struct srv_api_ctx *c, long long limit, const char *param, long long dflt, struct srv_gen *g,
                  struct srv_api_error *e)
{
    int max_pos = c->max_pos > 0 ? c->max_pos : c->ctx;
    if (limit > max_pos) {
        srv_api_fail(e, 400, param, "'%s' is %lld; this model's maximum context length is %d tokens "
                     "(max_position_embeddings), so no answer can be that long", param, limit, max_pos);
        e->code = "context_length_exceeded";
        return -1;
    }
    if (g->n_prompt >= c->ctx) return SRV_REQ_NO_ROOM;
    long long room = c->ctx - g->n_prompt;
    if (limit <= 0) limit = dflt;
    g->max_tokens = (int)(limit > 0 && limit < room ? limit : room);
    return 0;
}
