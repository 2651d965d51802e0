/* chat_template: a model's chat template, parsed once at load and rendered per request the
 * way transformers' apply_chat_template(messages, tokenize=False) does (engine/jinja.h).
 *
 * Where it comes from, as transformers loads it: chat_template.jinja beside the tokenizer if
 * present, else tokenizer_config.json's "chat_template" (a string, or a list of
 * {name, template}: "default", and "tool_use" when the request has tools), or a file the
 * user names (--chat-template FILE). A model without one (mistral-v0.1) is not an error at
 * load time for completions; chat requests get CHAT_TEMPLATE_ERR_NONE.
 *
 * Threads: load on one thread; chat_template_render may then run on any number of threads
 * at once (the parsed template is read-only). */
#ifndef DUO_CHAT_TEMPLATE_H
#define DUO_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

enum chat_template_status {
    CHAT_TEMPLATE_OK = 0,
    CHAT_TEMPLATE_ERR_NONE = -1,    // the model has no chat template
    CHAT_TEMPLATE_ERR_IO = -2,      // a file exists but cannot be read
    CHAT_TEMPLATE_ERR_CONFIG = -3,  // tokenizer_config.json is malformed
    CHAT_TEMPLATE_ERR_SYNTAX = -4,  // the template does not parse (the message names the line)
    CHAT_TEMPLATE_ERR_RENDER = -5,  // the template failed at run time (type error, ...)
    CHAT_TEMPLATE_ERR_RAISED = -6,  // the template called raise_exception(msg): a client error
                                    // (HTTP 400) whose message is exactly msg
    CHAT_TEMPLATE_ERR_LIMIT = -7,   // the render ran past its output/memory/depth/step limits
    CHAT_TEMPLATE_ERR_INVALID = -8, // bad arguments (messages not a JSON array, ...)
    CHAT_TEMPLATE_ERR_NOMEM = -9,
};

struct chat_template; // opaque, immutable once loaded

/* Loads the template of model_dir (chat_template.jinja, else tokenizer_config.json), or the
 * file template_file when it is not NULL (model_dir may then be NULL). bos/eos token strings
 * are read from model_dir's tokenizer_config.json when there is one. On error *out is NULL
 * and err[errlen] says why; CHAT_TEMPLATE_ERR_NONE when the model has no template. */
int chat_template_load(const char *model_dir, const char *template_file,
                       struct chat_template **out, char *err, size_t errlen);

/* A template given as text (len bytes), with optional bos/eos token strings (copied). */
int chat_template_from_string(const char *src, size_t len, const char *bos_token,
                              const char *eos_token, struct chat_template **out, char *err,
                              size_t errlen);

void chat_template_free(struct chat_template *ct);

/* The bos_token / eos_token strings of tokenizer_config.json (NULL when absent or null),
 * owned by ct. */
const char *chat_template_bos_token(const struct chat_template *ct);
const char *chat_template_eos_token(const struct chat_template *ct);

/* Renders messages (a JSON array of {role, content, ...}; borrowed) into a malloc'd
 * NUL-terminated prompt in *out (the caller frees it). ct NULL gives CHAT_TEMPLATE_ERR_NONE.
 * bos_token/eos_token NULL leave those variables undefined. extra (NULL or a JSON object,
 * borrowed) adds template variables such as tools, enable_thinking, date_string; as in
 * transformers, tools and documents are none unless extra sets them, and extra cannot
 * replace messages or add_generation_prompt. */
int chat_template_render(const struct chat_template *ct, const cJSON *messages,
                         bool add_generation_prompt, const char *bos_token,
                         const char *eos_token, const cJSON *extra, char **out, char *err,
                         size_t errlen);

/* How the template's model writes tool calls, read from the template's text (its tool_use
 * template included): "<tool_call>" tags (Hermes, Qwen2.5/3), "[TOOL_CALLS]" (Mistral),
 * "ipython" or "<|python_tag|>" (Llama 3.1/3.2 JSON calls); UNKNOWN when it says none. */
enum chat_template_tools {
    CHAT_TEMPLATE_TOOLS_UNKNOWN = 0,
    CHAT_TEMPLATE_TOOLS_HERMES,
    CHAT_TEMPLATE_TOOLS_MISTRAL,
    CHAT_TEMPLATE_TOOLS_LLAMA3,
};
enum chat_template_tools chat_template_tool_syntax(const struct chat_template *ct);

const char *chat_template_strerror(int status);

#endif
