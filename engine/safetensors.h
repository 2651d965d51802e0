/* safetensors: memory-mapped reading of Hugging Face *.safetensors files, a single file or
 * shards listed in model.safetensors.index.json. Every header is validated (length, JSON,
 * dtype, shape, offsets inside the file, byte size == elements * dtype size) so a truncated
 * or corrupt file is an error message, never a crash. Read-only after open; thread-safe. */
#ifndef DUO_SAFETENSORS_H
#define DUO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum st_dtype { ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16 };

#define ST_MAX_DIMS 4

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    const void *data; // inside the mapping; may be unaligned
    size_t nbytes;
    const char *file; // the file that holds it
};

struct safetensors {
    int n_files;
    char **paths;
    void **maps;
    size_t *sizes;
    int n_tensors;
    struct st_tensor *tensors; // sorted by name
};

/* Opens DIR/model.safetensors.index.json (sharded) or DIR/model.safetensors. */
int safetensors_open_dir(struct safetensors **out, const char *dir, char *err, size_t errlen);
/* Opens one file. */
int safetensors_open_file(struct safetensors **out, const char *path, char *err, size_t errlen);
void safetensors_free(struct safetensors *st);

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
const char *st_dtype_name(enum st_dtype dt);
size_t st_dtype_size(enum st_dtype dt);
int64_t st_tensor_numel(const struct st_tensor *t);

/* Converts n elements starting at element `first` of t to f32. */
void st_tensor_to_f32(const struct st_tensor *t, int64_t first, int64_t n, float *out);
/* The same to bf16: copied when t is bf16, else through f32 rounded to nearest even. */
void st_tensor_to_bf16(const struct st_tensor *t, int64_t first, int64_t n, uint16_t *out);

/* Writes a single-file safetensors of the given tensors (data as given, dtype as given) to
 * path: used by the demo-model generator and tests. */
struct st_write_tensor {
    const char *name;
    enum st_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
};
int safetensors_write(const char *path, const struct st_write_tensor *ts, int n, char *err, size_t errlen);

#endif
