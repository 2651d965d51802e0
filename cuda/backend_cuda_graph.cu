// backend_cuda_graph: the CUDA backend's decode-step graphs (captured once a batch size and
// replayed) and its op timing (DUOSERVE_OP_TIMING=1: CUDA events after each op, captured into the
// graphs as event nodes).
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ctx.h"

void cuda_drop_graphs(struct cuda_ctx *c) {
    for (int k = 0; k < 2; k++)
        for (int sp = 0; sp < SPLIT_MODES; sp++)
            for (int i = 0; i <= CUDA_MAX_GRAPHS; i++)
                if (c->graphs[k][sp][i]) {
                    cudaGraphExecDestroy(c->graphs[k][sp][i]);
                    c->graphs[k][sp][i] = NULL;
                    free(c->graph_labels[k][sp][i]);
                    c->graph_labels[k][sp][i] = NULL;
                }
}

// Op timing: an event after an op, labelled with the op (and its shape).
void tm_mark(struct cuda_ctx *c, const char *fmt, ...) {
    struct op_timing *t = c->tm;
    if (!t || t->n < 1 || t->n >= TM_MAX_EV) return;
    char name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int k = 0;
    while (k < t->n_names && strcmp(t->names[k], name)) k++;
    if (k == t->n_names) {
        char *d = k < TM_MAX_LABELS ? strdup(name) : NULL;
        if (!d) return;
        t->names[t->n_names++] = d;
    }
    if (cudaEventRecordWithFlags(t->ev[t->n], c->stream, t->capturing ? cudaEventRecordExternal : 0) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    t->label[t->n++] = k;
}

// After the step's sync: the time between consecutive events goes to the op that ended each.
void tm_collect(struct cuda_ctx *c) {
    struct op_timing *t = c->tm;
    if (!t) return;
    if (t->dirty) { // not a steady-state step: its first events include host work
        t->dropped += t->n > 1;
        t->n = 0;
        t->dirty = false;
        return;
    }
    for (int i = 1; i < t->n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, t->ev[i - 1], t->ev[i]) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        t->ms[t->label[i]] += ms;
        t->calls[t->label[i]]++;
    }
    if (t->n > 1) t->steps++;
    t->n = 0;
}

static void tm_report(struct cuda_ctx *c) {
    struct op_timing *t = c->tm;
    if (!t || !t->steps) return;
    double total = 0.0;
    for (int k = 0; k < t->n_names; k++) total += t->ms[k];
    elog("info",
         "op timing over %ld forward passes (%.3f ms each on average; %ld passes that captured a graph or grew a "
         "buffer left out):",
         t->steps, total / (double)t->steps, t->dropped);
    bool done[TM_MAX_LABELS] = {false};
    for (int r = 0; r < t->n_names; r++) { // largest total first
        int best = -1;
        for (int k = 0; k < t->n_names; k++)
            if (!done[k] && (best < 0 || t->ms[k] > t->ms[best])) best = k;
        done[best] = true;
        elog("info", "  %-28s %8ld calls %10.3f ms %8.1f us/call %6.1f%%", t->names[best], t->calls[best],
             t->ms[best], t->calls[best] ? 1e3 * t->ms[best] / (double)t->calls[best] : 0.0,
             total > 0.0 ? 100.0 * t->ms[best] / total : 0.0);
    }
}

/* The op timing's events (DUOSERVE_OP_TIMING=1); without them the timing is off. */
void tm_open(struct cuda_ctx *c) {
    if (!c->tune.op_timing || !(c->tm = (struct op_timing *)calloc(1, sizeof *c->tm))) return;
    for (int i = 0; i < TM_MAX_EV; i++)
        if (cudaEventCreate(&c->tm->ev[i]) != cudaSuccess) {
            cudaGetLastError();
            for (int j = 0; j < i; j++) cudaEventDestroy(c->tm->ev[j]);
            free(c->tm);
            c->tm = NULL;
            return;
        }
}

/* Logs the table and frees the events. */
void tm_close(struct cuda_ctx *c) {
    if (!c->tm) return;
    tm_report(c);
    for (int i = 0; i < TM_MAX_EV; i++) cudaEventDestroy(c->tm->ev[i]);
    for (int k = 0; k < c->tm->n_names; k++) free(c->tm->names[k]);
    free(c->tm);
    c->tm = NULL;
}

/* Decode steps replay a graph of the whole forward pass: hundreds of small launches become
 * one. A graph is captured the first time a batch size is seen. */
/* key: the batch size, negative when only the argmax ids go to the host */
int cuda_graph_begin(struct backend *b, int key, float *host_logits, size_t n_floats, int32_t *host_ids) {
    struct cuda_ctx *c = CTX(b);
    int ids_only = key < 0, T = key < 0 ? -key : key;
    if (c->graphs_off || T < 1 || T > CUDA_MAX_GRAPHS) return BACKEND_GRAPH_OFF;
    /* the first run sizes the logits buffers (a tensor-parallel rank other than 0 has none) */
    if (n_floats && (!c->h_logits || n_floats > c->h_logits_cap)) return BACKEND_GRAPH_OFF;
    cudaGraphExec_t *slot = &c->graphs[ids_only][c->split_decode][T];
    if (*slot) {
        if (cudaGraphLaunch(*slot, c->stream) != cudaSuccess) {
            cudaGetLastError();
            cuda_drop_graphs(c);
            c->graphs_off = true;
            return BACKEND_GRAPH_OFF;
        }
        if (!ids_only) {
            c->pending_dst = host_logits;
            c->pending_n = n_floats;
        }
        if (host_ids) {
            c->pending_ids = host_ids;
            c->pending_n_ids = T;
        }
        const int *labels = c->graph_labels[ids_only][c->split_decode][T];
        if (c->tm && c->tm->n == 1 && labels) { // the graph's event nodes record ev[1..n)
            int n = c->graph_n_ev[ids_only][c->split_decode][T];
            memcpy(c->tm->label, labels, sizeof(int) * (size_t)n);
            c->tm->n = n;
        }
        return BACKEND_GRAPH_REPLAYED;
    }
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        c->graphs_off = true;
        return BACKEND_GRAPH_OFF;
    }
    if (c->tm) c->tm->capturing = c->tm->dirty = true;
    return BACKEND_GRAPH_CAPTURING;
}

int cuda_graph_end(struct backend *b, int key) {
    struct cuda_ctx *c = CTX(b);
    int ids_only = key < 0, T = key < 0 ? -key : key;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (c->tm) c->tm->capturing = false;
    if (e == cudaSuccess && !c->err) e = cudaGraphInstantiate(&ge, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || c->err || cudaGraphLaunch(ge, c->stream) != cudaSuccess) {
        elog("warning", "CUDA graph capture failed (%s); running without graphs", cudaGetErrorString(e));
        cudaGetLastError();
        if (ge) cudaGraphExecDestroy(ge);
        c->err = 0;
        c->graphs_off = true;
        if (c->tm) c->tm->n = c->tm->n > 0 ? 1 : 0; // the ops run again, outside a graph
        return -1;
    }
    cudaGraphExec_t *slot = &c->graphs[ids_only][c->split_decode][T];
    if (*slot) { // cannot happen (a capture starts only for an empty slot); never leak one
        cudaStreamSynchronize(c->stream);
        cudaGraphExecDestroy(*slot);
    }
    *slot = ge;
    if (c->tm && c->tm->n > 0) { // which op each of the graph's event nodes follows
        int *labels = (int *)malloc(sizeof(int) * (size_t)c->tm->n);
        if (labels) memcpy(labels, c->tm->label, sizeof(int) * (size_t)c->tm->n);
        free(c->graph_labels[ids_only][c->split_decode][T]);
        c->graph_labels[ids_only][c->split_decode][T] = labels;
        c->graph_n_ev[ids_only][c->split_decode][T] = labels ? c->tm->n : 0;
    }
    return 0;
}
