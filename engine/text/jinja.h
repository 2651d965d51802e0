/* jinja: a small Jinja2 interpreter, enough for Hugging Face chat templates.
 *
 * It follows the environment transformers uses for apply_chat_template:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
 * extension, HF's tojson (json.dumps, ensure_ascii=False), raise_exception() and
 * strftime_now(). Values behave like Python's (str, int, float, list, dict, None), undefined
 * names like Jinja's default Undefined. Lists and dicts are immutable, as in the sandbox.
 *
 * Threads: jinja_parse once, then jinja_render from any number of threads at once on the
 * same template; a parsed template is never written after jinja_parse returns and the
 * interpreter has no global mutable state.
 *
 * Untrusted input: template variables come from users and templates from model files, so a
 * render is bounded (nesting depth, output bytes, memory, executed steps; see
 * struct jinja_limits) and fails with a message instead of running away. */
#ifndef DUO_JINJA_H
#define DUO_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

enum jinja_status {
    JINJA_OK = 0,
    JINJA_ERR_NOMEM = -1,   // malloc failed
    JINJA_ERR_SYNTAX = -2,  // the template does not parse; the message names the line
    JINJA_ERR_RENDER = -3,  // a runtime error (undefined attribute, type error, ...)
    JINJA_ERR_RAISED = -4,  // the template called raise_exception(msg); the message is msg
    JINJA_ERR_LIMIT = -5,   // a limit of struct jinja_limits was hit
    JINJA_ERR_INVALID = -6, // bad arguments (vars not a JSON object, ...)
};

struct jinja_options {
    bool trim_blocks;           // drop the first newline after a block or comment tag
    bool lstrip_blocks;         // drop spaces/tabs before a block or comment tag at line start
    bool keep_trailing_newline; // keep a single newline at the end of the template source
};

/* The environment of HF apply_chat_template: trim_blocks, lstrip_blocks, no trailing newline. */
extern const struct jinja_options jinja_options_hf;

struct jinja_limits {
    size_t max_output; // bytes of rendered text (also of each macro call or captured block)
    size_t max_memory; // bytes the interpreter may allocate during one render
    int max_depth;     // nesting of expression evaluation, blocks and macro calls together
    uint64_t max_steps; // statements executed + loop iterations + macro calls
};

/* 16 MiB output, 256 MiB memory, depth 500, 10M steps. */
extern const struct jinja_limits jinja_limits_default;

struct jinja_template; // opaque; immutable once parsed

/* Parses src[len] (need not be NUL-terminated). opt NULL means jinja_options_hf. On error
 * returns JINJA_ERR_SYNTAX (or NOMEM) and writes "line N: ..." to err[errlen]. */
int jinja_parse(const char *src, size_t len, const struct jinja_options *opt,
                struct jinja_template **out, char *err, size_t errlen);

void jinja_free(struct jinja_template *t);

/* Renders t with the variables of the JSON object vars (NULL: none; borrowed). JSON numbers
 * that are integral and within +-2^53 become Python ints, others floats. lim NULL means
 * jinja_limits_default. On success *out is a malloc'd NUL-terminated string (the caller
 * frees it) of *out_len bytes (out_len may be NULL). On error *out is NULL, the status is
 * negative and err[errlen] holds the message: for JINJA_ERR_RAISED exactly the text the
 * template passed to raise_exception, otherwise "line N: ...". */
int jinja_render(const struct jinja_template *t, const cJSON *vars,
                 const struct jinja_limits *lim, char **out, size_t *out_len, char *err,
                 size_t errlen);

#endif
