/* grammar: structured output. A JSON Schema (the subset OpenAI's strict mode allows) or "any JSON
 * object" compiled to a pushdown automaton over bytes, and the per-sequence state that follows a
 * generated text through it. engine/token_mask.h turns a state into a mask over a vocabulary.
 *
 * The automaton is a set of rules, each a small NFA over bytes whose edges may call another rule
 * (push a return node). A state is a set of stacks (the alternatives still alive: anyOf branches
 * that share a prefix, optional properties, whitespace), so any text the automaton accepts is one
 * the schema accepts, and every prefix it keeps alive can still be completed (dead branches are
 * trimmed when compiling).
 *
 * What the accepted text looks like (the generation policy; every accepted text is valid JSON that
 * validates against the schema, but not every valid instance is accepted):
 * - whitespace: GRAMMAR_WS_BOUNDED (default) allows, after '{' '[' ',' ':' and after a key or a
 *   value (so before ',' '}' ']' ':'), and before and after the whole value, nothing, one space, or
 *   one newline followed by at most max_indent spaces or tabs (json.dumps with or without indent,
 *   pretty printers); GRAMMAR_WS_NONE allows none (compact JSON). Bounded so a model cannot pad
 *   forever.
 * - objects with "properties": exactly the declared properties, in declared order, the required
 *   ones always, optional ones possibly skipped; no other keys (additionalProperties is treated as
 *   false, as OpenAI strict mode requires). Objects without "properties": any keys, values of
 *   additionalProperties' schema (or any JSON).
 * - numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]{1,2})? with at most 20 integer and 20
 *   fraction digits; integers have no fraction or exponent; a number with minimum/maximum has no
 *   exponent (the bounds are checked exactly on the decimal digits).
 * - strings: any JSON string (escapes included, \u surrogates only in valid pairs, UTF-8 checked);
 *   minLength/maxLength count characters (an escape is one, a surrogate pair one); enum and const
 *   values exactly as cJSON prints them (compact).
 *
 * Threads: a compiled grammar is immutable and may be shared; a grammar_state belongs to one
 * sequence and one thread at a time. */
#ifndef DUO_GRAMMAR_H
#define DUO_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

enum grammar_status {
    GRAMMAR_OK = 0,
    GRAMMAR_ERR_NOMEM = -1,
    GRAMMAR_ERR_JSON = -2,        // the schema text is not JSON
    GRAMMAR_ERR_UNSUPPORTED = -3, // a keyword or form outside the supported subset (message names it)
    GRAMMAR_ERR_INVALID = -4,     // a malformed or unsatisfiable schema (bad $ref, minimum > maximum, ...)
    GRAMMAR_ERR_LIMIT = -5,       // over a limit of grammar_options (size, nesting, ambiguity)
    GRAMMAR_REJECT = -6,          // advance: the bytes leave the grammar (state unchanged)
};

const char *grammar_strerror(int status);

enum grammar_ws { GRAMMAR_WS_BOUNDED = 0, GRAMMAR_WS_NONE = 1 };

/* Limits and policy; zero fields take the defaults in brackets. */
struct grammar_options {
    enum grammar_ws whitespace; // [GRAMMAR_WS_BOUNDED]
    int max_indent;             // spaces/tabs after a newline [20]
    size_t max_nodes;           // automaton size: nodes, and edges count 1/4 each [262144]
    int max_schema_depth;       // nesting of the schema document [64]
    int max_stack;              // rule frames on a stack at run time: how deep output may nest [512]
    int max_alternatives;       // stacks alive at once in one state [1024]
};

struct grammar; // opaque, immutable once compiled

/* Compiles a JSON Schema given as text (len bytes) or as a parsed cJSON (borrowed). opt may be
 * NULL. On error returns a negative status and writes a one-line message (naming the unsupported
 * keyword, the bad $ref, the limit) into err[errlen] (err may be NULL). Work and memory are
 * bounded by opt's limits. */
int grammar_compile_schema(struct grammar **out, const char *schema, size_t len, const struct grammar_options *opt,
                           char *err, size_t errlen);
int grammar_compile_schema_json(struct grammar **out, const struct cJSON *schema, const struct grammar_options *opt,
                                char *err, size_t errlen);
/* Any JSON object (response_format json_object). */
int grammar_compile_json_object(struct grammar **out, const struct grammar_options *opt, char *err, size_t errlen);

/* Values of a schema between literal texts (tool calls in a model's own syntax, such as
 * <tool_call>\n{...}\n</tool_call>): the text is
 *   begin item (sep item)* end   with min_items..max_items items,
 * each item being item_begin value item_end, with the whitespace policy's whitespace on both
 * sides of the value. NULL strings are empty. */
struct grammar_wrap {
    const char *begin, *end;
    const char *item_begin, *item_end;
    const char *sep;
    int min_items; // below 1: 1
    int max_items; // 0: no limit
};
/* The schema text (len bytes; NULL: any JSON object) wrapped as wrap says (NULL: not wrapped, as
 * grammar_compile_schema). */
int grammar_compile_wrapped(struct grammar **out, const char *schema, size_t len, const struct grammar_wrap *wrap,
                            const struct grammar_options *opt, char *err, size_t errlen);
void grammar_free(struct grammar *g);

/* Nodes and bytes the compiled automaton holds. */
size_t grammar_num_nodes(const struct grammar *g);
size_t grammar_memory(const struct grammar *g);

/* A position in the text: the empty text at first. */
struct grammar_state;

/* Starts a state at the beginning of the text; g is borrowed and must outlive it. */
int grammar_state_init(struct grammar_state **out, const struct grammar *g);
int grammar_state_clone(struct grammar_state **out, const struct grammar_state *s);
void grammar_state_free(struct grammar_state *s);
/* Consumes bytes[0..n): 0 when the text so far is still a prefix of an accepted text;
 * GRAMMAR_REJECT when not, GRAMMAR_ERR_LIMIT (max_stack, max_alternatives) or GRAMMAR_ERR_NOMEM;
 * on any error s is unchanged. */
int grammar_state_advance(struct grammar_state *s, const void *bytes, size_t n);
/* Whether grammar_state_advance would return 0; s is unchanged either way. */
bool grammar_state_try(struct grammar_state *s, const void *bytes, size_t n);
/* The text so far is a complete accepted text (EOS may follow). */
bool grammar_state_accepting(const struct grammar_state *s);
/* Some byte may still follow (false and accepting: the text is finished, only EOS may follow). */
bool grammar_state_can_continue(const struct grammar_state *s);
const struct grammar *grammar_state_grammar(const struct grammar_state *s);

#endif
