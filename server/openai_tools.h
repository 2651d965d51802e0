/* openai_tools: structured output and tool calls in the OpenAI API.
 *
 * Requests: response_format ({"type": "text" | "json_object" | "json_schema", "json_schema":
 * {"name", "schema", "strict", "description"}}), vLLM's guided_json (a schema) and
 * structured_outputs ({"json": schema} or {"json_object": true}) on both endpoints; tools,
 * tool_choice ("none", "auto", "required", {"type": "function", "function": {"name"}}) and
 * parallel_tool_calls on chat. They become the engine's grammar (struct engine_grammar):
 * response_format's schema as given; tool_choice required or named: the calls in the model's
 * own syntax (from its chat template: <tool_call> tags, [TOOL_CALLS] lists, Llama's JSON), each
 * an object {"name": one of the functions, "arguments" (Llama: "parameters"): its parameters}.
 * With tool_choice auto (and required, named) the output is parsed (server/tool_parser.h) into
 * message.tool_calls, streamed as tool-call deltas.
 *
 * Pure functions on caller memory, like server/openai.c: any thread. */
#ifndef DUO_OPENAI_TOOLS_H
#define DUO_OPENAI_TOOLS_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "server/tool_parser.h"

struct openai_request;
struct openai_error;
struct openai_choice;
struct openai_resp_ctx;

#define OPENAI_MAX_TOOLS 128

enum openai_tool_mode {
    OPENAI_TOOLS_OFF = 0,  // no tools, or tool_choice "none": the output is text
    OPENAI_TOOLS_AUTO,     // the model may call tools; its text is parsed for calls
    OPENAI_TOOLS_REQUIRED, // at least one call, enforced by the grammar
    OPENAI_TOOLS_NAMED,    // one call of tool_name, enforced by the grammar
};

/* How a model writes tool calls (its chat template says which). */
enum openai_tool_syntax {
    OPENAI_TOOL_SYNTAX_JSON = 0, // a JSON array of {"name", "arguments"} (templates that say nothing)
    OPENAI_TOOL_SYNTAX_HERMES,   // <tool_call>\n{"name", "arguments"}\n</tool_call> per call (Qwen2.5/3)
    OPENAI_TOOL_SYNTAX_LLAMA3,   // {"name", "parameters"}, calls separated by "; " (Llama 3.1/3.2)
    OPENAI_TOOL_SYNTAX_MISTRAL,  // [{"name", "arguments"}, ...] after the [TOOL_CALLS] token
};

/* The request's structured-output and tool fields, parsed. Owned by struct openai_request. */
struct openai_structured {
    enum engine_grammar_kind format; // response_format & co.: NONE (text), JSON_OBJECT or JSON_SCHEMA
    char *schema;                    // JSON_SCHEMA: the schema's JSON text
    const char *param;               // the field it came from (static), for errors
    cJSON *tools;                    // the tools as given (a template variable), or NULL
    enum openai_tool_mode tool_mode;
    char *tool_name;                 // NAMED: the function
    bool parallel_tool_calls;        // default true
    char *tool_schema;               // REQUIRED, NAMED: the schema of one call (made by openai_tools_grammar)
    enum openai_tool_syntax syntax;
};

/* Parses and checks the fields from the request body root into r->st, and points r->sp.grammar
 * at response_format's grammar. Returns 0, or -1 with err set (400 naming the field). */
int openai_structured_parse(const cJSON *root, struct openai_request *r, struct openai_error *err);
void openai_structured_free(struct openai_structured *st);

/* Chat messages as the templates want them: a tool call's "arguments" given as a JSON string is
 * replaced by the parsed value (Llama's and Mistral's templates print it with tojson), as vLLM
 * does. Strings that are not JSON stay. Returns 0 or -1 (out of memory). */
int openai_tools_template_messages(cJSON *messages);

/* After the chat template is known: with tool_choice required or named, builds the grammar of
 * the calls in `syntax` and points r->sp.grammar at it. Returns 0 or -1 (out of memory). */
int openai_tools_grammar(struct openai_request *r, enum openai_tool_syntax syntax, struct openai_error *err);

/* The 400 message for a grammar that does not compile (the engine's message): names the field,
 * and for tools the tool and the place in its parameters. */
void openai_tools_grammar_error(const struct openai_request *r, const char *msg, char *out, size_t n);

/* Gives choice c a tool parser when r parses tool calls; seed makes its call ids. 0 or -1. */
int openai_tools_choice_init(struct openai_choice *c, const struct openai_request *r, uint64_t seed);
void openai_tools_choice_free(struct openai_choice *c);
/* Non-streamed: feeds an event's text to c's parser (openai_choice_add_event does). 0 or -1. */
int openai_tools_accumulate(struct openai_choice *c, const struct engine_event *ev);

/* Streaming: the SSE frames for one event of choice `index` (c->tools set): content and
 * tool-call deltas, and with a FINISH the finish chunk ("tool_calls" when there were calls).
 * Returns a malloc'd string (possibly empty), NULL when out of memory. */
char *openai_tools_event_sse(const struct openai_resp_ctx *ctx, int index, struct openai_choice *c,
                             const struct engine_event *ev);

/* Non-streamed: fills msg's "content" and "tool_calls" from c's whole text; returns the
 * finish_reason to report ("tool_calls" when there are calls and the choice stopped). NULL when
 * out of memory. */
const char *openai_tools_message(const struct openai_choice *c, cJSON *msg);

#endif
