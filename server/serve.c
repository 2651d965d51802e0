/* serve: flags, configuration file, start-up, signal loop and drain. */
#include "server/serve.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/elog.h"
#include "engine/engine.h"
#include "engine/text/chat_template.h"
#include "engine/model_config.h"
#include "engine/tp.h"
#include "server/http.h"
#include "server/log.h"
#include "server/opt.h"

struct serve_options {
    const char *model;
    const char *host;
    int port;
    const char *served_model_name;
    const char *api_key;
    double timeout;
    double shutdown_timeout;
    size_t max_request_bytes;
    size_t max_buffered_bytes;
    int max_request_tokens;
    int max_request_logprobs;
    int max_connections;
    int http_threads;
    int http_timeout;
    double header_timeout;
    double body_timeout;
    double sse_keepalive;
    const char *log_format;
    const char *allowed_origins; // CORS: JSON lists, checked by http_check_config
    const char *allowed_methods;
    const char *allowed_headers;
    bool allow_credentials;
    const char *config;
    const char *chat_template; // a Jinja file overriding the model's template, or NULL
    struct engine_config ec; // the engine's flags (opt_engine) and the few below
};

#define O(field) offsetof(struct serve_options, field)
static const struct opt opts[] = {
    {"model", "-m", OPT_STR, O(model), 0, 0, "DIR", "Hugging Face model directory (default: the built-in demo model)"},
    {"host", NULL, OPT_STR, O(host), 0, 0, "ADDR", "address to listen on (default 127.0.0.1)"},
    {"port", NULL, OPT_INT, O(port), 0, 65535, "N", "port (default 8000; 0 = any free port, logged)"},
    {"served-model-name", NULL, OPT_STR, O(served_model_name), 0, 0, "NAME", "model id in the API (default: the -m argument)"},
    {"api-key", NULL, OPT_STR, O(api_key), 0, 0, "KEY", "require Authorization: Bearer KEY (also $DUOSERVE_API_KEY)"},
    {"max-queue", NULL, OPT_INT, O(ec.max_queue), 1, 1 << 24, "N", "requests waiting for a free seat before 429 (default 1024)"},
    {"timeout", NULL, OPT_DOUBLE, O(timeout), 0, 1e9, "S", "cancel a request running longer (finish_reason \"abort\"; 0 = never; default 600)"},
    {"shutdown-timeout", NULL, OPT_DOUBLE, O(shutdown_timeout), 0, 1e9, "S", "on SIGTERM wait this long for running requests (default 30)"},
    {"max-request-bytes", NULL, OPT_BYTES, O(max_request_bytes), 1024, 1099511627776.0, "BYTES", "larger request bodies get 413 (default 8MiB)"},
    {"max-buffered-bytes", NULL, OPT_BYTES, O(max_buffered_bytes), 0, 1099511627776.0, "BYTES",
     "request bodies held by all requests together; past it 503 (default 256MiB; 0 = no limit)"},
    {"max-request-tokens", NULL, OPT_INT, O(max_request_tokens), 0, 2147483647, "N",
     "tokens one request may ask to generate, prompts x n x max_tokens; past it 400 (default 262144; 0 = no limit)"},
    {"max-request-logprobs", NULL, OPT_INT, O(max_request_logprobs), 0, 2147483647, "N",
     "logprob entries one request may ask for, prompts x n x max_tokens x top logprobs; past it 400 (default 1048576; 0 = no limit)"},
    {"max-connections", NULL, OPT_INT, O(max_connections), 1, 1 << 20, "N", "open HTTP connections; one more is answered 503 (default 1024)"},
    {"http-threads", NULL, OPT_INT, O(http_threads), 1, 256, "N", "threads that parse and tokenize requests (default 4)"},
    {"http-timeout", NULL, OPT_INT, O(http_timeout), 1, 86400, "S", "close a connection idle this long between requests (default 60)"},
    {"header-timeout", NULL, OPT_DOUBLE, O(header_timeout), 0.1, 86400, "S",
     "a request's headers must arrive within this of its first byte; else 408 (default 10)"},
    {"body-timeout", NULL, OPT_DOUBLE, O(body_timeout), 0.1, 86400, "S",
     "a request's body must arrive within this of its headers; else 408 (default 60)"},
    {"sse-keepalive", NULL, OPT_DOUBLE, O(sse_keepalive), 0.05, 3600, "S", "comment line on a stream idle this long (default 15)"},
    {"log-format", NULL, OPT_CHOICE, O(log_format), 0, 0, "text|json", "log lines as text (default) or JSON objects, one a line"},
    {"chat-template", NULL, OPT_STR, O(chat_template), 0, 0, "FILE", "Jinja chat template overriding the model's"},
    {"allowed-origins", NULL, OPT_STR, O(allowed_origins), 0, 0, "JSON",
     "CORS: origins browsers may call from, e.g. '[\"https://app.example\"]' (default '[\"*\"]': any; '[]': none)"},
    {"allowed-methods", NULL, OPT_STR, O(allowed_methods), 0, 0, "JSON", "CORS: methods allowed in a preflight (default '[\"*\"]')"},
    {"allowed-headers", NULL, OPT_STR, O(allowed_headers), 0, 0, "JSON",
     "CORS: request headers allowed in a preflight (default '[\"*\"]')"},
    {"allow-credentials", NULL, OPT_BOOL, O(allow_credentials), 0, 0, "[=BOOL]",
     "CORS: allow credentials (cookies, HTTP auth) from those origins (bare flag: true; =true|false; default false)"},
    {"config", NULL, OPT_STR, O(config), 0, 0, "FILE", "JSON object with any of these keys (flags override it; default $DUOSERVE_CONFIG)"},
};
#undef O
#define N_OPTS (sizeof opts / sizeof opts[0])

void serve_usage(FILE *f) {
    fprintf(f, "usage: duoserve serve [options]\n\nserver options:\n");
    opt_usage(f, opts, N_OPTS);
    fprintf(f, "\nengine options (serve and generate):\n");
    opt_usage(f, opt_engine, opt_engine_n);
}

/* A usage error: a log line under --log-format json (every line of the daemon is JSON then),
 * else the message and a pointer to the help. Returns the exit status, 2. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_is_json()) log_msg("error", "%s (see duoserve serve --help)", msg);
    else fprintf(stderr, "duoserve serve: %s\n(see duoserve serve --help)\n", msg);
    return 2;
}

/* The entry for a flag name, in the server's table or the engine's; *base: the struct its
 * offset is in. */
static const struct opt *find_flag(struct serve_options *o, const char *name, void **base) {
    const struct opt *op = opt_find(opts, N_OPTS, name);
    *base = o;
    if (!op && (op = opt_find(opt_engine, opt_engine_n, name))) *base = &o->ec;
    return op;
}

static int set_flag(void *base, const struct opt *op, const char *v) {
    char err[512];
    return opt_set(base, op, v, err, sizeof err) ? usage_error("%s", err) : 0;
}

static int parse_args(struct serve_options *o, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 1;
        }
        char name[64];
        const char *val = opt_split(a, name, sizeof name);
        const struct opt *op = NULL;
        void *base = o;
        if (name[0]) op = find_flag(o, name, &base);
        if (!op && (op = opt_find_alias(opts, N_OPTS, a))) base = o;
        if (!op && (op = opt_find_alias(opt_engine, opt_engine_n, a))) base = &o->ec;
        if (!op) return usage_error("unknown option \"%s\"", a);
        if (!val && op->type != OPT_BOOL && op->type != OPT_BOOL_NOT) {
            if (i + 1 >= argc) return usage_error("%s needs a value", a);
            val = argv[++i];
        }
        int rc = set_flag(base, op, val);
        if (rc) return rc;
    }
    return 0;
}

/* Applies --config FILE: every key is a flag name (dashes or underscores), values strings or
 * numbers, a boolean for allow-credentials, a JSON list (or a string holding one) for the
 * allowed-* keys. Strings stay alive in *doc (freed by the caller). */
static int apply_config(struct serve_options *o, const char *path, cJSON **doc) {
    FILE *f = fopen(path, "rb");
    if (!f) return usage_error("--config %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            char *t = realloc(buf, cap = cap * 2 + 4096);
            if (!t) break;
            buf = t;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    *doc = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    free(buf);
    if (!cJSON_IsObject(*doc)) return usage_error("--config %s: not a JSON object", path);
    // Strings made here (JSON lists given as arrays) live in *doc too, under a key the loop skips.
    cJSON *lists = cJSON_AddArrayToObject(*doc, "");
    if (!lists) return usage_error("--config %s: out of memory", path);
    const cJSON *it;
    cJSON_ArrayForEach(it, *doc) {
        if (it == lists) continue;
        void *base;
        const struct opt *op = find_flag(o, it->string, &base);
        if (!op || !strcmp(op->name, "config")) return usage_error("--config %s: unknown key \"%s\"", path, it->string);
        char num[64];
        const char *v;
        if (cJSON_IsString(it)) v = it->valuestring;
        else if (cJSON_IsNumber(it)) snprintf(num, sizeof num, "%.17g", it->valuedouble), v = num;
        else if (cJSON_IsBool(it) && (op->type == OPT_BOOL || op->type == OPT_BOOL_NOT))
            v = cJSON_IsTrue(it) ? "true" : "false";
        else if (cJSON_IsArray(it) && op->type == OPT_STR && !strncmp(op->name, "allowed-", 8)) {
            char *list = cJSON_PrintUnformatted(it); // the JSON list as the flag takes it
            cJSON *copy = list ? cJSON_CreateString(list) : NULL;
            free(list);
            if (!copy || !cJSON_AddItemToArray(lists, copy)) return usage_error("--config %s: out of memory", path);
            v = copy->valuestring;
        } else if (cJSON_IsNull(it)) continue;
        else
            return usage_error("--config %s: \"%s\" must be a string or a number (a boolean for allow-credentials, "
                               "a list for allowed-*)", path, it->string);
        if ((op->type == OPT_STR || op->type == OPT_CHOICE) && !cJSON_IsString(it) && !cJSON_IsArray(it))
            return usage_error("--config %s: \"%s\" must be a string", path, it->string);
        int rc = set_flag(base, op, v);
        if (rc) return rc;
    }
    return 0;
}

/* ---- loading in the background, so /health answers 503 and signals work meanwhile ---- */

struct loader {
    struct engine_config cfg;
    const char *template_file;    // --chat-template, or NULL: the model's own
    struct engine *engine;
    struct chat_template *tmpl;   // NULL when the model has none (chat requests then get a 400)
    int rc;
    char err[1024];
    volatile int done; // written once by the loader thread, read under `mu`
    pthread_mutex_t mu;
};

static void *load_engine(void *arg) {
    struct loader *l = arg;
    int rc = engine_create(&l->engine, &l->cfg, l->err, sizeof l->err);
    if (rc == 0) { /* the chat template: the user's file, else the model's (resolved: the demo's too) */
        int trc = chat_template_load(engine_model_dir(l->engine), l->template_file, &l->tmpl, l->err, sizeof l->err);
        if (trc != 0 && trc != CHAT_TEMPLATE_ERR_NONE) {
            engine_destroy(l->engine);
            l->engine = NULL;
            rc = -1;
        }
    }
    pthread_mutex_lock(&l->mu);
    l->rc = rc;
    l->done = 1;
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static bool loader_done(struct loader *l) {
    pthread_mutex_lock(&l->mu);
    bool d = l->done;
    pthread_mutex_unlock(&l->mu);
    return d;
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits up to ms for SIGTERM/SIGINT; returns the signal or 0. */
static int wait_signal(const sigset_t *set, long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* Waits for one of the signals of set to be pending and returns it, without taking it (a
 * signalfd is only read to take it), or for the engine to fail for good (returns 0). */
static int wait_pending_signal(const sigset_t *set, struct engine *e) {
    int fd = signalfd(-1, set, SFD_CLOEXEC);
    for (;;) {
        if (fd >= 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            poll(&p, 1, 200);
        } else {
            usleep(20000);
        }
        sigset_t pend;
        int sig = 0;
        if (!sigpending(&pend))
            for (int s = 1; s < NSIG && !sig; s++)
                if (sigismember(set, s) == 1 && sigismember(&pend, s) == 1) sig = s;
        if (sig || engine_failed(e)) {
            if (fd >= 0) close(fd);
            return sig;
        }
    }
}

/* --log-format json as early as the arguments say so, so that even a usage error is JSON. */
static void early_log_format(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if ((!strcmp(argv[i], "--log-format") && i + 1 < argc && !strcmp(argv[i + 1], "json")) ||
            !strcmp(argv[i], "--log-format=json"))
            log_set_json(true);
}

/* Flags: --config (else $DUOSERVE_CONFIG) first, so flags given on the command line override
 * it. Returns 0, or the exit status: 0 after --help, 2 on a usage error. */
static int parse_all(struct serve_options *o, int argc, char **argv, cJSON **config_doc, bool *help) {
    const char *config_path = getenv("DUOSERVE_CONFIG");
    if (config_path && !config_path[0]) config_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config_path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) config_path = argv[i] + 9;
    }
    int rc = config_path ? apply_config(o, config_path, config_doc) : 0;
    if (!rc) rc = parse_args(o, argc, argv);
    *help = rc == 1;
    return rc == 1 ? 0 : rc;
}

/* What would only fail after minutes of loading (or after the port is taken) fails now: the
 * CORS lists (a usage error, 2), the model directory, the files the flags name, the GPU
 * --device cuda insists on (1). */
static int check_inputs(const struct serve_options *o, const struct http_config *hc) {
    char err[512];
    if (http_check_config(hc, err, sizeof err)) return usage_error("%s", err);
    if (o->model && model_config_check_dir(o->model, err, sizeof err) != 0) {
        log_msg("error", "%s", err);
        return 1;
    }
    const char *files[][2] = {{"--duo-pattern", o->ec.duo_pattern}, {"--chat-template", o->chat_template}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (files[i][1] && access(files[i][1], R_OK) != 0) {
            log_msg("error", "%s %s: %s", files[i][0], files[i][1], strerror(errno));
            return 1;
        }
    int probe = !strcmp(o->ec.device, "cuda") ? backend_cuda_probe(0, err, sizeof err) : BACKEND_CUDA_OK;
    if (probe != BACKEND_CUDA_OK) {
        log_msg("error", "--device cuda: %s%s", err,
                probe == BACKEND_CUDA_BAD_SETTING ? "" : "; --device auto or cpu runs on the CPU");
        return 1;
    }
    /* tensor parallelism: the model's shapes and the GPUs it needs */
    int tp = o->ec.tensor_parallel_size;
    struct model_config mc;
    if (tp > 1 && o->model && (model_config_load(&mc, o->model, err, sizeof err) || tp_check(&mc, tp, err, sizeof err))) {
        log_msg("error", "%s", err);
        return 1;
    }
    bool gpu = !strcmp(o->ec.device, "cuda") ||
               (!strcmp(o->ec.device, "auto") && tp > 1 && backend_cuda_probe(0, err, sizeof err) == BACKEND_CUDA_OK);
    if (tp > 1 && gpu && backend_cuda_device_count() < tp) {
        log_msg("error", "--tensor-parallel-size %d needs %d GPUs, and %d %s visible (CUDA_VISIBLE_DEVICES selects them)",
                tp, tp, backend_cuda_device_count(), backend_cuda_device_count() == 1 ? "is" : "are");
        return 1;
    }
    return 0;
}

/* The HTTP server's settings; backend (n bytes, outliving the server) receives the engine
 * settings that change outputs, for system_fingerprint; label (nl bytes, idem) the model_name
 * label of /metrics: /metrics is open, so without --served-model-name it names the model by
 * its directory's last component, never by its path. */
static struct http_config http_config_of(const struct serve_options *o, const char *name, char *backend, size_t n,
                                         char *label, size_t nl) {
    int tp = o->ec.tensor_parallel_size;
    bool dummy = o->ec.load_format && !strcmp(o->ec.load_format, "dummy");
    /* settings that change outputs; the defaults add nothing, so fingerprints stay as they were */
    char tps[32] = "", kvd[48] = "";
    if (tp > 1) snprintf(tps, sizeof tps, " tp=%d", tp);
    const char *kd = o->ec.kv_cache_dtype;
    if (kd && strcmp(kd, "auto")) snprintf(kvd, sizeof kvd, " kv_cache_dtype=%s", kd);
    snprintf(backend, n, "device=%s gemm=%s%s%s%s", o->ec.device, o->ec.gemm, tps, kvd, dummy ? " load_format=dummy" : "");
    snprintf(label, nl, "%s", name);
    if (!o->served_model_name && o->model) {
        size_t len = strlen(o->model);
        while (len > 1 && o->model[len - 1] == '/') len--;
        const char *base = o->model + len;
        while (base > o->model && base[-1] != '/') base--;
        snprintf(label, nl, "%.*s", (int)(o->model + len - base), base);
    }
    return (struct http_config){
        .host = o->host, .port = o->port, .api_key = o->api_key, .model_name = name, .metrics_name = label,
        .model_root = o->model ? o->model : name, .max_request_bytes = o->max_request_bytes,
        .max_buffered_bytes = o->max_buffered_bytes, .max_request_tokens = o->max_request_tokens,
        .max_request_logprobs = o->max_request_logprobs, .header_timeout_s = o->header_timeout,
        .body_timeout_s = o->body_timeout,
        .max_connections = o->max_connections, .threads = o->http_threads, .conn_timeout_s = o->http_timeout,
        .request_timeout_s = o->timeout, .keepalive_s = o->sse_keepalive, .max_n = o->ec.max_num_seqs,
        .allowed_origins = o->allowed_origins, .allowed_methods = o->allowed_methods,
        .allowed_headers = o->allowed_headers, .allow_credentials = o->allow_credentials, .backend = backend,
    };
}

/* Loads the engine (cfg with model_dir) on a thread of its own while this one waits for
 * SIGTERM/SIGINT, which end the process at once: nothing is in flight yet. NULL (logged) when
 * the engine fails to start. */
static struct engine *load_in_background(const struct engine_config *cfg, const char *model_dir,
                                         const char *template_file, struct chat_template **tmpl, const sigset_t *sigs) {
    struct loader ld = {.cfg = *cfg, .template_file = template_file};
    ld.cfg.model_dir = model_dir;
    pthread_mutex_init(&ld.mu, NULL);
    pthread_t loader_thread;
    if (pthread_create(&loader_thread, NULL, load_engine, &ld)) {
        log_msg("error", "cannot start the loader thread");
        pthread_mutex_destroy(&ld.mu);
        return NULL;
    }
    while (!loader_done(&ld)) {
        int sig = wait_signal(sigs, 100);
        if (sig) {
            // engine_create cannot be interrupted; nothing is in flight, so leave now.
            log_msg("info", "%s while loading the model: exiting", strsignal(sig));
            fflush(stderr);
            _exit(0);
        }
    }
    pthread_join(loader_thread, NULL);
    pthread_mutex_destroy(&ld.mu);
    if (ld.rc) {
        log_msg("error", "%s", ld.err[0] ? ld.err : "the engine failed to start");
        return NULL;
    }
    *tmpl = ld.tmpl;
    return ld.engine;
}

/* Serves until SIGTERM/SIGINT or the engine's failure, then drains: no new requests, running
 * ones finish within shutdown_timeout seconds (a second signal stops the wait), what is left
 * is cancelled. The state changes before the signal is taken, so that no moment sees neither.
 * After an engine failure the requests have all ended with an error already. Returns true
 * when the engine failed. */
static bool serve_until_signal(struct http_server *srv, struct engine *e, const sigset_t *sigs,
                               double shutdown_timeout) {
    int sig = wait_pending_signal(sigs, e);
    bool failed = !sig;
    http_set_state(srv, HTTP_STATE_DRAINING);
    engine_drain(e);
    if (sig) sigtimedwait(sigs, NULL, &(struct timespec){0});
    if (failed) log_msg("error", "the engine failed: stopping (%d request(s) still open)", http_num_active(srv));
    else log_msg("info", "%s: draining %d request(s) (up to %.0fs)", strsignal(sig), http_num_active(srv), shutdown_timeout);
    double deadline = mono() + shutdown_timeout;
    bool forced = false;
    while (http_num_active(srv) > 0 && mono() < deadline) {
        if (wait_signal(sigs, 100)) { // a second signal: stop waiting
            forced = true;
            break;
        }
    }
    if (http_num_active(srv) > 0) {
        log_msg("warning", "%s: cancelling %d request(s)", forced ? "second signal" : "shutdown timeout",
                http_num_active(srv));
        http_cancel_all(srv);
        double d2 = mono() + 5;
        while (http_num_active(srv) > 0 && mono() < d2) {
            wait_signal(sigs, 50);
        }
    }
    return failed;
}

int serve_main(int argc, char **argv) {
    struct serve_options o = {
        .host = "127.0.0.1", .port = 8000, .timeout = 600, .shutdown_timeout = 30, .max_request_bytes = 8u << 20,
        .max_connections = 1024, .http_threads = 4, .http_timeout = 60, .sse_keepalive = 15, .log_format = "text",
        .header_timeout = 10, .body_timeout = 60, .max_buffered_bytes = 256u << 20, .max_request_tokens = 262144,
        .max_request_logprobs = 1048576,
        .ec = {.device = "auto", .gemm = "invariant", .max_num_seqs = 0, .max_queue = 1024, .block_size = 16,
               .gpu_memory_utilization = 0.9f, .duo_sparsity = 0.5f, .sink_tokens = 64, .recent_tokens = 256,
               .tensor_parallel_size = 1, .load_format = "auto"},
    };
    early_log_format(argc, argv);
    cJSON *config_doc = NULL;
    bool help = false;
    int rc = parse_all(&o, argc, argv, &config_doc, &help);
    log_set_json(!strcmp(o.log_format, "json"));
    const char *key_from = "--api-key";
    if (!o.api_key && (o.api_key = getenv("DUOSERVE_API_KEY"))) key_from = "DUOSERVE_API_KEY";
    // An empty key is most often an unset variable ("--api-key $KEY"): serving without
    // authentication because of it would be a silent hole.
    if (!rc && !help && o.api_key && !o.api_key[0])
        rc = usage_error("%s is empty (an unset variable?): give a key, or leave it out to serve without an API key",
                         key_from);
    const char *name = o.served_model_name ? o.served_model_name : o.model ? o.model : "duoserve-demo";
    char backend[160], label[256];
    struct http_config hc = http_config_of(&o, name, backend, sizeof backend, label, sizeof label);
    if (!rc && !help) rc = check_inputs(&o, &hc);
    if (rc || help) {
        cJSON_Delete(config_doc);
        return rc;
    }
    elog_set_sink(log_sink, !log_is_json()); /* the engine's lines through the same logger */
    // Memory a request took goes back to the system when it ends: large blocks (bodies, token
    // arrays, response JSON) are their own mappings, and free heap tops are returned past 1 MiB.
    // glibc's default raises both thresholds after the first large free, after which a 7 MB
    // request leaves tens of MB resident in each thread's arena.
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);

    // Signals: blocked here, so every thread started below inherits the mask; the waits below
    // take them with sigtimedwait (signalfd while serving). Until taken, a signal is pending,
    // and /health says 503 from the moment it is sent.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    http_set_drain_signals(&sigs);

    struct http_server *srv = NULL;
    char err[1024];
    if (http_start(&srv, &hc, err, sizeof err)) {
        log_msg("error", "%s", err);
        cJSON_Delete(config_doc);
        return 1;
    }
    log_msg("info", "listening on http://%s%s%s:%d (model \"%s\", loading)", strchr(o.host, ':') ? "[" : "", o.host,
            strchr(o.host, ':') ? "]" : "", http_port(srv), name);

    double t0 = mono();
    struct chat_template *tmpl = NULL;
    o.ec.prefault_kv = true; /* a server's memory stands still from the start (the soak's flat RSS) */
    struct engine *e = load_in_background(&o.ec, o.model, o.chat_template, &tmpl, &sigs);
    if (!e) {
        http_stop(srv);
        cJSON_Delete(config_doc);
        return 1;
    }
    http_set_engine(srv, e, tmpl);
    log_msg("info", "ready in %.1fs: model \"%s\", max_model_len %d, max_num_seqs %d, vocabulary %d%s", mono() - t0,
            name, engine_max_model_len(e), engine_max_num_seqs(e), engine_vocab_size(e),
            o.api_key ? ", API key required" : "");

    bool failed = serve_until_signal(srv, e, &sigs, o.shutdown_timeout);
    http_stop(srv);
    engine_destroy(e);
    chat_template_free(tmpl);
    cJSON_Delete(config_doc);
    log_msg("info", "stopped");
    return failed ? 1 : 0;
}
