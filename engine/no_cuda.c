/* no_cuda: what a build without CUDA (CUDA=0, or no nvcc) links in place of cuda/'s entries:
 * no device, and every attempt to use one says why. A CUDA build defines DUO_CUDA and takes
 * these from cuda/backend_cuda.cu and cuda/comm_nccl.cu instead. */
#ifndef DUO_CUDA
#include <stdio.h>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/util.h"

int backend_cuda_probe(int device, char *err, size_t errlen) {
    if (err && errlen)
        snprintf(err, errlen, "this duoserve was built without CUDA (CUDA=0 or no nvcc at build time; make CUDA=1 "
                              "builds it with the CUDA toolkit)");
    return BACKEND_CUDA_NONE;
}

struct backend *backend_cuda_create(int device, int flags, char *err, size_t errlen) {
    (void)flags;
    backend_cuda_probe(device, err, errlen);
    return NULL;
}

int backend_cuda_device_count(void) { return 0; }

int comm_nccl_create(struct comm **out, struct backend *const *b, int n, char *err, size_t errlen) {
    (void)out, (void)b, (void)n;
    return util_err(err, errlen, "this duoserve was built without CUDA, so without NCCL");
}
#endif
