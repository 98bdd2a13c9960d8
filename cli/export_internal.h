/* export_internal.h: what `flashgen export` (cmd_export.c: choosing, compiling) hands its writer
 * (export_write.c: the C source and header in the layout of include/flashgen_export.h). */
#ifndef FG_EXPORT_INTERNAL_H
#define FG_EXPORT_INTERNAL_H

#include <stddef.h>

#include "fg_autotune.h"
#include "fg_runtime_internal.h"

/* The set being exported. */
typedef struct export_kernel {
  fg_variant v;
  char name[FG_VARIANT_NAME_MAX];
  fg_kernel_image img;
  char *err; /* compile error, malloc'd */
  int built;
} export_kernel;

typedef struct export_choice {
  char bucket[96];
  char variant[FG_VARIANT_NAME_MAX];
  char device[256];
} export_choice;

typedef struct export_set {
  export_kernel *k;
  int n, cap;
  export_choice *c;
  int nc, capc;
} export_set;

typedef struct export_info {
  const char *prefix;
  const char *mode_line;  /* how it was asked for, normalised (no paths) */
  char archs[128];        /* "sm_80, sm_90a" */
  char template_hash[17];
  int nvrtc_version;
  const char *tuned_on;   /* "" -> none */
  const char *fallbacks;
  int with_ptx;
} export_info;

/* NULL when kernel k's launch contract (plan, parameter block, entries in its PTX) can be
 * written, else why not (in why). */
const char *fg_export_check_contract(const export_kernel *k, char *why, size_t whylen);

/* Writes <dir>/<hname> and <dir>/<cname> (each through a temporary file and a rename), their
 * paths into hpath and cpath; 0, or -1 with the reason on stderr. */
int fg_export_write(const char *dir, const char *cname, const char *hname, const char *desc,
                    const export_info *in, const export_set *s, char *cpath, size_t clen,
                    char *hpath, size_t hlen);

#endif
