/* Helpers shared by the cmocka tests: fixture paths, temporary folders, file copies.
 * Tests run from the repository root; ../shared (or $DUO_SHARED) holds the shared fixtures. */
#ifndef DUO_TEST_COMMON_H
#define DUO_TEST_COMMON_H

#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static inline const char *test_shared_dir(void) {
    const char *s = getenv("DUO_SHARED");
    return s && *s ? s : "../shared";
}

/* Writes the path of a file under the shared folder; returns 0 if it exists. */
static inline int test_shared_path(char *out, size_t n, const char *rel) {
    snprintf(out, n, "%s/%s", test_shared_dir(), rel);
    return access(out, R_OK) == 0 ? 0 : -1;
}

/* Skips the current test with a visible reason when a shared fixture is absent. */
#define TEST_REQUIRE_SHARED(buf, rel)                                                       \
    do {                                                                                    \
        if (test_shared_path(buf, sizeof buf, rel) != 0) {                                  \
            print_message("SKIP: %s not found (set DUO_SHARED or provide ../shared)\n", buf); \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

static inline char *test_mkdtemp(void) {
    char *t = strdup("/tmp/duoserve-test-XXXXXX");
    assert_non_null(t);
    assert_non_null(mkdtemp(t));
    return t;
}

static inline void test_rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p;
        if (asprintf(&p, "%s/%s", dir, e->d_name) < 0) break;
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) test_rm_rf(p);
        else unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Copies src to dst, keeping only the first `limit` bytes when limit >= 0. */
static inline void test_copy_file(const char *src, const char *dst, long limit) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    long done = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (limit >= 0 && done + (long)n > limit) n = (size_t)(limit - done);
        fwrite(buf, 1, n, out);
        done += (long)n;
        if (limit >= 0 && done >= limit) break;
    }
    fclose(in);
    fclose(out);
}

static inline void test_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#endif
