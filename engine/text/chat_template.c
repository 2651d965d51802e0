/* chat_template: finds a model's chat template, parses it once, renders it per request. */
#include "engine/text/chat_template.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/jinja.h"
#include "engine/util.h"

struct chat_template {
    struct jinja_template *main;     // "default", or the only template
    struct jinja_template *tool_use; // the "tool_use" named template, for requests with tools
    char *bos, *eos;                 // tokenizer_config.json's special tokens, or NULL
    enum chat_template_tools tools;  // the tool-call syntax its text shows
};

const char *chat_template_strerror(int status) {
    switch (status) {
    case CHAT_TEMPLATE_OK: return "ok";
    case CHAT_TEMPLATE_ERR_NONE: return "the model has no chat template";
    case CHAT_TEMPLATE_ERR_IO: return "cannot read the chat template";
    case CHAT_TEMPLATE_ERR_CONFIG: return "malformed tokenizer_config.json";
    case CHAT_TEMPLATE_ERR_SYNTAX: return "chat template syntax error";
    case CHAT_TEMPLATE_ERR_RENDER: return "chat template render error";
    case CHAT_TEMPLATE_ERR_RAISED: return "the chat template rejected the conversation";
    case CHAT_TEMPLATE_ERR_LIMIT: return "chat template exceeded a limit";
    case CHAT_TEMPLATE_ERR_INVALID: return "invalid chat template arguments";
    case CHAT_TEMPLATE_ERR_NOMEM: return "out of memory";
    default: return "unknown chat template error";
    }
}

static int from_jinja(int status) {
    switch (status) {
    case JINJA_OK: return CHAT_TEMPLATE_OK;
    case JINJA_ERR_NOMEM: return CHAT_TEMPLATE_ERR_NOMEM;
    case JINJA_ERR_SYNTAX: return CHAT_TEMPLATE_ERR_SYNTAX;
    case JINJA_ERR_RAISED: return CHAT_TEMPLATE_ERR_RAISED;
    case JINJA_ERR_LIMIT: return CHAT_TEMPLATE_ERR_LIMIT;
    case JINJA_ERR_INVALID: return CHAT_TEMPLATE_ERR_INVALID;
    default: return CHAT_TEMPLATE_ERR_RENDER;
    }
}

__attribute__((format(printf, 4, 5))) static int fail(int status, char *err, size_t errlen,
                                                      const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}


/* A special token as tokenizer_config.json writes it: "<s>", or an AddedToken object
 * {"content": "<s>", ...}, or null. */
static char *token_string(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(t)) t = cJSON_GetObjectItemCaseSensitive(t, "content");
    if (!cJSON_IsString(t) || !t->valuestring) return NULL;
    return strdup(t->valuestring);
}

void chat_template_free(struct chat_template *ct) {
    if (!ct) return;
    jinja_free(ct->main);
    jinja_free(ct->tool_use);
    free(ct->bos);
    free(ct->eos);
    free(ct);
}

const char *chat_template_bos_token(const struct chat_template *ct) { return ct ? ct->bos : NULL; }
const char *chat_template_eos_token(const struct chat_template *ct) { return ct ? ct->eos : NULL; }

enum chat_template_tools chat_template_tool_syntax(const struct chat_template *ct) {
    return ct ? ct->tools : CHAT_TEMPLATE_TOOLS_UNKNOWN;
}

/* The tool-call syntax a template's text shows (the first found, in this order). */
static enum chat_template_tools tools_of(const char *src, size_t len) {
    static const struct {
        const char *needle;
        enum chat_template_tools t;
    } signs[] = {{"<tool_call>", CHAT_TEMPLATE_TOOLS_HERMES},
                 {"[TOOL_CALLS]", CHAT_TEMPLATE_TOOLS_MISTRAL},
                 {"<|python_tag|>", CHAT_TEMPLATE_TOOLS_LLAMA3},
                 {"ipython", CHAT_TEMPLATE_TOOLS_LLAMA3}};
    for (size_t i = 0; i < sizeof signs / sizeof *signs; i++)
        if (memmem(src, len, signs[i].needle, strlen(signs[i].needle))) return signs[i].t;
    return CHAT_TEMPLATE_TOOLS_UNKNOWN;
}

/* Parses src into *t; syntax errors are reported with where the template came from. Notes the
 * tool-call syntax in ct. */
static int parse(struct chat_template *ct, const char *src, size_t len, const char *origin,
                 struct jinja_template **t, char *err, size_t errlen) {
    if (!ct->tools) ct->tools = tools_of(src, len);
    char jerr[512];
    int rc = jinja_parse(src, len, NULL, t, jerr, sizeof jerr);
    if (rc != JINJA_OK)
        return fail(from_jinja(rc), err, errlen, "chat template %s: %s", origin,
                    rc == JINJA_ERR_NOMEM ? "out of memory" : jerr);
    return CHAT_TEMPLATE_OK;
}

int chat_template_from_string(const char *src, size_t len, const char *bos_token,
                              const char *eos_token, struct chat_template **out, char *err,
                              size_t errlen) {
    *out = NULL;
    if (!src) return fail(CHAT_TEMPLATE_ERR_INVALID, err, errlen, "no template text");
    struct chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return fail(CHAT_TEMPLATE_ERR_NOMEM, err, errlen, "out of memory");
    if ((bos_token && !(ct->bos = strdup(bos_token))) ||
        (eos_token && !(ct->eos = strdup(eos_token)))) {
        chat_template_free(ct);
        return fail(CHAT_TEMPLATE_ERR_NOMEM, err, errlen, "out of memory");
    }
    int rc = parse(ct, src, len, "(string)", &ct->main, err, errlen);
    if (rc != CHAT_TEMPLATE_OK) {
        chat_template_free(ct);
        return rc;
    }
    *out = ct;
    return CHAT_TEMPLATE_OK;
}

/* tokenizer_config.json's chat_template: a string, or [{name, template}, ...]. */
static int load_from_config(struct chat_template *ct, const cJSON *cfg, const char *cfg_path,
                            char *err, size_t errlen) {
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (!tpl || cJSON_IsNull(tpl))
        return fail(CHAT_TEMPLATE_ERR_NONE, err, errlen,
                    "the model has no chat template (no chat_template.jinja, no chat_template in "
                    "%s); give one with --chat-template FILE",
                    cfg_path);
    if (cJSON_IsString(tpl))
        return parse(ct, tpl->valuestring, strlen(tpl->valuestring), cfg_path, &ct->main, err, errlen);
    if (!cJSON_IsArray(tpl))
        return fail(CHAT_TEMPLATE_ERR_CONFIG, err, errlen,
                    "%s: chat_template must be a string or a list of {name, template}", cfg_path);
    const cJSON *e;
    cJSON_ArrayForEach(e, tpl) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(name) || !cJSON_IsString(text))
            return fail(CHAT_TEMPLATE_ERR_CONFIG, err, errlen,
                        "%s: chat_template entries need string name and template", cfg_path);
        struct jinja_template **slot = !strcmp(name->valuestring, "default")    ? &ct->main
                                       : !strcmp(name->valuestring, "tool_use") ? &ct->tool_use
                                                                                : NULL;
        if (!slot || *slot) continue;
        int rc = parse(ct, text->valuestring, strlen(text->valuestring), cfg_path, slot, err, errlen);
        if (rc != CHAT_TEMPLATE_OK) return rc;
    }
    if (!ct->main)
        return fail(CHAT_TEMPLATE_ERR_NONE, err, errlen,
                    "%s has named chat templates but none called 'default'; give one with "
                    "--chat-template FILE",
                    cfg_path);
    return CHAT_TEMPLATE_OK;
}

int chat_template_load(const char *model_dir, const char *template_file, struct chat_template **out,
                       char *err, size_t errlen) {
    *out = NULL;
    if (!model_dir && !template_file)
        return fail(CHAT_TEMPLATE_ERR_INVALID, err, errlen, "no model directory or template file");
    struct chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) return fail(CHAT_TEMPLATE_ERR_NOMEM, err, errlen, "out of memory");
    cJSON *cfg = NULL;
    char *cfg_path = NULL, *jinja_path = NULL, *text = NULL;
    size_t len = 0;
    int rc = CHAT_TEMPLATE_OK;

    // 1. tokenizer_config.json: special tokens, and the template unless another is given.
    if (model_dir) {
        cfg_path = util_path_join(model_dir, "tokenizer_config.json");
        jinja_path = util_path_join(model_dir, "chat_template.jinja");
        if (!cfg_path || !jinja_path) {
            rc = fail(CHAT_TEMPLATE_ERR_NOMEM, err, errlen, "out of memory");
            goto done;
        }
        if (util_read_file(cfg_path, &text, &len) == 0) {
            cfg = cJSON_ParseWithLength(text, len);
            free(text);
            text = NULL;
            if (!cJSON_IsObject(cfg)) {
                rc = fail(CHAT_TEMPLATE_ERR_CONFIG, err, errlen, "%s: not a JSON object", cfg_path);
                goto done;
            }
            ct->bos = token_string(cfg, "bos_token");
            ct->eos = token_string(cfg, "eos_token");
        } else if (errno != ENOENT) {
            rc = fail(CHAT_TEMPLATE_ERR_IO, err, errlen, "%s: %s", cfg_path, strerror(errno));
            goto done;
        }
    }

    // 2. The template: the user's file, else chat_template.jinja, else the config's.
    if (template_file) {
        if (util_read_file(template_file, &text, &len) != 0) {
            rc = fail(CHAT_TEMPLATE_ERR_IO, err, errlen, "cannot read chat template %s: %s",
                      template_file, strerror(errno));
            goto done;
        }
        rc = parse(ct, text, len, template_file, &ct->main, err, errlen);
    } else if (util_read_file(jinja_path, &text, &len) == 0) {
        rc = parse(ct, text, len, jinja_path, &ct->main, err, errlen);
    } else if (errno != ENOENT) {
        rc = fail(CHAT_TEMPLATE_ERR_IO, err, errlen, "%s: %s", jinja_path, strerror(errno));
    } else if (cfg) {
        rc = load_from_config(ct, cfg, cfg_path, err, errlen);
    } else {
        rc = fail(CHAT_TEMPLATE_ERR_NONE, err, errlen,
                  "the model has no chat template (%s has neither chat_template.jinja nor "
                  "tokenizer_config.json); give one with --chat-template FILE",
                  model_dir);
    }

done:
    free(text);
    free(cfg_path);
    free(jinja_path);
    cJSON_Delete(cfg);
    if (rc != CHAT_TEMPLATE_OK) {
        chat_template_free(ct);
        return rc;
    }
    *out = ct;
    return CHAT_TEMPLATE_OK;
}

/* Sets key in vars to a reference to item (no copy), replacing an earlier value. */
static bool set_ref(cJSON *vars, const char *key, const cJSON *item) {
    cJSON_DeleteItemFromObjectCaseSensitive(vars, key);
    // cJSON's API is not const-correct; a reference never modifies or frees its target.
    return cJSON_AddItemReferenceToObject(vars, key, (cJSON *)item);
}

int chat_template_render(const struct chat_template *ct, const cJSON *messages,
                         bool add_generation_prompt, const char *bos_token, const char *eos_token,
                         const cJSON *extra, char **out, char *err, size_t errlen) {
    *out = NULL;
    if (!ct)
        return fail(CHAT_TEMPLATE_ERR_NONE, err, errlen,
                    "this model has no chat template; use /v1/completions or start the server "
                    "with --chat-template FILE");
    if (!cJSON_IsArray(messages))
        return fail(CHAT_TEMPLATE_ERR_INVALID, err, errlen, "messages must be a JSON array");
    if (extra && !cJSON_IsObject(extra))
        return fail(CHAT_TEMPLATE_ERR_INVALID, err, errlen,
                    "extra variables must be a JSON object");

    // Variables as transformers passes them: special tokens, then the caller's kwargs, then
    // messages/tools/documents/add_generation_prompt.
    cJSON *vars = cJSON_CreateObject();
    bool ok = vars != NULL;
    if (ok && bos_token) ok = cJSON_AddStringToObject(vars, "bos_token", bos_token) != NULL;
    if (ok && eos_token) ok = cJSON_AddStringToObject(vars, "eos_token", eos_token) != NULL;
    const cJSON *e;
    if (extra) cJSON_ArrayForEach(e, extra) {
            if (!ok) break;
            if (!e->string || !strcmp(e->string, "messages") ||
                !strcmp(e->string, "add_generation_prompt"))
                continue;
            ok = set_ref(vars, e->string, e);
        }
    if (ok && !cJSON_GetObjectItemCaseSensitive(vars, "tools"))
        ok = cJSON_AddNullToObject(vars, "tools") != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(vars, "documents"))
        ok = cJSON_AddNullToObject(vars, "documents") != NULL;
    if (ok) ok = set_ref(vars, "messages", messages);
    if (ok)
        ok = cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt) != NULL;
    if (!ok) {
        cJSON_Delete(vars);
        return fail(CHAT_TEMPLATE_ERR_NOMEM, err, errlen, "out of memory");
    }

    // transformers picks the "tool_use" template when tools are given and one exists.
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(vars, "tools");
    const struct jinja_template *t = ct->tool_use && !cJSON_IsNull(tools) ? ct->tool_use : ct->main;

    char jerr[4096];
    int rc = jinja_render(t, vars, NULL, out, NULL, jerr, sizeof jerr);
    cJSON_Delete(vars);
    if (rc != JINJA_OK) {
        if (rc == JINJA_ERR_RAISED) return fail(CHAT_TEMPLATE_ERR_RAISED, err, errlen, "%s", jerr);
        return fail(from_jinja(rc), err, errlen, "chat template: %s", jerr);
    }
    return CHAT_TEMPLATE_OK;
}
