/* elog: the engine's log lines (model loading, the KV plan, device fallbacks, CUDA errors).
 * By default a line goes to stderr as "duoserve: message" ("duoserve: warning: message" above
 * info); the daemon hands every line to its own logger instead (elog_set_sink), so that
 * --log-format json holds for all of them. elog_set_sink is called once at start-up, before
 * any other thread logs; elog itself may be called from any thread. */
#ifndef DUO_ELOG_H
#define DUO_ELOG_H

#include <stdbool.h>

/* level: "info", "warning" or "error"; msg: one line, no newline. */
typedef void (*elog_sink_fn)(const char *level, const char *msg);

/* fn NULL restores the default. tty_progress: progress may redraw one line in place (only
 * honoured while stderr is a terminal); otherwise progress comes as periodic log lines. */
void elog_set_sink(elog_sink_fn fn, bool tty_progress);

void elog(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Progress of a long step done in `total` parts (loading the layers): on a terminal a line
 * redrawn in place, else a log line when a tenth more is done and ELOG_PROGRESS_MIN_S have
 * passed since the last line, or ELOG_PROGRESS_MAX_S have passed (so a fast load prints
 * nothing and a slow one shows it is alive). One thread drives one progress. */
#define ELOG_PROGRESS_MIN_S 2.0
#define ELOG_PROGRESS_MAX_S 10.0
struct elog_progress {
    const char *what; // "layers loaded:", followed by " 3/32"
    int total;
    double t0, t_last; // start, last line (seconds, util_now)
    int last_tenth;    // tenths done at the last line
    bool inplace, drawn;
};
void elog_progress_begin(struct elog_progress *p, const char *what, int total);
void elog_progress_step(struct elog_progress *p, int done);
void elog_progress_end(struct elog_progress *p);
/* The policy of elog_progress_step without the clock: whether a line is due at `done` parts
 * `now` seconds (util_now) into the step. */
bool elog_progress_due(const struct elog_progress *p, int done, double now);

#endif
