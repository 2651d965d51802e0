// comm_nccl: the collectives of engine/comm.h over NCCL, one communicator per GPU of this process
// (ncclCommInitAll: the ranks are threads of one process, engine/tp.h), each queued on its rank's
// backend stream, so a decode step's CUDA graph captures them with the rest of the step.
// libnccl.so.2 is opened when tensor parallelism starts, not linked: a single-GPU server does
// not need NCCL installed. Failures: abort() marks the group; each rank then aborts its own
// communicator from its own thread (aborted(), polled while it waits for its stream), which
// ends any collective still waiting for a peer that failed.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define DUO_HAVE_NCCL 1
#endif

extern "C" {
#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/elog.h"
int backend_cuda_device(struct backend *b);
cudaStream_t backend_cuda_stream(struct backend *b);
}

#ifdef DUO_HAVE_NCCL
// The NCCL entry points used, resolved from libnccl.so.2.
struct nccl_api {
    ncclResult_t (*CommInitAll)(ncclComm_t *comms, int n, const int *devs);
    ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t s);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                              cudaStream_t s);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *err);
    const char *(*GetErrorString)(ncclResult_t r);
    ncclResult_t (*GetVersion)(int *version);
};
static struct nccl_api g_nccl;
static char g_nccl_err[256];
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_nccl_err, sizeof g_nccl_err, "tensor parallelism on GPUs needs NCCL: %s (install libnccl2, or put "
                                                "libnccl.so.2 on LD_LIBRARY_PATH)", dlerror());
        return;
    }
    struct {
        void **fn;
        const char *name;
    } syms[] = {{(void **)&g_nccl.CommInitAll, "ncclCommInitAll"},
                {(void **)&g_nccl.AllReduce, "ncclAllReduce"},
                {(void **)&g_nccl.AllGather, "ncclAllGather"},
                {(void **)&g_nccl.CommAbort, "ncclCommAbort"},
                {(void **)&g_nccl.CommDestroy, "ncclCommDestroy"},
                {(void **)&g_nccl.CommGetAsyncError, "ncclCommGetAsyncError"},
                {(void **)&g_nccl.GetErrorString, "ncclGetErrorString"},
                {(void **)&g_nccl.GetVersion, "ncclGetVersion"}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
            snprintf(g_nccl_err, sizeof g_nccl_err, "libnccl.so.2 has no %s (NCCL 2.10 or newer is needed)",
                     syms[i].name);
            memset(&g_nccl, 0, sizeof g_nccl);
            return;
        }
}

// What the ranks share.
struct nccl_group {
    int n;
    std::atomic<bool> aborted;
    std::atomic<int> refs;
};

struct nccl_rank {
    struct nccl_group *g;
    ncclComm_t comm; // NULL once aborted
    cudaStream_t stream;
    int device;
};

#define RANK(c) ((struct nccl_rank *)(c)->ctx)

static ncclDataType_t nccl_type(enum comm_dtype dt) { return dt == COMM_F32 ? ncclFloat32 : ncclBfloat16; }

static int nccl_failed(struct comm *c, const char *what, ncclResult_t e) {
    elog("error", "NCCL %s failed on rank %d (GPU %d): %s", what, c->rank, RANK(c)->device, g_nccl.GetErrorString(e));
    RANK(c)->g->aborted = true;
    return COMM_ERR_DEVICE;
}

static int nc_all_reduce(struct comm *c, void *buf, size_t n, enum comm_dtype dt) {
    struct nccl_rank *r = RANK(c);
    if (r->g->aborted || !r->comm) return COMM_ERR_ABORTED;
    ncclResult_t e = g_nccl.AllReduce(buf, buf, n, nccl_type(dt), ncclSum, r->comm, r->stream);
    return e == ncclSuccess ? COMM_OK : nccl_failed(c, "all-reduce", e);
}

static int nc_all_gather(struct comm *c, void *dst, const void *src, size_t n, enum comm_dtype dt) {
    struct nccl_rank *r = RANK(c);
    if (r->g->aborted || !r->comm) return COMM_ERR_ABORTED;
    ncclResult_t e = g_nccl.AllGather(src, dst, n, nccl_type(dt), r->comm, r->stream);
    return e == ncclSuccess ? COMM_OK : nccl_failed(c, "all-gather", e);
}

static void nc_abort(struct comm *c) { RANK(c)->g->aborted = true; }

// From the rank's own thread: a failure NCCL saw (a peer's, or the network's) aborts the group;
// once the group is aborted this rank's communicator is aborted too, which ends its pending
// collectives.
static bool nc_aborted(struct comm *c) {
    struct nccl_rank *r = RANK(c);
    ncclResult_t async = ncclSuccess;
    if (!r->g->aborted && r->comm && g_nccl.CommGetAsyncError(r->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
        nccl_failed(c, "communicator", async);
    if (r->g->aborted && r->comm) {
        g_nccl.CommAbort(r->comm);
        r->comm = NULL;
    }
    return r->g->aborted;
}

static void nc_destroy(struct comm *c) {
    struct nccl_rank *r = RANK(c);
    if (r->comm) {
        if (r->g->aborted) g_nccl.CommAbort(r->comm);
        else g_nccl.CommDestroy(r->comm);
    }
    if (--r->g->refs == 0) delete r->g;
    free(r);
    free(c);
}

static const struct comm_ops nccl_ops = {
    nc_all_reduce, nc_all_gather, nc_abort, nc_aborted, nc_destroy,
};

extern "C" int comm_nccl_create(struct comm **out, struct backend *const *b, int n, char *err, size_t errlen) {
    pthread_once(&g_nccl_once, nccl_load);
    if (!g_nccl.CommInitAll) {
        snprintf(err, errlen, "%s", g_nccl_err);
        return -1;
    }
    int *devs = (int *)calloc((size_t)n, sizeof *devs);
    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n, sizeof *comms);
    struct nccl_group *g = new (std::nothrow) nccl_group;
    bool ok = devs && comms && g;
    for (int r = 0; ok && r < n; r++) devs[r] = backend_cuda_device(b[r]);
    ncclResult_t e = ok ? g_nccl.CommInitAll(comms, n, devs) : ncclSystemError;
    if (!ok || e != ncclSuccess) {
        int v = 0;
        g_nccl.GetVersion(&v);
        snprintf(err, errlen, "NCCL %d.%d.%d: cannot make communicators for %d GPUs: %s", v / 10000, v / 100 % 100,
                 v % 100, n, ok ? g_nccl.GetErrorString(e) : "out of memory");
        free(devs), free(comms);
        delete g;
        return -1;
    }
    g->n = n;
    g->aborted = false;
    g->refs = n;
    int made = 0;
    for (int r = 0; r < n; r++) {
        struct nccl_rank *rk = (struct nccl_rank *)calloc(1, sizeof *rk);
        struct comm *c = (struct comm *)calloc(1, sizeof *c);
        if (!rk || !c) {
            free(rk), free(c);
            break;
        }
        *rk = (struct nccl_rank){g, comms[r], backend_cuda_stream(b[r]), devs[r]};
        *c = (struct comm){&nccl_ops, r, n, rk};
        out[made++] = c;
    }
    if (made < n) { /* out of memory: the communicators made so far go, and so do the others */
        g->refs = made + 1;
        for (int r = 0; r < made; r++) nc_destroy(out[r]);
        for (int r = made; r < n; r++) g_nccl.CommDestroy(comms[r]);
        delete g;
        snprintf(err, errlen, "out of memory");
    }
    free(devs);
    free(comms);
    return made < n ? -1 : 0;
}
#else
// Built without the NCCL headers (libnccl-dev): tensor parallelism on GPUs says so at start-up.
extern "C" int comm_nccl_create(struct comm **out, struct backend *const *b, int n, char *err, size_t errlen) {
    snprintf(err, errlen, "this duoserve was built without NCCL headers (nccl.h), so without tensor parallelism on "
                          "GPUs");
    return -1;
}
#endif
