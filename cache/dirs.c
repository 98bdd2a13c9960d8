/* dirs.c: where the cache lives (FLASHGEN_CACHE_DIR, XDG_CACHE_HOME, HOME) and the rules a
 * directory must meet before the cache is put in it: created 0700, a real directory (not a
 * symlink), owned by the caller, not group- or world-writable, writable. */
#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fg_cache_internal.h"

void fg_cache_warnf(char *warn, size_t len, const char *fmt, ...) {
  if (!warn || len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(warn, len, fmt, ap);
  va_end(ap);
}

static int join(char *buf, size_t len, const char *a, const char *b) {
  int n = snprintf(buf, len, "%s%s", a, b);
  return (n < 0 || (size_t)n >= len) ? -1 : 0;
}

int fg_cache_resolve_dir(const char *dir, char *buf, size_t len) {
  if (!buf || len == 0) return -1;
  if (dir && dir[0]) return join(buf, len, dir, "");
  const char *env = getenv("FLASHGEN_CACHE_DIR");
  if (env && env[0]) return join(buf, len, env, "");
  /* The XDG base directory spec says relative values are to be ignored. */
  env = getenv("XDG_CACHE_HOME");
  if (env && env[0] == '/') return join(buf, len, env, "/flashgen");
  env = getenv("HOME");
  if (!env || !env[0]) {
    struct passwd *pw = getpwuid(geteuid());
    env = pw ? pw->pw_dir : NULL;
  }
  if (!env || !env[0]) return -1;
  return join(buf, len, env, "/.cache/flashgen");
}

/* mkdir -p: missing parents and the leaf are created 0700 (the XDG spec asks for 0700). */
static int make_dirs(const char *dir, char *err, size_t errlen) {
  char tmp[PATH_MAX];
  if (join(tmp, sizeof tmp, dir, "") != 0) {
    snprintf(err, errlen, "path too long");
    return -1;
  }
  size_t n = strlen(tmp);
  while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
      return -1;
    }
    *p = '/';
  }
  if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "%s", strerror(errno));
    return -1;
  }
  /* The umask may have removed bits: the leaf is exactly 0700. */
  if (chmod(tmp, 0700) != 0) {
    snprintf(err, errlen, "chmod 0700: %s", strerror(errno));
    return -1;
  }
  return 0;
}

int fg_cache_prepare_dir(const char *dir, char *warn, size_t len) {
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) {
      fg_cache_warnf(warn, len,
                     "flashgen: cache directory %s cannot be examined (%s); set FLASHGEN_CACHE_DIR "
                     "to a private directory; compiling in memory",
                     dir, strerror(errno));
      return -1;
    }
    char err[PATH_MAX + 64];
    if (make_dirs(dir, err, sizeof err) != 0) {
      fg_cache_warnf(warn, len,
                     "flashgen: cannot create cache directory %s (%s); set FLASHGEN_CACHE_DIR to a "
                     "writable private directory; compiling in memory",
                     dir, err);
      return -1;
    }
    if (lstat(dir, &st) != 0) {
      fg_cache_warnf(warn, len,
                     "flashgen: cache directory %s vanished after it was created (%s); set "
                     "FLASHGEN_CACHE_DIR to a private directory; compiling in memory",
                     dir, strerror(errno));
      return -1;
    }
  }
  if (S_ISLNK(st.st_mode)) {
    fg_cache_warnf(warn, len,
                   "flashgen: cache directory %s is a symbolic link, refused; set "
                   "FLASHGEN_CACHE_DIR to the real directory (or replace the link with a directory "
                   "of mode 0700); compiling in memory",
                   dir);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    fg_cache_warnf(warn, len,
                   "flashgen: cache path %s exists and is not a directory; remove it or set "
                   "FLASHGEN_CACHE_DIR to a private directory; compiling in memory",
                   dir);
    return -1;
  }
  if (st.st_uid != geteuid()) {
    fg_cache_warnf(warn, len,
                   "flashgen: cache directory %s is owned by uid %ld, not by you (uid %ld), "
                   "refused; set FLASHGEN_CACHE_DIR to a directory you own; compiling in memory",
                   dir, (long)st.st_uid, (long)geteuid());
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    fg_cache_warnf(warn, len,
                   "flashgen: cache directory %s is %s-writable (mode %03o), refused: others could "
                   "plant kernels in it; run `chmod 700 %s` or set FLASHGEN_CACHE_DIR to a "
                   "private directory; compiling in memory",
                   dir, (st.st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st.st_mode & 0777),
                   dir);
    return -1;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    fg_cache_warnf(warn, len,
                   "flashgen: cache directory %s is not writable (%s); run `chmod 700 %s` or set "
                   "FLASHGEN_CACHE_DIR to a writable private directory; compiling in memory",
                   dir, strerror(errno), dir);
    return -1;
  }
  return 0;
}
