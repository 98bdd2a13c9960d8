/* cmd_cache.c: `flashgen cache ls | stats | verify | clear | tuning`: thin wrappers over the
 * cache library (cache/fg_cache.h) for people and scripts. */
#include <stdio.h>
#include <string.h>

#include "fg_cache.h"
#include "fg_cli.h"

static void cache_usage(FILE *f) {
  fprintf(f,
          "usage: flashgen cache [--dir DIR] <action>\n\n"
          "The kernel cache: compiled kernels and tuning records in one SQLite database.\n\n"
          "actions:\n"
          "  ls       list the compiled kernels (variant, arch, NVRTC version, bytes, created)\n"
          "  stats    database path, size on disk, schema version, counts\n"
          "  verify   check every kernel (checksum, size, entry point, readable) and the database\n"
          "           file; list each bad entry; exit 1 if any entry is bad or the file is damaged\n"
          "  clear    delete every kernel and tuning record (asks nothing) and say what went;\n"
          "           a damaged database is emptied and rebuilt\n"
          "  tuning   list the tuning records (device, bucket, winner, TFLOP/s, candidates)\n\n"
          "options:\n"
          "  --dir DIR    the cache directory (default $FLASHGEN_CACHE_DIR, else\n"
          "               $XDG_CACHE_HOME/flashgen, else ~/.cache/flashgen)\n"
          "  -h, --help   this text\n\n"
          "exit status: 0 success; 1 failure (the cache cannot be opened or read, bad entries\n"
          "found by verify); 2 bad usage.\n");
}

int fg_cmd_cache(int argc, char **argv) {
  const char *dir = NULL, *action = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      cache_usage(stdout);
      return 0;
    } else if (strcmp(a, "--dir") == 0) {
      if (i + 1 >= argc || !argv[i + 1][0]) {
        fprintf(stderr, "flashgen cache: --dir needs a directory\n");
        return 2;
      }
      dir = argv[++i];
    } else if (strncmp(a, "--dir=", 6) == 0 && a[6]) {
      dir = a + 6;
    } else if (a[0] == '-') {
      fprintf(stderr, "flashgen cache: unknown option '%s' (flashgen cache --help)\n", a);
      return 2;
    } else if (action) {
      fprintf(stderr, "flashgen cache: one action at a time ('%s' and '%s')\n", action, a);
      return 2;
    } else {
      action = a;
    }
  }
  static const char *actions[] = {"ls", "stats", "verify", "clear", "tuning"};
  int known = 0;
  for (size_t i = 0; action && i < sizeof actions / sizeof actions[0]; i++)
    known |= strcmp(action, actions[i]) == 0;
  if (!known) {
    if (action) fprintf(stderr, "flashgen cache: unknown action '%s'\n\n", action);
    cache_usage(stderr);
    return 2;
  }

  char resolved[4096], warn[1024] = "";
  if (fg_cache_resolve_dir_why(dir, resolved, sizeof resolved, warn, sizeof warn) != 0) {
    fprintf(stderr, "flashgen cache: %s (or give --dir)\n", warn);
    return 1;
  }
  fg_cache *c = fg_cache_open(resolved, warn, sizeof warn);
  if (!c) {
    fprintf(stderr, "flashgen cache: cannot use the cache in %s: %s\n", resolved,
            warn[0] ? warn : "no reason given");
    return 1;
  }
  if (warn[0]) fprintf(stderr, "flashgen cache: warning: %s\n", warn);

  int rc = 0;
  if (strcmp(action, "ls") == 0) {
    int n = fg_cache_ls(c, stdout);
    if (n < 0) {
      fprintf(stderr, "flashgen cache: cannot list %s\n", fg_cache_path(c));
      rc = 1;
    } else {
      printf("%d kernel%s in %s\n", n, n == 1 ? "" : "s", fg_cache_path(c));
    }
  } else if (strcmp(action, "stats") == 0) {
    if (fg_cache_stats(c, stdout) != 0) {
      fprintf(stderr, "flashgen cache: cannot read %s\n", fg_cache_path(c));
      rc = 1;
    }
  } else if (strcmp(action, "verify") == 0) {
    int bad = fg_cache_verify(c, stdout);
    if (bad < 0) {
      fprintf(stderr, "flashgen cache: cannot read %s to the end\n", fg_cache_path(c));
      rc = 1;
    } else if (bad > 0) {
      rc = 1;
    }
  } else if (strcmp(action, "clear") == 0) {
    fg_cache_counts before;
    int counted = fg_cache_count(c, &before) == 0; /* fails on a damaged database */
    char msg[1536];
    if (fg_cache_clear(c, msg, sizeof msg) != 0) {
      fprintf(stderr, "flashgen cache: %s\n", msg);
      rc = 1;
    } else if (msg[0]) {
      printf("%s; every kernel and tuning record in it is gone\n", msg);
    } else if (counted) {
      printf("removed %lld kernel%s (%lld bytes of cubin and PTX) and %lld tuning record%s "
             "(%lld candidates, %lld device%s) from %s\n",
             before.kernels, before.kernels == 1 ? "" : "s", before.kernel_bytes,
             before.tuning_records, before.tuning_records == 1 ? "" : "s", before.candidates,
             before.devices, before.devices == 1 ? "" : "s", fg_cache_path(c));
    } else {
      printf("removed every kernel and tuning record from %s\n", fg_cache_path(c));
    }
  } else {
    int n = fg_cache_list_tuning(c, stdout);
    if (n < 0) {
      fprintf(stderr, "flashgen cache: cannot list the tuning records of %s\n", fg_cache_path(c));
      rc = 1;
    } else {
      printf("%d tuning record%s\n", n, n == 1 ? "" : "s");
    }
  }
  fg_cache_close(c);
  return rc;
}
