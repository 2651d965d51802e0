/* openai_tools: response_format and tools on the request side, and the grammar of tool calls
 * (server/openai_tools.h). */
#include "server/openai_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...) openai_fail(err, 400, NULL, param, __VA_ARGS__)
#define NOMEM() openai_fail(err, 500, NULL, NULL, "out of memory")

/* The field, or NULL when absent or JSON null. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* ---- response_format, guided_json, structured_outputs ---- */

/* A schema given as an object (printed compactly: the grammar cache's key) or as JSON text. */
static int take_schema(struct openai_structured *st, const cJSON *s, const char *param, struct openai_error *err) {
    if (cJSON_IsString(s)) st->schema = strdup(s->valuestring);
    else if (cJSON_IsObject(s) || cJSON_IsBool(s)) st->schema = cJSON_PrintUnformatted(s);
    else return BAD(param, "'%s' must be a JSON Schema (an object)", param);
    if (!st->schema) return NOMEM();
    st->format = ENGINE_GRAMMAR_JSON_SCHEMA;
    st->param = param;
    return 0;
}

static int parse_response_format(const cJSON *rf, struct openai_structured *st, struct openai_error *err) {
    static const char *const P = "response_format";
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(type))
        return BAD(P, "'response_format' must be an object with a 'type' of \"text\", \"json_object\" or \"json_schema\"");
    const cJSON *it;
    cJSON_ArrayForEach(it, rf) {
        if (strcmp(it->string, "type") && strcmp(it->string, "json_schema"))
            return BAD(P, "Unrecognized field in 'response_format': %.40s", it->string);
    }
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        st->format = ENGINE_GRAMMAR_JSON_OBJECT;
        st->param = P;
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return BAD(P, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"%.40s\"", t);
    const cJSON *js = field(rf, "json_schema");
    if (!cJSON_IsObject(js)) return BAD(P, "'response_format.json_schema' (an object) is required with type json_schema");
    cJSON_ArrayForEach(it, js) {
        static const char *const known[] = {"name", "schema", "strict", "description"};
        bool ok = false;
        for (size_t k = 0; k < 4; k++) ok |= !strcmp(it->string, known[k]);
        if (!ok) return BAD(P, "Unrecognized field in 'response_format.json_schema': %.40s", it->string);
    }
    const cJSON *name = field(js, "name"), *strict = field(js, "strict"), *schema = field(js, "schema");
    if (name && (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 64))
        return BAD(P, "'response_format.json_schema.name' must be a string of 1 to 64 characters");
    if (strict && !cJSON_IsBool(strict)) return BAD(P, "'response_format.json_schema.strict' must be a boolean");
    if (!cJSON_IsObject(schema)) return BAD(P, "'response_format.json_schema.schema' (an object) is required");
    return take_schema(st, schema, P, err);
}

static int parse_structured_outputs(const cJSON *so, struct openai_structured *st, struct openai_error *err) {
    static const char *const P = "structured_outputs";
    if (!cJSON_IsObject(so)) return BAD(P, "'structured_outputs' must be an object");
    const cJSON *it;
    int n = 0;
    cJSON_ArrayForEach(it, so) {
        if (cJSON_IsNull(it)) continue;
        if (!strcmp(it->string, "json")) {
            if (take_schema(st, it, P, err)) return -1;
        } else if (!strcmp(it->string, "json_object")) {
            if (!cJSON_IsBool(it)) return BAD(P, "'structured_outputs.json_object' must be a boolean");
            if (cJSON_IsFalse(it)) continue;
            st->format = ENGINE_GRAMMAR_JSON_OBJECT;
            st->param = P;
        } else {
            return openai_fail(err, 400, "unsupported_parameter", P,
                               "'structured_outputs.%.40s' is not supported by this server (only json and json_object)",
                               it->string);
        }
        n++;
    }
    if (n > 1) return BAD(P, "'structured_outputs' takes one of json and json_object");
    return 0;
}

/* ---- tools ---- */

static bool valid_name(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') ||
              s[n] == '_' || s[n] == '-'))
            return false;
    return n >= 1 && n <= 64;
}

static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

static int parse_tools(const cJSON *tools, struct openai_structured *st, struct openai_error *err) {
    static const char *const P = "tools";
    if (!cJSON_IsArray(tools)) return BAD(P, "'tools' must be an array of tools");
    int n = cJSON_GetArraySize(tools);
    if (n > OPENAI_MAX_TOOLS) return BAD(P, "at most %d tools, got %d", OPENAI_MAX_TOOLS, n);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type)) return BAD(P, "tools[%d] must be an object with a 'type'", i);
        if (strcmp(type->valuestring, "function"))
            return openai_fail(err, 400, "unsupported_parameter", P, "tools[%d]: only tools of type \"function\" are supported",
                               i);
        if (!cJSON_IsObject(fn)) return BAD(P, "tools[%d].function (an object) is required", i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || !valid_name(name->valuestring))
            return BAD(P, "tools[%d].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
        const cJSON *desc = field(fn, "description"), *params = field(fn, "parameters"), *strict = field(fn, "strict");
        if (desc && !cJSON_IsString(desc)) return BAD(P, "tools[%d].function.description must be a string", i);
        if (params && !cJSON_IsObject(params)) return BAD(P, "tools[%d].function.parameters must be an object", i);
        if (strict && !cJSON_IsBool(strict)) return BAD(P, "tools[%d].function.strict must be a boolean", i);
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(tool_name(u), name->valuestring))
                return BAD(P, "tools[%d]: the function name '%s' is used twice", i, name->valuestring);
        i++;
    }
    if (n && !(st->tools = cJSON_Duplicate(tools, 1))) return NOMEM();
    return 0;
}

static int parse_tool_choice(const cJSON *root, struct openai_structured *st, struct openai_error *err) {
    static const char *const P = "tool_choice";
    const cJSON *tc = field(root, P);
    st->tool_mode = st->tools ? OPENAI_TOOLS_AUTO : OPENAI_TOOLS_OFF;
    if (!tc) return 0;
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) st->tool_mode = OPENAI_TOOLS_OFF;
        else if (!strcmp(s, "auto")) st->tool_mode = st->tools ? OPENAI_TOOLS_AUTO : OPENAI_TOOLS_OFF;
        else if (!strcmp(s, "required")) st->tool_mode = OPENAI_TOOLS_REQUIRED;
        else return BAD(P, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
    } else {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return BAD(P, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}");
        st->tool_mode = OPENAI_TOOLS_NAMED;
        if (!(st->tool_name = strdup(name->valuestring))) return NOMEM();
    }
    if (st->tool_mode >= OPENAI_TOOLS_REQUIRED && !st->tools)
        return BAD(P, "'tool_choice' \"required\" or a named function needs 'tools'");
    if (st->tool_mode == OPENAI_TOOLS_NAMED) {
        bool found = false;
        for (const cJSON *t = st->tools->child; t && !found; t = t->next) found = !strcmp(tool_name(t), st->tool_name);
        if (!found) return BAD(P, "'tool_choice' names the function '%.64s', which is not in 'tools'", st->tool_name);
    }
    return 0;
}

/* Whether response_format or structured_outputs asks for something ("text" and {} do not). */
static bool asks(const cJSON *f, bool is_response_format) {
    if (!f) return false;
    if (is_response_format) {
        const cJSON *t = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "type") : NULL;
        return !(cJSON_IsString(t) && !strcmp(t->valuestring, "text"));
    }
    return !cJSON_IsObject(f) || f->child;
}

int openai_structured_parse(const cJSON *root, struct openai_request *r, struct openai_error *err) {
    struct openai_structured *st = &r->st;
    st->parallel_tool_calls = true;
    const cJSON *rf = field(root, "response_format"), *gj = field(root, "guided_json");
    const cJSON *so = field(root, "structured_outputs");
    if (asks(rf, true) + (gj != NULL) + asks(so, false) > 1)
        return BAD(asks(rf, true) ? "response_format" : "guided_json",
                   "give only one of 'response_format', 'guided_json' and 'structured_outputs'");
    if (rf && parse_response_format(rf, st, err)) return -1;
    if (gj && take_schema(st, gj, "guided_json", err)) return -1;
    if (so && parse_structured_outputs(so, st, err)) return -1;
    if (r->kind == OPENAI_CHAT || r->kind == OPENAI_TOKENIZE) {
        const cJSON *tools = field(root, "tools");
        if (tools && parse_tools(tools, st, err)) return -1;
    }
    if (r->kind == OPENAI_CHAT) {
        if (parse_tool_choice(root, st, err)) return -1;
        const cJSON *ptc = field(root, "parallel_tool_calls");
        if (ptc && !cJSON_IsBool(ptc)) return BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        if (ptc) st->parallel_tool_calls = cJSON_IsTrue(ptc);
        if (st->format != ENGINE_GRAMMAR_NONE && st->tool_mode >= OPENAI_TOOLS_REQUIRED)
            return BAD("tool_choice", "'%s' cannot be combined with tool_choice \"required\" or a named function",
                       st->param);
    }
    r->sp.grammar = (struct engine_grammar){.kind = st->format, .schema = st->schema};
    return 0;
}

/* ---- messages for the template ---- */

int openai_tools_template_messages(cJSON *messages) {
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *c;
        cJSON_ArrayForEach(c, calls) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (!cJSON_IsString(args)) continue;
            cJSON *v = cJSON_Parse(args->valuestring);
            if (!v) continue;
            if (!cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", v)) {
                cJSON_Delete(v);
                return -1;
            }
        }
    }
    return 0;
}

/* ---- the grammar of tool calls ---- */

/* Points every local "$ref" ("#...") in s, a tool's parameters placed at JSON pointer `at` of
 * the call's schema, back into the parameters. */
static int rebase_refs(cJSON *s, const char *at) {
    cJSON *c;
    cJSON_ArrayForEach(c, s) {
        if (c->string && !strcmp(c->string, "$ref") && cJSON_IsString(c) && c->valuestring[0] == '#') {
            size_t n = strlen(at) + strlen(c->valuestring);
            char *ref = malloc(n + 1);
            if (!ref) return -1;
            snprintf(ref, n + 1, "%s%s", at, c->valuestring + 1);
            bool ok = cJSON_SetValuestring(c, ref) != NULL;
            free(ref);
            if (!ok) return -1;
        } else if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && rebase_refs(c, at)) {
            return -1;
        }
    }
    return 0;
}

/* {"type":"object","properties":{"name":{"const":NAME},KEY:PARAMS},"required":["name",KEY]}
 * for the tool at JSON pointer `at` of the whole schema. */
static cJSON *call_schema(const cJSON *tool, const char *key, const char *at) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *params = field(fn, "parameters");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_CreateObject(), *name = cJSON_CreateObject();
    cJSON *p = params ? cJSON_Duplicate(params, 1) : cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
    const char *req[2] = {"name", key};
    cJSON *required = cJSON_CreateStringArray(req, 2);
    char where[96];
    snprintf(where, sizeof where, "%s/properties/%s", at, key);
    if (!s || !props || !name || !p || !required || rebase_refs(p, where) ||
        !cJSON_AddStringToObject(name, "const", tool_name(tool))) {
        cJSON_Delete(s), cJSON_Delete(props), cJSON_Delete(name), cJSON_Delete(p), cJSON_Delete(required);
        return NULL;
    }
    cJSON_AddStringToObject(s, "type", "object");
    cJSON_AddItemToObject(props, "name", name);
    cJSON_AddItemToObject(props, key, p);
    cJSON_AddItemToObject(s, "properties", props);
    cJSON_AddItemToObject(s, "required", required);
    return s;
}

int openai_tools_grammar(struct openai_request *r, enum openai_tool_syntax syntax, struct openai_error *err) {
    struct openai_structured *st = &r->st;
    st->syntax = syntax;
    if (st->tool_mode != OPENAI_TOOLS_REQUIRED && st->tool_mode != OPENAI_TOOLS_NAMED) return 0;
    const char *key = syntax == OPENAI_TOOL_SYNTAX_LLAMA3 ? "parameters" : "arguments";
    /* one call: the named tool, the only tool, or anyOf the tools */
    int n = 0;
    for (const cJSON *t = st->tools->child; t; t = t->next)
        n += st->tool_mode == OPENAI_TOOLS_REQUIRED || !strcmp(tool_name(t), st->tool_name);
    cJSON *schema = n == 1 ? NULL : cJSON_CreateObject(), *any = schema ? cJSON_AddArrayToObject(schema, "anyOf") : NULL;
    if (n != 1 && !any) return cJSON_Delete(schema), NOMEM();
    int i = 0;
    for (const cJSON *t = st->tools->child; t; t = t->next) {
        if (st->tool_mode == OPENAI_TOOLS_NAMED && strcmp(tool_name(t), st->tool_name)) continue;
        char at[32];
        snprintf(at, sizeof at, n == 1 ? "#" : "#/anyOf/%d", i++);
        cJSON *one = call_schema(t, key, at);
        if (!one) return cJSON_Delete(schema), NOMEM();
        if (n == 1) schema = one;
        else cJSON_AddItemToArray(any, one);
    }
    free(st->tool_schema);
    st->tool_schema = cJSON_PrintUnformatted(schema);
    cJSON_Delete(schema);
    if (!st->tool_schema) return NOMEM();
    struct engine_grammar g = {.kind = ENGINE_GRAMMAR_JSON_SCHEMA, .schema = st->tool_schema, .wrapped = true};
    g.wrap.max_items = st->tool_mode == OPENAI_TOOLS_NAMED || !st->parallel_tool_calls ? 1 : 0;
    switch (syntax) {
    case OPENAI_TOOL_SYNTAX_HERMES:
        g.wrap.item_begin = "<tool_call>\n", g.wrap.item_end = "\n</tool_call>", g.wrap.sep = "\n";
        break;
    case OPENAI_TOOL_SYNTAX_LLAMA3: g.wrap.sep = "; "; break;
    default: g.wrap.begin = "[", g.wrap.end = "]", g.wrap.sep = ", "; break;
    }
    st->param = "tools";
    r->sp.grammar = g;
    return 0;
}

void openai_tools_grammar_error(const struct openai_request *r, const char *msg, char *out, size_t n) {
    const struct openai_structured *st = &r->st;
    const char *param = st->param ? st->param : "response_format";
    if (!st->tool_schema || strcmp(param, "tools")) {
        snprintf(out, n, "'%s': %s", param, msg);
        return;
    }
    /* "... (at #/anyOf/2/properties/arguments/...)" or "(at #/properties/arguments/...)": the tool,
     * then the place in its parameters */
    const char *at = strstr(msg, "(at #");
    int tool = -1;
    const char *rest = NULL;
    if (at) {
        const char *p = at + 5;
        if (!strncmp(p, "/anyOf/", 7)) tool = (int)strtol(p + 7, (char **)&p, 10);
        static const char *const keys[] = {"/properties/arguments", "/properties/parameters"};
        for (size_t k = 0; k < 2; k++)
            if (!strncmp(p, keys[k], strlen(keys[k]))) rest = p + strlen(keys[k]);
    }
    int i = 0;
    for (const cJSON *t = st->tools->child; t && tool < 0 && st->tool_mode == OPENAI_TOOLS_NAMED; t = t->next, i++)
        if (!strcmp(tool_name(t), st->tool_name)) tool = i;
    if (tool < 0 && cJSON_GetArraySize(st->tools) == 1) tool = 0;
    if (!at || !rest || tool < 0) {
        snprintf(out, n, "'tools': %s", msg);
        return;
    }
    snprintf(out, n, "'tools[%d].function.parameters': %.*s(at #%s", tool, (int)(at - msg), msg, rest);
}
