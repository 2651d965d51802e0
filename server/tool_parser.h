/* tool_parser: finds tool calls in the text a model writes, fed in pieces as it is generated,
 * and says what the text turned out to hold as a sequence of deltas: content, a call's start
 * (its id and function name), more of a call's arguments. The deltas depend only on the text,
 * never on how it was cut into pieces, so a streamed response (deltas as they come) and a
 * non-streamed one (the whole text at once) agree.
 *
 * Calls are recognised in the syntaxes of the common tool-calling templates, whichever the model:
 *   <tool_call>{"name": ..., "arguments": {...}}</tool_call>      Hermes, Qwen2.5/3 (repeated)
 *   [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]        Mistral
 *   <|python_tag|>{"name": ..., "parameters": {...}}             Llama 3.1
 *   {"name": ..., "parameters"|"arguments": {...}} (; {...})*     Llama 3.x JSON, at the text's start
 *   [{"name": ..., "arguments": {...}}, ...]                     a JSON array, at the text's start
 * with whitespace between the pieces. A call's arguments are the model's own text of the value
 * (streamed as it is written when "name" comes first and the arguments are an object; else given
 * whole once the call's object is complete). Text that only looks like a call (an object without
 * a name, a marker followed by something else) is content. Content is held back while it may be
 * the start of a marker; whitespace right before a call, and trailing whitespace once there are
 * calls, is not content.
 *
 * Pure: no locks, no globals; one parser per choice, used by one thread at a time. */
#ifndef DUO_TOOL_PARSER_H
#define DUO_TOOL_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tool_delta_kind {
    TOOL_DELTA_CONTENT, // text: more content
    TOOL_DELTA_CALL,    // a call starts: index, id, text = the function name
    TOOL_DELTA_ARGS,    // text: more of call `index`'s arguments
};

struct tool_delta {
    enum tool_delta_kind kind;
    int index;        // CALL, ARGS: which call (0, 1, ...)
    const char *id;   // CALL: "call_" and 24 letters and digits, or 9 letters and digits (short_ids)
    const char *text; // not NUL-terminated
    size_t len;
};

typedef int (*tool_delta_fn)(void *ud, const struct tool_delta *d); // 0, or -1 to stop (memory)

struct tool_parser;

/* parallel: false keeps only the first call (later ones are dropped, text and all). short_ids:
 * ids of 9 letters and digits (Mistral's templates check that). seed: the ids' randomness. */
struct tool_parser *tool_parser_new(bool parallel, bool short_ids, uint64_t seed);
void tool_parser_free(struct tool_parser *p);
/* Calls must name one of the names allowed so far (none allowed: any non-empty name); an object
 * naming another function is content. Returns 0 or -1 (out of memory). */
int tool_parser_allow_name(struct tool_parser *p, const char *name);

/* Appends text[0..len) (final: the text is complete) and calls out for each newly decided delta,
 * in order. Returns 0, or -1 when out of memory or out returned -1. */
int tool_parser_feed(struct tool_parser *p, const char *text, size_t len, bool final, tool_delta_fn out, void *ud);

/* Calls started so far (after parallel's cut). */
int tool_parser_calls(const struct tool_parser *p);

#endif
