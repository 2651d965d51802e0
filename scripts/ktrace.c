/* ktrace: every GPU kernel's start and end, CUDA graph nodes included, from CUPTI's activity
 * API, for machines without Nsight Systems. A CUDA injection library: the driver loads it at
 * initialisation when CUDA_INJECTION64_PATH names it, so any binary is traced unchanged.
 *
 *   make build/libktrace.so   (needs the CUDA Toolkit's CUPTI: cupti.h, libcupti.so)
 *   CUDA_INJECTION64_PATH=$PWD/build/libktrace.so KTRACE_OUT=trace.txt build/bench_gpu ...
 *   python3 scripts/ktrace_report.py trace.txt
 *
 * One line a kernel: start end (ns, GPU clock) graph-id grid block name (mangled). Lines are
 * written as CUPTI hands buffers back, and the rest at exit. KTRACE_MAX bounds the lines
 * (default 2,000,000). */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *g_out;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* CUPTI's thread vs exit */
static long g_left;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&g_mu);
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || g_left <= 0 || !g_out) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(g_out, "%llu %llu %u %d,%d,%d %d %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->graphId, k->gridX, k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
        g_left--;
    }
    pthread_mutex_unlock(&g_mu);
    free(buf);
}

static void at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&g_mu);
    if (g_out) fclose(g_out);
    g_out = NULL;
    if (g_left <= 0) fprintf(stderr, "ktrace: KTRACE_MAX reached, later kernels not logged\n");
    pthread_mutex_unlock(&g_mu);
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT"), *max = getenv("KTRACE_MAX");
    g_out = fopen(path ? path : "ktrace.txt", "w");
    if (!g_out) {
        perror("ktrace: KTRACE_OUT");
        return 0;
    }
    g_left = max ? atol(max) : 2000000;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: CUPTI activity tracing unavailable\n");
        return 0;
    }
    atexit(at_exit);
    return 1;
}
