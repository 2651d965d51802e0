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
 * message.tool_calls, streamed as tool-call deltas: server/openai_choice.h and
 * server/openai_response.h do that side. The fields parsed here are struct openai_structured
 * (server/openai_request.h).
 *
 * Pure functions on caller memory, like server/openai.c: any thread. */
#ifndef DUO_OPENAI_TOOLS_H
#define DUO_OPENAI_TOOLS_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/openai_error.h"
#include "server/openai_request.h"

/* Parses and checks the fields from the request body root into r->st, and points r->sp.grammar
 * at response_format's grammar. Returns 0, or -1 with err set (400 naming the field). What it
 * allocates is freed by openai_request_free. */
int openai_structured_parse(const cJSON *root, struct openai_request *r, struct openai_error *err);

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

#endif
