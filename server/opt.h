/* opt: command-line flags as tables, with one parse rule, one error wording and one help
 * format. The engine's flags are one table (opt_engine, fields of struct engine_config)
 * that `serve` and `generate` share, so their ranges and help cannot drift apart. Integer
 * ranges print as integers, sizes with binary units. Main thread only. */
#ifndef DUO_OPT_H
#define DUO_OPT_H

#include <stddef.h>
#include <stdio.h>

enum opt_type {
    OPT_STR,    // const char *
    OPT_CHOICE, // const char *, one of the '|'-separated words of arg
    OPT_INT,    // int in [lo, hi]
    OPT_DOUBLE, // double in [lo, hi]
    OPT_FLOAT,  // float in [lo, hi]
    OPT_BYTES,  // size_t in [lo, hi]: "4096", "512MiB", "4G"
    OPT_FLAG,   // bool, no value
    OPT_BOOL,   // bool: bare is true, else =true|false|1|0 (an arg "[=BOOL]" prints unspaced)
    OPT_BOOL_NOT, // an OPT_BOOL stored negated (--enable-x over a field no_x that defaults to false)
    OPT_OTHER,  // parsed by the caller; the table holds its help
};

struct opt {
    const char *name;  // long flag without "--"; also the --config key (with '-' or '_')
    const char *alias; // another spelling with its dashes ("-m", "--prefill-chunk") or NULL
    enum opt_type type;
    size_t off;        // offset of the field in the table's struct
    double lo, hi;     // range of a number
    const char *arg, *help;
};

extern const struct opt opt_engine[];
extern const size_t opt_engine_n;

/* The entry named by a flag's name ("max-model-len", "max_model_len"), or NULL. */
const struct opt *opt_find(const struct opt *t, size_t n, const char *name);
/* The entry whose alias is arg ("-m"), or NULL. */
const struct opt *opt_find_alias(const struct opt *t, size_t n, const char *arg);
/* A long option "--name" or "--name=value": its name into name[cap] (empty when arg is not one,
 * or the name does not fit, so that no entry matches) and its value, or NULL without "=". */
const char *opt_split(const char *arg, char *name, size_t cap);

/* Sets op's field in base from the text v (NULL for an OPT_FLAG or a bare OPT_BOOL). Returns 0,
 * or -1 with a one-line message in err ("--max-model-len: \"abc\" is not an integer in [1, 16777216]"). */
int opt_set(void *base, const struct opt *op, const char *v, char *err, size_t errlen);

/* One help line an entry. */
void opt_usage(FILE *f, const struct opt *t, size_t n);

/* "8MiB", "256M", "1G", "4096" -> bytes. Returns 0 or -1. */
int opt_parse_bytes(const char *v, double *out);

#endif
