/* openai_fields: which fields a request body may carry, per endpoint. Every key of the body (and
 * of its stream_options) is checked against one table before anything is parsed, so that no
 * field is silently ignored: a field this server parses passes, one that cannot change the
 * output (metadata, store, ...) passes and is ignored, one of the OpenAI or vLLM API that would
 * change the output and is not implemented is refused (400 unsupported_parameter) unless its
 * value asks for nothing, and any other is refused as OpenAI does ("Unrecognized request
 * argument supplied"). Pure: any thread. */
#ifndef DUO_OPENAI_FIELDS_H
#define DUO_OPENAI_FIELDS_H

#include <cjson/cJSON.h>

#include "server/openai_error.h"
#include "server/openai_request.h"

/* Checks the keys of the request body root (an object) for the endpoint `kind`: 0, or -1 with
 * err set (400 naming the field). */
int openai_fields_check(const cJSON *root, enum openai_kind kind, struct openai_error *err);

#endif
