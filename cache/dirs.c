/* dirs.c: where the cache lives (FLASHGEN_CACHE_DIR, XDG_CACHE_HOME, HOME), the form of that
 * path (absolute, no trailing slashes, short enough for SQLite) and the rules a directory must
 * meet before the cache is put in it: created 0700, a real directory (not a symlink), owned by
 * the caller, not group- or world-writable, writable. */
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

/* The longest cache directory the database path can be built on: SQLite's Unix VFS refuses a
 * file name longer than its mxPathname (512) less the 8 bytes of its "-journal" suffix, and
 * the directory is followed by "/flashgen.sqlite3". */
static size_t dir_max(void) {
  sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
  size_t name_max = vfs && vfs->mxPathname > 8 ? (size_t)vfs->mxPathname - 8 : 504;
  if (name_max > PATH_MAX - 1) name_max = PATH_MAX - 1;
  return name_max - (sizeof "/" FG_CACHE_DB_NAME - 1);
}

/* "dir/", "dir//", "dir/." and "dir/./" all name dir. Without this lstat("link/") would follow
 * a symlink the directory rules refuse. "/" stays "/". */
static void strip_trailing(char *p) {
  size_t n = strlen(p);
  for (;;) {
    if (n > 1 && p[n - 1] == '/')
      n--;
    else if (n > 2 && p[n - 1] == '.' && p[n - 2] == '/')
      n -= 2;
    else
      break;
    p[n] = '\0';
  }
}

int fg_cache_resolve_dir_why(const char *dir, char *buf, size_t len, char *why, size_t whylen) {
  if (why && whylen) why[0] = '\0';
  if (!buf || len == 0) return -1;
  const char *base = NULL, *tail = "", *from = "given";
  const char *env = getenv("FLASHGEN_CACHE_DIR");
  if (dir && dir[0]) {
    base = dir;
  } else if (env && env[0]) {
    base = env;
    from = "from FLASHGEN_CACHE_DIR";
  } else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') {
    /* The XDG base directory spec says relative values are to be ignored. */
    base = env;
    tail = "/flashgen";
    from = "from XDG_CACHE_HOME";
  } else {
    env = getenv("HOME");
    from = "from HOME";
    if (!env || !env[0]) {
      struct passwd *pw = getpwuid(geteuid());
      env = pw ? pw->pw_dir : NULL;
      from = "from your home directory";
    }
    if (!env || !env[0]) {
      fg_cache_warnf(why, whylen,
                     "no cache directory: neither FLASHGEN_CACHE_DIR nor HOME is set; set "
                     "FLASHGEN_CACHE_DIR to a private directory");
      return -1;
    }
    base = env;
    tail = "/.cache/flashgen";
  }
  /* A relative path is made absolute. SQLite (built with URI file names on, as Debian's is)
   * reads a file name that starts with "file:" as a URI whatever the open flags say, so
   * FLASHGEN_CACHE_DIR='file:/x/victim.db#' would open /x/victim.db; an absolute path is always
   * a plain file name. Without a current directory, "./" does the same. */
  char cwd[PATH_MAX];
  const char *pre = "";
  if (base[0] != '/') pre = getcwd(cwd, sizeof cwd) ? cwd : ".";
  size_t need = strlen(pre) + (pre[0] ? 1 : 0) + strlen(base) + strlen(tail);
  char *full = malloc(need + 1);
  if (!full) {
    fg_cache_warnf(why, whylen, "out of memory resolving the cache directory");
    return -1;
  }
  snprintf(full, need + 1, "%s%s%s%s", pre, pre[0] ? "/" : "", base, tail);
  strip_trailing(full);
  size_t n = strlen(full), limit = dir_max();
  if (limit > len - 1) limit = len - 1;
  if (n > limit) {
    fg_cache_warnf(why, whylen,
                   "the cache directory %s (%.48s...) is too long: %zu bytes, the limit is %zu "
                   "bytes (the database path must fit SQLite's file names); set "
                   "FLASHGEN_CACHE_DIR to a shorter private directory",
                   from, full, n, limit);
    free(full);
    return -1;
  }
  memcpy(buf, full, n + 1);
  free(full);
  return 0;
}

int fg_cache_resolve_dir(const char *dir, char *buf, size_t len) {
  return fg_cache_resolve_dir_why(dir, buf, len, NULL, 0);
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
