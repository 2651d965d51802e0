#include "engine/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/util.h"

/* A header larger than this is certainly corrupt (real ones are well under 10 MB). */
#define ST_MAX_HEADER (100u << 20)

const char *st_dtype_name(enum st_dtype dt) {
    switch (dt) {
    case ST_DTYPE_F32: return "F32";
    case ST_DTYPE_F16: return "F16";
    case ST_DTYPE_BF16: return "BF16";
    }
    return "?";
}

size_t st_dtype_size(enum st_dtype dt) { return dt == ST_DTYPE_F32 ? 4 : 2; }

int64_t st_tensor_numel(const struct st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

void st_tensor_to_f32(const struct st_tensor *t, int64_t first, int64_t n, float *out) {
    const unsigned char *p = (const unsigned char *)t->data + first * (int64_t)st_dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_DTYPE_F32: memcpy(out, p, (size_t)n * 4); break;
    case ST_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = util_bf16_to_f32(h);
        }
        break;
    case ST_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = util_f16_to_f32(h);
        }
        break;
    }
}

void st_tensor_to_bf16(const struct st_tensor *t, int64_t first, int64_t n, uint16_t *out) {
    if (t->dtype == ST_DTYPE_BF16) {
        memcpy(out, (const unsigned char *)t->data + first * 2, (size_t)n * 2);
        return;
    }
    float f[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t m = n - i < 4096 ? n - i : 4096;
        st_tensor_to_f32(t, first + i, m, f);
        for (int64_t k = 0; k < m; k++) out[i + k] = util_f32_to_bf16(f[k]);
    }
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

void safetensors_free(struct safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->maps[i] && st->maps[i] != MAP_FAILED) munmap(st->maps[i], st->sizes[i]);
        free(st->paths[i]);
    }
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->paths);
    free(st->maps);
    free(st->sizes);
    free(st->tensors);
    free(st);
}

/* Maps file idx and appends its tensors to st->tensors. */
static int load_file(struct safetensors *st, int idx, char *err, size_t errlen) {
    const char *path = st->paths[idx];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return util_err(err, errlen, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return util_err(err, errlen, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return util_err(err, errlen, "%s: truncated safetensors file (%zu bytes, no header)", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return util_err(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
    st->maps[idx] = map;
    st->sizes[idx] = size;

    uint64_t hlen = 0;
    const unsigned char *b = map;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8)
        return util_err(err, errlen, "%s: corrupt or truncated safetensors header (header length %llu, file size %zu)",
                        path, (unsigned long long)hlen, size);
    const char *hdr = (const char *)b + 8;
    const unsigned char *data = b + 8 + hlen;
    size_t data_size = size - 8 - hlen;
    cJSON *root = cJSON_ParseWithLength(hdr, hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return util_err(err, errlen, "%s: corrupt safetensors header (not a JSON object)", path);
    }
    int n = cJSON_GetArraySize(root);
    struct st_tensor *grown = realloc(st->tensors, sizeof *grown * (size_t)(st->n_tensors + n));
    if (!grown) {
        cJSON_Delete(root);
        return util_err(err, errlen, "%s: out of memory", path);
    }
    st->tensors = grown;
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        const char *name = e->string;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            rc = util_err(err, errlen, "%s: corrupt safetensors header entry for \"%s\"", path, name);
            break;
        }
        struct st_tensor t = {0};
        if (!strcmp(dt->valuestring, "F32")) t.dtype = ST_DTYPE_F32;
        else if (!strcmp(dt->valuestring, "F16")) t.dtype = ST_DTYPE_F16;
        else if (!strcmp(dt->valuestring, "BF16")) t.dtype = ST_DTYPE_BF16;
        else {
            rc = util_err(err, errlen, "%s: tensor \"%s\" has unsupported dtype %s (supported: F32, BF16, F16)",
                          path, name, dt->valuestring);
            break;
        }
        t.n_dims = cJSON_GetArraySize(sh);
        if (t.n_dims > ST_MAX_DIMS) {
            rc = util_err(err, errlen, "%s: tensor \"%s\" has %d dimensions (at most %d)", path, name, t.n_dims, ST_MAX_DIMS);
            break;
        }
        /* numel * size, computed in double to catch overflow of absurd shapes */
        double numel = 1;
        int d = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, sh) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) || x->valuedouble > 1e12) {
                rc = util_err(err, errlen, "%s: tensor \"%s\" has an invalid shape", path, name);
                break;
            }
            t.shape[d++] = (int64_t)x->valuedouble;
            numel *= x->valuedouble;
        }
        if (rc) break;
        const cJSON *o0 = cJSON_GetArrayItem(off, 0), *o1 = cJSON_GetArrayItem(off, 1);
        double begin = cJSON_IsNumber(o0) ? o0->valuedouble : -1, end = cJSON_IsNumber(o1) ? o1->valuedouble : -1;
        if (begin < 0 || end < begin || begin != floor(begin) || end != floor(end)) {
            rc = util_err(err, errlen, "%s: tensor \"%s\" has invalid data_offsets", path, name);
            break;
        }
        if (end > (double)data_size) {
            rc = util_err(err, errlen, "%s: truncated: tensor \"%s\" ends at byte %.0f of a %zu-byte data section",
                          path, name, end, data_size);
            break;
        }
        if (end - begin != numel * (double)st_dtype_size(t.dtype)) {
            rc = util_err(err, errlen, "%s: tensor \"%s\": %.0f bytes for shape of %.0f %s elements", path, name,
                          end - begin, numel, dt->valuestring);
            break;
        }
        t.data = data + (size_t)begin;
        t.nbytes = (size_t)(end - begin);
        t.file = st->paths[idx];
        t.name = strdup(name);
        if (!t.name) {
            rc = util_err(err, errlen, "out of memory");
            break;
        }
        st->tensors[st->n_tensors++] = t;
    }
    cJSON_Delete(root);
    return rc;
}

static struct safetensors *st_alloc(int n_files) {
    struct safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->paths = calloc((size_t)n_files, sizeof *st->paths);
    st->maps = calloc((size_t)n_files, sizeof *st->maps);
    st->sizes = calloc((size_t)n_files, sizeof *st->sizes);
    if (!st->paths || !st->maps || !st->sizes) {
        safetensors_free(st);
        return NULL;
    }
    st->n_files = n_files;
    return st;
}

/* After all files are loaded: sort for lookup, refuse duplicates. */
static int st_finish(struct safetensors *st, char *err, size_t errlen) {
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor);
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name))
            return util_err(err, errlen, "%s: tensor \"%s\" appears twice (also in %s)", st->tensors[i].file,
                            st->tensors[i].name, st->tensors[i - 1].file);
    return 0;
}

int safetensors_open_file(struct safetensors **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    struct safetensors *st = st_alloc(1);
    if (!st || !(st->paths[0] = strdup(path))) {
        safetensors_free(st);
        return util_err(err, errlen, "out of memory");
    }
    if (load_file(st, 0, err, errlen) < 0 || st_finish(st, err, errlen) < 0) {
        safetensors_free(st);
        return -1;
    }
    *out = st;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sharded checkpoint: the index maps tensor name -> shard file; every shard is opened and
 * every name the index lists must be in the shard it names. */
static int open_index(struct safetensors **out, const char *dir, const char *index_path, char *err, size_t errlen) {
    char *text = NULL;
    size_t len;
    if (util_read_file(index_path, &text, &len) != 0) return util_err(err, errlen, "%s: %s", index_path, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return util_err(err, errlen, "%s: no \"weight_map\" object", index_path);
    }
    int n = cJSON_GetArraySize(wm), n_files = 0, rc = 0;
    char **files = calloc((size_t)n + 1, sizeof *files);
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
            rc = util_err(err, errlen, "%s: weight_map entry for \"%s\" is not a file name", index_path, e->string);
            break;
        }
        files[n_files++] = e->valuestring;
    }
    struct safetensors *st = NULL;
    if (!rc) {
        qsort(files, (size_t)n_files, sizeof *files, cmp_str);
        int u = 0;
        for (int i = 0; i < n_files; i++)
            if (!u || strcmp(files[i], files[u - 1])) files[u++] = files[i];
        st = st_alloc(u > 0 ? u : 1);
        if (!st) rc = util_err(err, errlen, "out of memory");
        for (int i = 0; !rc && i < u; i++) {
            st->paths[i] = util_path_join(dir, files[i]);
            rc = load_file(st, i, err, errlen);
        }
        if (!rc) st->n_files = u;
        if (!rc) rc = st_finish(st, err, errlen);
        cJSON_ArrayForEach(e, wm) {
            if (rc) break;
            const struct st_tensor *t = safetensors_find(st, e->string);
            char *want = util_path_join(dir, e->valuestring);
            if (!t || strcmp(t->file, want))
                rc = util_err(err, errlen, "%s: tensor \"%s\" is not in %s", index_path, e->string, e->valuestring);
            free(want);
        }
    }
    free(files);
    cJSON_Delete(root);
    if (rc) {
        safetensors_free(st);
        return -1;
    }
    *out = st;
    return 0;
}

int safetensors_open_dir(struct safetensors **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    char *index = util_path_join(dir, "model.safetensors.index.json");
    char *single = util_path_join(dir, "model.safetensors");
    int rc;
    if (access(index, F_OK) == 0) rc = open_index(out, dir, index, err, errlen);
    else if (access(single, F_OK) == 0) rc = safetensors_open_file(out, single, err, errlen);
    else rc = util_err(err, errlen, "%s: no model.safetensors or model.safetensors.index.json", dir);
    free(index);
    free(single);
    return rc;
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int safetensors_write(const char *path, const struct st_write_tensor *ts, int n, char *err, size_t errlen) {
    cJSON *hdr = cJSON_CreateObject();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(hdr, ts[i].name);
        cJSON_AddStringToObject(e, "dtype", st_dtype_name(ts[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        size_t numel = 1;
        for (int d = 0; d < ts[i].n_dims; d++) {
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ts[i].shape[d]));
            numel *= (size_t)ts[i].shape[d];
        }
        size_t nb = numel * st_dtype_size(ts[i].dtype);
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    char *h = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    if (!h) return util_err(err, errlen, "out of memory");
    size_t hl = strlen(h), padded = (hl + 7) & ~(size_t)7; /* data 8-byte aligned, as HF writes */
    size_t total = 8 + padded + off;
    unsigned char *buf = malloc(total);
    if (!buf) {
        free(h);
        return util_err(err, errlen, "out of memory");
    }
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, h, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    free(h);
    size_t at = 8 + padded;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < ts[i].n_dims; d++) numel *= (size_t)ts[i].shape[d];
        size_t nb = numel * st_dtype_size(ts[i].dtype);
        memcpy(buf + at, ts[i].data, nb);
        at += nb;
    }
    int rc = util_write_file(path, buf, total);
    free(buf);
    if (rc) return util_err(err, errlen, "%s: %s", path, strerror(errno));
    return 0;
}
