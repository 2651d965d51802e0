/* serve: flags, configuration file, start-up, signal loop and drain. */
#include "server/serve.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/http.h"
#include "server/log.h"

struct serve_options {
    const char *model;
    const char *host;
    int port;
    const char *served_model_name;
    const char *api_key;
    int max_model_len;
    int max_num_seqs;
    int max_queue;
    double timeout;
    double shutdown_timeout;
    size_t max_request_bytes;
    int max_connections;
    int http_threads;
    int http_timeout;
    double sse_keepalive;
    const char *log_format;
    const char *device;
    const char *gemm;
    int max_num_batched_tokens;
    int block_size;
    size_t kv_cache_memory;
    double gpu_memory_utilization;
    const char *duo_pattern;
    double duo_sparsity;
    int sink_tokens;
    int recent_tokens;
    const char *chat_template;
    const char *allowed_origins;
    const char *allowed_methods;
    const char *allowed_headers;
    bool allow_credentials;
    const char *config;
};

enum opt_type { OPT_STR, OPT_INT, OPT_DOUBLE, OPT_BYTES, OPT_BOOL }; // OPT_BOOL: a bare flag is true

struct opt {
    const char *name;  // long flag without "--"; also the --config key ('-' or '_')
    const char *alias; // short flag or NULL
    enum opt_type type;
    size_t off;
    double lo, hi;     // numeric range
    const char *arg, *help;
};

#define O(field) offsetof(struct serve_options, field)
static const struct opt opts[] = {
    {"model", "-m", OPT_STR, O(model), 0, 0, "DIR", "Hugging Face model directory (default: the built-in demo model)"},
    {"host", NULL, OPT_STR, O(host), 0, 0, "ADDR", "address to listen on (default 127.0.0.1)"},
    {"port", NULL, OPT_INT, O(port), 0, 65535, "N", "port (default 8000; 0 = any free port, logged)"},
    {"served-model-name", NULL, OPT_STR, O(served_model_name), 0, 0, "NAME", "model id in the API (default: the -m argument)"},
    {"api-key", NULL, OPT_STR, O(api_key), 0, 0, "KEY", "require Authorization: Bearer KEY (also $DUOSERVE_API_KEY)"},
    {"max-model-len", NULL, OPT_INT, O(max_model_len), 1, 1 << 24, "N", "prompt + output limit (default: the model's)"},
    {"max-num-seqs", NULL, OPT_INT, O(max_num_seqs), 1, 65536, "N", "sequences running at once (default 64)"},
    {"max-queue", NULL, OPT_INT, O(max_queue), 1, 1 << 24, "N", "waiting requests before 429 (default 1024)"},
    {"timeout", NULL, OPT_DOUBLE, O(timeout), 0, 1e9, "S", "cancel a request running longer (finish_reason \"abort\"; 0 = never; default 600)"},
    {"shutdown-timeout", NULL, OPT_DOUBLE, O(shutdown_timeout), 0, 1e9, "S", "on SIGTERM wait this long for running requests (default 30)"},
    {"max-request-bytes", NULL, OPT_BYTES, O(max_request_bytes), 1024, 1e12, "BYTES", "larger request bodies get 413 (default 8MiB)"},
    {"max-connections", NULL, OPT_INT, O(max_connections), 1, 1 << 20, "N", "open HTTP connections (default 1024)"},
    {"http-threads", NULL, OPT_INT, O(http_threads), 1, 256, "N", "HTTP threads (default 4)"},
    {"http-timeout", NULL, OPT_INT, O(http_timeout), 1, 86400, "S", "idle HTTP connection timeout (default 60)"},
    {"sse-keepalive", NULL, OPT_DOUBLE, O(sse_keepalive), 0.05, 3600, "S", "comment line on a stream idle this long (default 15)"},
    {"log-format", NULL, OPT_STR, O(log_format), 0, 0, "text|json", "log lines as text (default) or JSON objects"},
    {"device", NULL, OPT_STR, O(device), 0, 0, "auto|cpu|cuda", "backend (default auto: the GPU when there is one)"},
    {"gemm", NULL, OPT_STR, O(gemm), 0, 0, "invariant|cublas", "CUDA GEMMs: batch-invariant kernels (default) or cuBLAS (faster prefill and big batches; outputs may then depend on batching)"},
    {"max-num-batched-tokens", NULL, OPT_INT, O(max_num_batched_tokens), 1, 1 << 24, "N", "tokens per engine step (default 2048 CPU, 8192 GPU)"},
    {"block-size", NULL, OPT_INT, O(block_size), 1, 1024, "N", "KV block size in tokens (default 16)"},
    {"kv-cache-memory", NULL, OPT_BYTES, O(kv_cache_memory), 0, 1e15, "BYTES", "CPU: bytes for the KV pools (default 256MiB)"},
    {"gpu-memory-utilization", NULL, OPT_DOUBLE, O(gpu_memory_utilization), 0.01, 1, "F", "CUDA: fraction of the card (default 0.9)"},
    {"duo-pattern", NULL, OPT_STR, O(duo_pattern), 0, 0, "FILE", "DuoAttention full_attention_heads.tsv (default: all heads full)"},
    {"duo-sparsity", NULL, OPT_DOUBLE, O(duo_sparsity), 0, 1, "F", "fraction of heads made streaming (default 0.5)"},
    {"sink-tokens", NULL, OPT_INT, O(sink_tokens), 0, 1 << 20, "N", "streaming heads keep this many first tokens (default 64)"},
    {"recent-tokens", NULL, OPT_INT, O(recent_tokens), 1, 1 << 20, "N", "... and this many last tokens (default 256)"},
    {"chat-template", NULL, OPT_STR, O(chat_template), 0, 0, "FILE", "Jinja chat template overriding the model's"},
    {"allowed-origins", NULL, OPT_STR, O(allowed_origins), 0, 0, "JSON", "CORS: origins browsers may call from, e.g. '[\"https://app.example\"]' (default '[\"*\"]': any; '[]': none)"},
    {"allowed-methods", NULL, OPT_STR, O(allowed_methods), 0, 0, "JSON", "CORS: methods allowed in a preflight (default '[\"*\"]')"},
    {"allowed-headers", NULL, OPT_STR, O(allowed_headers), 0, 0, "JSON", "CORS: request headers allowed in a preflight (default '[\"*\"]')"},
    {"allow-credentials", NULL, OPT_BOOL, O(allow_credentials), 0, 1, "[=true|false]", "CORS: allow credentials (cookies, HTTP auth) from those origins"},
    {"config", NULL, OPT_STR, O(config), 0, 0, "FILE", "JSON object with any of these keys (flags override it; default $DUOSERVE_CONFIG)"},
};
#undef O
#define N_OPTS (sizeof opts / sizeof opts[0])

static void serve_usage(FILE *f) {
    fprintf(f, "usage: duoserve serve [options]\n\noptions:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s--%s %s", opts[i].alias ? opts[i].alias : "", opts[i].alias ? ", " : "",
                 opts[i].name, opts[i].arg);
        fprintf(f, "  %-34s %s\n", left, opts[i].help);
    }
}

static int usage_error(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "duoserve serve: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see duoserve serve --help)\n");
    return 2;
}

/* "8MiB", "256M", "1G", "4096" -> bytes. */
static int parse_bytes(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !isfinite(x) || x < 0) return -1;
    double mult = 1;
    if (*end) {
        char u = (char)(*end | 0x20);
        mult = u == 'k' ? 1024.0 : u == 'm' ? 1048576.0 : u == 'g' ? 1073741824.0 : u == 't' ? 1099511627776.0 : 0;
        if (!mult) return -1;
        end++;
        if (!strcmp(end, "ib") || !strcmp(end, "iB") || !strcmp(end, "b") || !strcmp(end, "B")) end += strlen(end);
        if (*end) return -1;
    }
    *out = x * mult;
    return 0;
}

static const struct opt *find_opt(const char *flag) {
    char norm[64];
    size_t n = strlen(flag);
    if (n >= sizeof norm) return NULL;
    for (size_t i = 0; i <= n; i++) norm[i] = flag[i] == '_' ? '-' : flag[i];
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(norm, opts[i].name)) return &opts[i];
    return NULL;
}

static int set_opt(struct serve_options *o, const struct opt *op, const char *v) {
    char *p = (char *)o + op->off;
    char *end;
    double x;
    switch (op->type) {
    case OPT_STR: *(const char **)p = v; return 0;
    case OPT_INT:
        errno = 0;
        x = (double)strtol(v, &end, 10);
        if (errno || end == v || *end || x < op->lo || x > op->hi) break;
        *(int *)p = (int)x;
        return 0;
    case OPT_DOUBLE:
        errno = 0;
        x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < op->lo || x > op->hi) break;
        *(double *)p = x;
        return 0;
    case OPT_BYTES:
        if (parse_bytes(v, &x) || x < op->lo || x > op->hi) break;
        *(size_t *)p = (size_t)x;
        return 0;
    case OPT_BOOL:
        if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "1") && strcmp(v, "0")) break;
        *(bool *)p = !strcmp(v, "true") || !strcmp(v, "1");
        return 0;
    }
    fprintf(stderr, "duoserve serve: --%s: \"%s\" is not a valid value (%s, in [%g, %g])\n(see duoserve serve --help)\n",
            op->name, v, op->arg, op->lo, op->hi);
    return 2;
}

static int parse_args(struct serve_options *o, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 1;
        }
        const char *val = NULL;
        const struct opt *op = NULL;
        if (!strncmp(a, "--", 2)) {
            char name[64];
            const char *eq = strchr(a, '=');
            size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (n < sizeof name) {
                memcpy(name, a + 2, n);
                name[n] = 0;
                op = find_opt(name);
            }
            if (eq) val = eq + 1;
        } else {
            for (size_t k = 0; k < N_OPTS; k++)
                if (opts[k].alias && !strcmp(a, opts[k].alias)) op = &opts[k];
        }
        if (!op) return usage_error("unknown option \"%s\"%s", a, "");
        if (!val && op->type == OPT_BOOL) val = "true";
        if (!val) {
            if (i + 1 >= argc) return usage_error("%s needs a value%s", a, "");
            val = argv[++i];
        }
        int rc = set_opt(o, op, val);
        if (rc) return rc;
    }
    return 0;
}

/* Applies --config FILE: every key is a flag name (dashes or underscores), values strings,
 * numbers or booleans. Strings stay alive in *doc (freed by the caller). */
static int apply_config(struct serve_options *o, const char *path, cJSON **doc) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "duoserve serve: --config %s: %s\n", path, strerror(errno)), 2;
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
    if (!cJSON_IsObject(*doc)) return fprintf(stderr, "duoserve serve: --config %s: not a JSON object\n", path), 2;
    // Strings made here (JSON lists given as arrays) live in *doc too, under a key the loop skips.
    cJSON *lists = cJSON_AddArrayToObject(*doc, "");
    if (!lists) return fprintf(stderr, "duoserve serve: out of memory\n"), 2;
    const cJSON *it;
    cJSON_ArrayForEach(it, *doc) {
        if (it == lists) continue;
        const struct opt *op = find_opt(it->string);
        if (!op || !strcmp(op->name, "config"))
            return fprintf(stderr, "duoserve serve: --config %s: unknown key \"%s\"\n", path, it->string), 2;
        char num[64];
        const char *v;
        if (cJSON_IsString(it)) v = it->valuestring;
        else if (cJSON_IsNumber(it)) snprintf(num, sizeof num, "%.17g", it->valuedouble), v = num;
        else if (cJSON_IsBool(it) && op->type == OPT_BOOL) v = cJSON_IsTrue(it) ? "true" : "false";
        else if (cJSON_IsArray(it) && op->type == OPT_STR && !strncmp(op->name, "allowed-", 8)) {
            char *list = cJSON_PrintUnformatted(it); // the JSON list as the flag takes it
            cJSON *copy = list ? cJSON_CreateString(list) : NULL;
            free(list);
            if (!copy || !cJSON_AddItemToArray(lists, copy)) return fprintf(stderr, "duoserve serve: out of memory\n"), 2;
            v = copy->valuestring;
        } else if (cJSON_IsNull(it)) continue;
        else
            return fprintf(stderr, "duoserve serve: --config %s: \"%s\" must be a string or a number (a boolean for "
                                   "allow-credentials, a list for allowed-*)\n", path, it->string), 2;
        if (op->type == OPT_STR && !cJSON_IsString(it) && !cJSON_IsArray(it))
            return fprintf(stderr, "duoserve serve: --config %s: \"%s\" must be a string\n", path, it->string), 2;
        int rc = set_opt(o, op, v);
        if (rc) return rc;
    }
    return 0;
}

/* ---- loading in the background, so /health answers 503 and signals work meanwhile ---- */

struct loader {
    struct engine_config cfg;
    struct engine *engine;
    int rc;
    char err[1024];
    volatile int done; // written once by the loader thread, read under `mu`
    pthread_mutex_t mu;
};

static void *load_engine(void *arg) {
    struct loader *l = arg;
    int rc = engine_create(&l->engine, &l->cfg, l->err, sizeof l->err);
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

int serve_main(int argc, char **argv) {
    struct serve_options o = {
        .host = "127.0.0.1", .port = 8000, .max_num_seqs = 64, .max_queue = 1024, .timeout = 600,
        .shutdown_timeout = 30, .max_request_bytes = 8u << 20, .max_connections = 1024, .http_threads = 4,
        .http_timeout = 60, .sse_keepalive = 15, .log_format = "text", .device = "auto", .gemm = "invariant", .block_size = 16,
        .gpu_memory_utilization = 0.9, .duo_sparsity = 0.5, .sink_tokens = 64, .recent_tokens = 256,
    };
    // --config (else $DUOSERVE_CONFIG) first, so flags given on the command line override it.
    cJSON *config_doc = NULL;
    const char *config_path = getenv("DUOSERVE_CONFIG");
    if (config_path && !config_path[0]) config_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config_path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9)) config_path = argv[i] + 9;
    }
    if (config_path) {
        int rc = apply_config(&o, config_path, &config_doc);
        if (rc) {
            cJSON_Delete(config_doc);
            return rc;
        }
    }
    int rc = parse_args(&o, argc, argv);
    if (rc) {
        cJSON_Delete(config_doc);
        return rc == 1 ? 0 : rc;
    }
    if (strcmp(o.log_format, "text") && strcmp(o.log_format, "json")) {
        cJSON_Delete(config_doc);
        return usage_error("--log-format: \"%s\" is not text or json%s", o.log_format, "");
    }
    if (strcmp(o.device, "cpu") && strcmp(o.device, "cuda") && strcmp(o.device, "auto")) {
        cJSON_Delete(config_doc);
        return usage_error("--device: \"%s\" is not auto, cpu or cuda%s", o.device, "");
    }
    if (strcmp(o.gemm, "invariant") && strcmp(o.gemm, "cublas")) {
        cJSON_Delete(config_doc);
        return usage_error("--gemm: \"%s\" is not invariant or cublas%s", o.gemm, "");
    }
    log_set_json(!strcmp(o.log_format, "json"));
    if (!o.api_key) o.api_key = getenv("DUOSERVE_API_KEY");
    const char *name = o.served_model_name ? o.served_model_name : o.model ? o.model : "duoserve-demo";

    // Signals: blocked here, so every thread started below inherits the mask; the loop below
    // takes them with sigtimedwait.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char backend[160];
    snprintf(backend, sizeof backend, "device=%s gemm=%s", o.device, o.gemm);
    struct http_config hc = {
        .host = o.host, .port = o.port, .api_key = o.api_key, .model_name = name, .model_root = o.model ? o.model : name,
        .max_request_bytes = o.max_request_bytes, .max_connections = o.max_connections, .threads = o.http_threads,
        .conn_timeout_s = o.http_timeout, .request_timeout_s = o.timeout, .keepalive_s = o.sse_keepalive,
        .max_n = o.max_num_seqs, .allowed_origins = o.allowed_origins, .allowed_methods = o.allowed_methods,
        .allowed_headers = o.allowed_headers, .allow_credentials = o.allow_credentials, .backend = backend,
    };
    struct http_server *srv = NULL;
    char err[1024];
    if (http_check_config(&hc, err, sizeof err)) {
        cJSON_Delete(config_doc);
        return usage_error("%s%s", err, "");
    }
    if (http_start(&srv, &hc, err, sizeof err)) {
        log_msg("error", "%s", err);
        cJSON_Delete(config_doc);
        return 1;
    }
    log_msg("info", "listening on http://%s%s%s:%d (model \"%s\", loading)", strchr(o.host, ':') ? "[" : "", o.host,
            strchr(o.host, ':') ? "]" : "", http_port(srv), name);

    struct loader ld = {
        .cfg = {
            .model_dir = o.model, .device = o.device, .gemm = o.gemm, .max_num_seqs = o.max_num_seqs,
            .max_num_batched_tokens = o.max_num_batched_tokens, .max_model_len = o.max_model_len,
            .max_queue = o.max_queue, .block_size = o.block_size, .kv_cache_memory = o.kv_cache_memory,
            .gpu_memory_utilization = (float)o.gpu_memory_utilization, .duo_pattern = o.duo_pattern,
            .duo_sparsity = (float)o.duo_sparsity, .sink_tokens = o.sink_tokens, .recent_tokens = o.recent_tokens,
            .chat_template_file = o.chat_template,
        },
    };
    pthread_mutex_init(&ld.mu, NULL);
    pthread_t loader_thread;
    double t0 = mono();
    if (pthread_create(&loader_thread, NULL, load_engine, &ld)) {
        log_msg("error", "cannot start the loader thread");
        http_stop(srv);
        cJSON_Delete(config_doc);
        return 1;
    }
    while (!loader_done(&ld)) {
        int sig = wait_signal(&sigs, 100);
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
        http_stop(srv);
        cJSON_Delete(config_doc);
        return 1;
    }
    struct engine *e = ld.engine;
    http_set_engine(srv, e);
    log_msg("info", "ready in %.1fs: model \"%s\", max_model_len %d, vocabulary %d%s", mono() - t0, name,
            engine_max_model_len(e), engine_vocab_size(e), o.api_key && o.api_key[0] ? ", API key required" : "");

    int sig;
    while (!(sig = wait_signal(&sigs, 200))) http_tick(srv);

    // Drain: no new requests, running ones finish within --shutdown-timeout.
    http_set_state(srv, HTTP_STATE_DRAINING);
    engine_drain(e);
    log_msg("info", "%s: draining %d request(s) (up to %.0fs)", strsignal(sig), http_num_active(srv), o.shutdown_timeout);
    double deadline = mono() + o.shutdown_timeout;
    bool forced = false;
    while (http_num_active(srv) > 0 && mono() < deadline) {
        if (wait_signal(&sigs, 100)) { // a second signal: stop waiting
            forced = true;
            break;
        }
        http_tick(srv);
    }
    if (http_num_active(srv) > 0) {
        log_msg("warning", "%s: cancelling %d request(s)", forced ? "second signal" : "shutdown timeout",
                http_num_active(srv));
        http_cancel_all(srv);
        double d2 = mono() + 5;
        while (http_num_active(srv) > 0 && mono() < d2) {
            wait_signal(&sigs, 50);
            http_tick(srv);
        }
    }
    http_stop(srv);
    engine_destroy(e);
    cJSON_Delete(config_doc);
    log_msg("info", "stopped");
    return 0;
}
