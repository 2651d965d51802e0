/* serve: the `duoserve serve` subcommand. Parses flags (and --config FILE, a JSON object
 * with the same keys), checks what can be checked at once (the model directory, the files the
 * flags name, the GPU --device cuda asks for), starts the HTTP server (answering 503 while the
 * model loads and warms up), creates the engine, its log lines routed to the daemon's logger,
 * serves until SIGTERM/SIGINT, then drains: new requests get 503, running ones
 * finish (up to --shutdown-timeout, then they are cancelled), and it returns 0.
 * Main thread only; blocks SIGTERM/SIGINT in every thread it starts (the main thread takes
 * them with sigtimedwait). */
#ifndef DUO_SERVE_H
#define DUO_SERVE_H

#include <stdio.h>

/* argv holds the options after "serve" (argv[0] is the first option). Returns the process
 * exit status: 0 after a clean drain, 1 runtime error (model failed to load, port in use),
 * 2 usage error. */
int serve_main(int argc, char **argv);

/* `duoserve serve --help` (also `duoserve help serve`). */
void serve_usage(FILE *f);

#endif
