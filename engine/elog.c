/* elog: the engine's log lines, to a sink the daemon sets or to stderr. */
#include "engine/elog.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/util.h"

static elog_sink_fn sink;
static bool sink_tty_progress = true;

void elog_set_sink(elog_sink_fn fn, bool tty_progress) {
    sink = fn;
    sink_tty_progress = fn ? tty_progress : true;
}

void elog(const char *level, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (sink) {
        sink(level, msg);
        return;
    }
    bool plain = !strcmp(level, "info");
    fprintf(stderr, "duoserve: %s%s%s\n", plain ? "" : level, plain ? "" : ": ", msg);
}

void elog_progress_begin(struct elog_progress *p, const char *what, int total) {
    double now = util_now();
    *p = (struct elog_progress){.what = what, .total = total, .t0 = now, .t_last = now};
    p->inplace = sink_tty_progress && isatty(STDERR_FILENO);
}

bool elog_progress_due(const struct elog_progress *p, int done, double now) {
    if (p->total <= 0 || done >= p->total) return false; /* the step's own closing line says it is done */
    int tenth = (int)((long long)done * 10 / p->total);
    double since = now - p->t_last;
    return (tenth > p->last_tenth && since >= ELOG_PROGRESS_MIN_S) || since >= ELOG_PROGRESS_MAX_S;
}

void elog_progress_step(struct elog_progress *p, int done) {
    if (p->inplace) {
        fprintf(stderr, "\rduoserve: %s %d/%d", p->what, done, p->total);
        p->drawn = true;
        return;
    }
    double now = util_now();
    if (!elog_progress_due(p, done, now)) return;
    p->t_last = now;
    p->last_tenth = (int)((long long)done * 10 / p->total);
    elog("info", "%s %d/%d (%d%%) after %.0f s", p->what, done, p->total, (int)((long long)done * 100 / p->total),
         now - p->t0);
}

void elog_progress_end(struct elog_progress *p) {
    if (p->inplace && p->drawn) fprintf(stderr, "\n");
    p->inplace = false;
}
