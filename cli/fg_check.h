/* fg_check.h: what the parts of `flashgen check` share: the options of a run, and the backward
 * cases (check_bwd.c), which cmd_check.c runs after the forward ones. */
#ifndef FG_CHECK_H
#define FG_CHECK_H
#include <stdint.h>

#include "fg_runtime_internal.h"

typedef struct fg_check_options {
  fg_context *ctx;       /* NULL with list: only list the cases */
  CUstream stream;
  const char *filter;    /* substring of the case names, or NULL */
  int quick, list, verbose, jobs;
  uint64_t seed;
} fg_check_options;

/* Runs (or with o->list prints) the backward cases that o selects, printing one line per case
 * and adding to *passed / *failed. Returns the number of cases selected. */
int fg_check_backward(const fg_check_options *o, int *passed, int *failed);
#endif
