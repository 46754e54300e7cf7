/*
 * api.h - the inside of the server's API side, shared by its files and by nothing else
 * (http.c and the tests see server.h only): the dialect table, the request core, the shared
 * helpers and the state of the output pipeline.
 *
 * The API side is one request core and three dialects:
 *   api.c            the entry points: the dialect table and srv_api_parse (body -> JSON ->
 *                    the dialect's parser)
 *   request.c        the core of every request: sampling, stop strings, speculation and the
 *                    one max_tokens rule
 *   request_chat.c   the core of every chat request: tools converted to function tools, the
 *                    chat document rendered to the V4 prompt, forced and strict tool calls,
 *                    constrained output, the thinking budget
 *   api_openai.c     /v1/chat/completions and /v1/completions
 *   api_anthropic.c  /v1/messages and /v1/messages/count_tokens
 *   api_responses.c  /v1/responses                              (resp_store.c: its store)
 *   api_output.c     the output pipeline: detokenizer, stop strings, DSML parser
 *   api_util.c, strbuf.c  errors, ids, JSON fields; the string builder and UTF-8 repair
 * Calls run one way, so the files form no circle: http.c -> api.c / api_output.c -> the
 * table -> a dialect -> the core and the helpers. A dialect never calls another dialect, and
 * the core and the pipeline reach a dialect only through the table.
 */
#ifndef DSV4_SERVER_API_H
#define DSV4_SERVER_API_H

#include <jansson.h>

#include "server/server.h"

/* ==================================================================================== */
/* The dialects (api.c holds the table)                                                 */
/* ==================================================================================== */

struct srv_out;

/* One API dialect: how its requests are read and its answers written. The pipeline in
 * api_output.c produces reasoning, content and whole tool calls in struct srv_out; the
 * dialect turns them into its shapes. */
struct srv_dialect {
    const char *id_prefix;   /* of the response id: "chatcmpl-", "cmpl-", "msg_", "resp_" */
    const char *call_prefix; /* of tool call ids: "call_", "toolu_" */
    /* The body (a JSON object) -> g: prompt, sampling, limits. -1 with e filled. */
    int   (*parse)(const struct srv_api_ctx *c, json_t *o, struct srv_gen *g, struct srv_api_error *e);
    /* The dialect's part of a new output (NULL: none); -1 when out of memory. */
    int   (*open)(struct srv_out *o, const struct srv_gen *g, const struct srv_api_ctx *c);
    void  (*close)(struct srv_out *o);
    /* Streaming: the opening events. */
    void  (*begin)(struct srv_out *o, struct srv_buf *sse);
    /* A generated token's log-probabilities (NULL: the dialect offers none). */
    void  (*logprob)(struct srv_out *o, const struct srv_token *t);
    /* What the pipeline produced since the last call, written (streaming: as events to sse;
     * with every_token also when not streaming, to build the answer as it comes) and then
     * emptied (srv_out_clear_delta). */
    void  (*delta)(struct srv_out *o, struct srv_buf *sse);
    bool  every_token;
    /* The end: the last events (sse) or the whole body; e: the request failed. Returns the
     * HTTP status of a whole body (200 when streaming). */
    int   (*end)(struct srv_out *o, const struct srv_api_error *e, const char *finish, int n_cached,
                 struct srv_buf *sse, struct srv_buf *body);
    /* The error body in the dialect's shape (malloc'd). */
    char *(*error)(const struct srv_api_error *e, size_t *len);
    /* Several choices ("n" > 1; NULL: the dialect has one): once every choice ended (parts:
     * their whole bodies), the usage and [DONE] (sse) or the one body; returns its status. */
    int   (*end_choices)(struct srv_out **outs, int n, const struct srv_buf *parts, int status, int failed,
                         int n_completion, int n_cached, struct srv_buf *sse, struct srv_buf *body);
};

/* Registered in api.c's table; each defined by its module. */
extern const struct srv_dialect srv_dialect_chat, srv_dialect_completion; /* api_openai.c */
extern const struct srv_dialect srv_dialect_anthropic;                    /* api_anthropic.c */
extern const struct srv_dialect srv_dialect_responses;                    /* api_responses.c */

const struct srv_dialect *srv_dialect_of(enum srv_api_kind kind);

/* ==================================================================================== */
/* Shared helpers (api_util.c, strbuf.c)                                                */
/* ==================================================================================== */

/* Request fields (jansson): absent or null -> 0 and *out untouched; the wrong type or out
 * of range -> -1 with a 400 in e naming the field. */
json_t     *srv_json_field(json_t *o, const char *key);
int         srv_json_bool(json_t *o, const char *key, bool *out, struct srv_api_error *e);
int         srv_json_num(json_t *o, const char *key, double lo, double hi, bool lo_open, double *out,
                         struct srv_api_error *e);
int         srv_json_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                         struct srv_api_error *e);
/* The first key of o in none of the NULL-terminated lists, or NULL. */
const char *srv_json_unknown_key(json_t *o, const char *const *lists[], int n_lists);
/* Keeps a copy of the request's key as e's param (the request's JSON is freed before the
 * error is written). */
void        srv_api_param(struct srv_api_error *e, const char *key);
/* A JSON string of a buffer's bytes (invalid UTF-8 repaired, as srv_json_str). */
json_t     *srv_json_buf(const struct srv_buf *b);

/* ==================================================================================== */
/* The request core (request.c, request_chat.c)                                         */
/* ==================================================================================== */

/* The ranges of the sampling fields where dialects differ. */
struct srv_sampling_spec {
    double    temp_max;  /* temperature in [0, temp_max] */
    long long top_k_min; /* -1 (vLLM: -1 = off) or 0 */
};
/* temperature, top_p, min_p, top_k, seed (absent: a random one), the penalties and
 * logit_bias; fields a dialect does not accept were refused before as unknown. */
int  srv_req_sampling(const struct srv_api_ctx *c, json_t *o, const struct srv_sampling_spec *sp, struct srv_gen *g,
                      struct srv_api_error *e);
/* Stop strings from the field key: an array of strings (or one string, one_ok). */
int  srv_req_stop(json_t *o, const char *key, bool one_ok, struct srv_gen *g, struct srv_api_error *e);
/* "speculative": {"draft": K} into g->spec_draft. */
int  srv_req_speculative(json_t *o, struct srv_gen *g, struct srv_api_error *e);

/* The max_tokens rule (docs/SERVER.md, "max_tokens"): limit (0: none asked, then dflt, 0:
 * what the context leaves) against the model and the context, into g->max_tokens. A limit
 * above max_position_embeddings is a 400 naming param; a prompt that leaves no room returns
 * SRV_REQ_NO_ROOM and the dialect words its 400; anything else is clipped. */
enum { SRV_REQ_NO_ROOM = 1 };
int  srv_req_limit(const struct srv_api_ctx *c, long long limit, const char *param, long long dflt, struct srv_gen *g,
                   struct srv_api_error *e);

/* How a dialect writes a tool: Anthropic {name, description, input_schema} (type absent or
 * "custom"), Responses {type: function, name, description, parameters}. */
struct srv_tool_shape {
    const char *type;       /* the type a tool must have, or NULL: absent or "custom" */
    const char *schema;     /* the key of its JSON schema */
    bool        schema_required;
    const char *only;       /* the 400's explanation for a tool of another type */
    const char *needs;      /* the 400's list of what a tool needs */
};
/* tools -> function tools [{type: function, function: {name, description, parameters,
 * strict}}] (*out NULL when there are none). */
int  srv_req_tools(json_t *tools, const struct srv_tool_shape *shape, json_t **out, struct srv_api_error *e);
/* Whether function tools offer name. */
bool srv_req_has_tool(json_t *tools, const char *name);

/* A chat request in the V4 chat encoding, as every dialect fills it. */
struct srv_chat {
    json_t                 *messages;   /* the chat messages (owned; consumed by srv_req_chat) */
    json_t                 *tools;      /* function tools offered (owned), or NULL */
    bool                    force;      /* a tool call is forced */
    const char             *forced;     /* of this tool (NULL: any); points into the request */
    json_t                 *format;     /* response_format / text.format (borrowed), or NULL */
    const char             *format_param;
    bool                    format_flat; /* the Responses shape {type, schema} */
    struct dsv4_chat_params cp;
    long long               think_budget; /* reasoning tokens at most, -1: no bound */
    const char             *param;      /* what the messages are called in errors */
};
void srv_chat_init(struct srv_chat *ch);
void srv_chat_free(struct srv_chat *ch);
/* The message that leads the document, where the encoding puts tools and format hints: a
 * new empty system message when the list begins with none, else a shallow copy of the
 * first (so the request's own message is never changed). */
json_t *srv_req_lead_system(json_t *messages);
/* The chat -> g: prompt (rendered, tokenized; a forced call's opening appended), the
 * constraints (format, strict tools, thinking budget). count_only: the prompt alone. */
int  srv_req_chat(const struct srv_api_ctx *c, struct srv_chat *ch, bool count_only, struct srv_gen *g,
                  struct srv_api_error *e);
/* The thinking mode of an effort word (none, minimal, low, medium, high, xhigh, max) in v
 * (NULL: unchanged); a 400 naming param for another word or type. */
int  srv_req_effort(json_t *v, const char *name, const char *param, struct dsv4_chat_params *cp,
                    struct srv_api_error *e);

/* ==================================================================================== */
/* The output pipeline's state (api_output.c), read and written by the dialects' output   */
/* ==================================================================================== */

/* Anthropic streams: the content block open, and the next block's index. */
enum srv_anth_block { SRV_ANTH_NONE = 0, SRV_ANTH_THINKING, SRV_ANTH_TEXT, SRV_ANTH_TOOL };
struct srv_anth_stream {
    enum srv_anth_block open;
    int                 index, next;
};
/* Responses: the answer's output items as they are built (streamed or not). */
enum srv_resp_item { SRV_RESP_NONE = 0, SRV_RESP_REASONING, SRV_RESP_MESSAGE };
struct srv_resp_stream {
    json_t            *items; /* finished output items */
    enum srv_resp_item open;  /* the item text goes to */
    int                index, seq;
    char               item_id[40];
    struct srv_buf     text;  /* the open item's text so far */
};

struct srv_out {
    const struct srv_dialect *d;
    enum srv_api_kind     kind;
    bool                  stream, include_usage, logprobs, ids_as_text, token_ids, parse_chat;
    int                   top_logprobs;
    int                   n_prompt;
    char                  id[40];
    long long             created;
    const char           *model;
    int                   n_stop;
    char                  stop[SRV_MAX_STOP][SRV_MAX_STOP_LEN + 1];
    size_t                hold;     /* longest stop string - 1: bytes that may still start one */
    const dsv4_tokenizer *tok;      /* NULL: ids only */
    int32_t               eos;
    int32_t               think_end, dsml; /* ids of "</think>" and "｜DSML｜", -1 if none */
    bool                  keep_special;    /* skip_special_tokens: false */
    bool                  think_open;      /* thinking mode before the first </think> */

    struct dsv4_tokenizer_stream ts;
    char                        *tbuf; /* one token's text */
    size_t                       tcap;
    struct srv_buf               pend;    /* decoded text held back for stop strings */
    bool                         stopped; /* a stop string matched */
    int                          stop_hit; /* which one */
    struct srv_anth_stream       anth;     /* Anthropic streams: the open content block */
    struct srv_resp_stream       resp;     /* Responses: the output items */
    int                          n_reason; /* tokens generated while thinking */
    json_t                      *echo, *conv; /* Responses: see struct srv_gen */
    bool                         store;
    struct srv_resp_store       *responses;
    struct srv_turns            *turns;      /* chats: this turn's tokens are kept there at the end */
    int32_t                     *prompt_ids; /* chats: the prompt, then the tokens generated */
    int32_t                     *gen_ids;
    int                          n_gen, gen_cap;
    int                          choice, n_choices; /* index of n (srv_out_set_choice) */
    int                          n_tok;   /* tokens consumed */
    dsv4_chat_stream            *cs;
    bool                         cs_failed;

    /* The response so far (whole body) or the delta of the next chunk (streaming). */
    struct srv_buf content, reasoning;
    json_t        *calls;     /* tool calls, OpenAI-shaped {id, type, function: {name, arguments}} */
    int            n_calls;
    json_t        *lp;        /* chat: [entries]; completions: {tokens, token_logprobs, ...} */
    json_t        *ids;       /* token ids (completions with token_ids) */
    size_t         text_off;  /* completions logprobs: bytes of text before the next token */
};

/* Empties the delta (text, reasoning, calls) once a dialect has written it. */
static inline void srv_out_clear_delta(struct srv_out *o)
{
    o->content.len   = 0;
    o->reasoning.len = 0;
    json_array_clear(o->calls);
}

/* A whole body from an answer object (consumed) or, when there is none or it cannot be
 * written, from the error in the dialect's shape; returns the HTTP status. */
int srv_out_body(struct srv_out *o, json_t *answer, const struct srv_api_error *e, struct srv_buf *body);

#endif /* DSV4_SERVER_API_H */
