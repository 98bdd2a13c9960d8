/* problems.c: the tuning problem set: the problem syntax of `flashgen tune` ("d=128,dtype=bf16,
 * causal=1,n=4096[,pass=bwd]"), problem files, the embedded default set (the ANCHORS.md grid,
 * forward and backward), and the arithmetic of a tuning run that needs no GPU (FLOP count,
 * median, L2 rotation). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fg_autotune.h"

/* Parses a positive integer with an optional k (x1024) suffix; 0 on success. */
static int parse_count(const char *s, int64_t *out) {
  if (!isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || v <= 0) return -1;
  if (*end == 'k' || *end == 'K') {
    if (v > INT64_MAX / 1024) return -1;
    v *= 1024;
    end++;
  }
  if (*end) return -1;
  *out = v;
  return 0;
}

static int parse_bool(const char *s, int *out) {
  static const char *yes[] = {"1", "yes", "true", "on"}, *no[] = {"0", "no", "false", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, yes[i]) == 0) return *out = 1, 0;
    if (strcmp(s, no[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

int fg_tune_problem_parse(const char *s, fg_tune_problem *out, char *err, size_t errlen) {
  enum { K_D, K_N, K_DTYPE, K_CAUSAL, K_BATCH, K_HEADS, K_PASS, K_COUNT };
  static const char *names[K_COUNT] = {"d", "n", "dtype", "causal", "batch", "heads", "pass"};
  int seen[K_COUNT] = {0};
  fg_tune_problem p = {0, FG_DTYPE_BF16, 0, 0, 0, 0, FG_PASS_FWD};
  char buf[512];
  if (!s || !*s) {
    snprintf(err, errlen, "empty problem; expected e.g. d=128,dtype=bf16,causal=1,n=4096");
    return -1;
  }
  if (strlen(s) >= sizeof buf) {
    snprintf(err, errlen, "problem '%.40s...' is too long", s);
    return -1;
  }
  strcpy(buf, s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*tok)) tok++;
    char *eq = strchr(tok, '=');
    if (!eq) {
      snprintf(err, errlen, "in problem '%s': '%s' is not key=value", s, tok);
      return -1;
    }
    *eq = '\0';
    char *key = tok, *val = eq + 1;
    for (char *e = eq - 1; e >= key && isspace((unsigned char)*e); e--) *e = '\0';
    while (isspace((unsigned char)*val)) val++;
    for (char *e = val + strlen(val); e > val && isspace((unsigned char)e[-1]);) *--e = '\0';
    int k;
    if (strcmp(key, "d") == 0 || strcmp(key, "head_dim") == 0) k = K_D;
    else if (strcmp(key, "n") == 0 || strcmp(key, "N") == 0 || strcmp(key, "seqlen") == 0) k = K_N;
    else if (strcmp(key, "dtype") == 0) k = K_DTYPE;
    else if (strcmp(key, "causal") == 0) k = K_CAUSAL;
    else if (strcmp(key, "batch") == 0 || strcmp(key, "b") == 0 || strcmp(key, "B") == 0) k = K_BATCH;
    else if (strcmp(key, "heads") == 0 || strcmp(key, "h") == 0 || strcmp(key, "H") == 0) k = K_HEADS;
    else if (strcmp(key, "pass") == 0 || strcmp(key, "bwd") == 0) k = K_PASS;
    else {
      snprintf(err, errlen,
               "in problem '%s': unknown key '%s' (keys: d, n, dtype, causal, batch, heads, pass)",
               s, key);
      return -1;
    }
    if (seen[k]++) {
      snprintf(err, errlen, "in problem '%s': %s given twice", s, names[k]);
      return -1;
    }
    int64_t v = 0;
    switch (k) {
    case K_D:
      if (parse_count(val, &v) || v < 32 || v > 256 || v % 8) {
        snprintf(err, errlen, "in problem '%s': d=%s: head dimension must be a multiple of 8 from "
                 "32 to 256", s, val);
        return -1;
      }
      p.d = (int)v;
      break;
    case K_N:
      if (parse_count(val, &v) || v > (1 << 20)) {
        snprintf(err, errlen, "in problem '%s': n=%s: sequence length must be an integer from 1 "
                 "to 1048576 (\"4k\" = 4096)", s, val);
        return -1;
      }
      p.n = v;
      break;
    case K_DTYPE:
      if (fg_dtype_parse(val, &p.dtype) != 0) {
        snprintf(err, errlen, "in problem '%s': dtype=%s: expected f16 or bf16", s, val);
        return -1;
      }
      break;
    case K_CAUSAL:
      if (parse_bool(val, &p.causal)) {
        snprintf(err, errlen, "in problem '%s': causal=%s: expected 0 or 1", s, val);
        return -1;
      }
      break;
    case K_PASS:
      if (strcmp(key, "bwd") == 0) { /* bwd=1: the shorthand of pass=bwd */
        int b;
        if (parse_bool(val, &b)) {
          snprintf(err, errlen, "in problem '%s': bwd=%s: expected 0 or 1 (or pass=fwd|bwd)", s,
                   val);
          return -1;
        }
        p.pass = b ? FG_PASS_BWD : FG_PASS_FWD;
      } else if (strcmp(val, "fwd") == 0 || strcmp(val, "forward") == 0) {
        p.pass = FG_PASS_FWD;
      } else if (strcmp(val, "bwd") == 0 || strcmp(val, "backward") == 0) {
        p.pass = FG_PASS_BWD;
      } else {
        snprintf(err, errlen, "in problem '%s': pass=%s: expected fwd or bwd", s, val);
        return -1;
      }
      break;
    case K_BATCH:
    case K_HEADS:
      if (parse_count(val, &v) || v > 65536) {
        snprintf(err, errlen, "in problem '%s': %s=%s: expected an integer from 1 to 65536", s,
                 names[k], val);
        return -1;
      }
      if (k == K_BATCH) p.batch = v;
      else p.heads = v;
      break;
    }
  }
  if (!seen[K_D] || !seen[K_N]) {
    snprintf(err, errlen, "in problem '%s': %s missing (e.g. d=128,dtype=bf16,causal=1,n=4096)",
             s, !seen[K_D] ? "d=" : "n=");
    return -1;
  }
  if (!p.batch) p.batch = p.n >= FG_TUNE_TOKENS ? 1 : FG_TUNE_TOKENS / p.n;
  if (!p.heads) p.heads = p.d >= FG_TUNE_HIDDEN ? 1 : FG_TUNE_HIDDEN / p.d;
  /* Keep one problem's tensors addressable and allocatable: 2^31 elements (4 GiB) each. */
  if ((double)p.batch * (double)p.heads * (double)p.n * p.d > 2147483648.0) {
    snprintf(err, errlen, "in problem '%s': batch*heads*n*d = %.3g elements per tensor; at most "
             "2^31 can be tuned", s, (double)p.batch * (double)p.heads * (double)p.n * p.d);
    return -1;
  }
  *out = p;
  return 0;
}

int fg_tune_problem_format(const fg_tune_problem *p, char *buf, size_t len) {
  return snprintf(buf, len, "d=%d,dtype=%s,causal=%d,n=%lld,batch=%lld,heads=%lld%s", p->d,
                  fg_dtype_name(p->dtype), p->causal ? 1 : 0, (long long)p->n,
                  (long long)p->batch, (long long)p->heads,
                  p->pass == FG_PASS_BWD ? ",pass=bwd" : "");
}

fg_problem fg_tune_problem_key(const fg_tune_problem *p) {
  return fg_problem_make(p->pass, p->d, p->dtype, p->causal, p->n);
}

int fg_tune_default_problems(int quick, fg_tune_problem *out, int cap) {
  static const int ds[] = {64, 128};
  /* The backward's buckets are a subset: one run costs 2.5 times the forward's FLOPs at about
   * half its rate, and 16k alone would cost four times 1k and 4k together; the other buckets
   * take the nearest of 1k and 4k (fg_dispatch_choose_pass). */
  static const int64_t fwd_ns[] = {512, 1024, 2048, 4096, 8192, 16384}, fwd_quick[] = {1024, 4096};
  static const int64_t bwd_ns[] = {1024, 4096}, bwd_quick[] = {4096};
  int count = 0;
  for (int pass = FG_PASS_FWD; pass <= FG_PASS_BWD; pass++) {
    const int64_t *nv = pass == FG_PASS_FWD ? (quick ? fwd_quick : fwd_ns)
                                            : (quick ? bwd_quick : bwd_ns);
    const int nn = pass == FG_PASS_FWD ? (quick ? 2 : 6) : (quick ? 1 : 2);
    for (int dt = quick ? FG_DTYPE_BF16 : FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int di = 0; di < 2; di++)
        for (int causal = 0; causal <= 1; causal++)
          for (int i = 0; i < nn; i++) {
            fg_tune_problem p = {ds[di], (fg_dtype)dt, causal, FG_TUNE_TOKENS / nv[i],
                                 FG_TUNE_HIDDEN / ds[di], nv[i], (fg_pass)pass};
            if (count < cap) out[count] = p;
            count++;
          }
  }
  return count < cap ? count : cap;
}

int fg_tune_problems_read(const char *path, fg_tune_problem *out, int cap, char *err,
                          size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  char line[1024], msg[768];
  int n = 0, lineno = 0, rc = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n' && !feof(f)) {
      snprintf(err, errlen, "%s:%d: line too long", path, lineno);
      rc = -1;
      break;
    }
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *s = line;
    while (isspace((unsigned char)*s)) s++;
    for (char *e = s + strlen(s); e > s && isspace((unsigned char)e[-1]);) *--e = '\0';
    if (!*s) continue;
    if (n >= cap) {
      snprintf(err, errlen, "%s:%d: more than %d problems", path, lineno, cap);
      rc = -1;
      break;
    }
    if (fg_tune_problem_parse(s, &out[n], msg, sizeof msg) != 0) {
      snprintf(err, errlen, "%s:%d: %s", path, lineno, msg);
      rc = -1;
      break;
    }
    n++;
  }
  if (rc == 0 && ferror(f)) {
    snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
    rc = -1;
  }
  fclose(f);
  if (rc == 0 && n == 0) {
    snprintf(err, errlen, "%s: no problems in the file", path);
    rc = -1;
  }
  return rc ? -1 : n;
}

double fg_tune_flops(const fg_tune_problem *p) {
  double f = 4.0 * (double)p->batch * (double)p->heads * (double)p->n * (double)p->n * p->d;
  if (p->pass == FG_PASS_BWD) f *= 2.5;
  return p->causal ? f / 2 : f;
}

double fg_tune_tflops(const fg_tune_problem *p, double ms) {
  return ms > 0 ? fg_tune_flops(p) / (ms * 1e-3) / 1e12 : 0.0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double fg_tune_median(const double *x, int n) {
  if (n <= 0) return NAN;
  double tmp[64], *s = n <= 64 ? tmp : malloc(sizeof *s * (size_t)n);
  if (!s) return NAN;
  memcpy(s, x, sizeof *s * (size_t)n);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  if (s != tmp) free(s);
  return m;
}

int fg_tune_finalists(const double *ms, const int *eligible, int n, double within, int max,
                      int *out) {
  double best = 0;
  for (int c = 0; c < n; c++)
    if (eligible[c] && ms[c] > 0 && (best == 0 || ms[c] < best)) best = ms[c];
  int nf = 0;
  for (int c = 0; c < n && max > 0; c++) {
    if (!eligible[c] || ms[c] <= 0 || ms[c] > within * best) continue;
    if (nf < max) {
      out[nf++] = c;
      continue;
    }
    int worst = 0; /* full: the slowest finalist gives way to a faster candidate */
    for (int i = 1; i < nf; i++)
      if (ms[out[i]] > ms[out[worst]]) worst = i;
    if (ms[c] < ms[out[worst]]) {
      for (int i = worst; i + 1 < nf; i++) out[i] = out[i + 1]; /* keep index order */
      out[nf - 1] = c;
    }
  }
  return nf;
}

int fg_tune_pick_winner(const double *ms, const int *eligible, int n, int prev, double within) {
  int win = -1;
  for (int c = 0; c < n; c++)
    if (eligible[c] && ms[c] > 0 && (win < 0 || ms[c] < ms[win])) win = c;
  if (win >= 0 && prev >= 0 && prev < n && prev != win && eligible[prev] && ms[prev] > 0 &&
      ms[prev] <= within * ms[win])
    win = prev;
  return win;
}

int fg_tune_rotation_sets(size_t bytes_per_set, size_t l2_bytes) {
  if (bytes_per_set == 0) return 1;
  size_t sets = 2 * l2_bytes / bytes_per_set + 1; /* smallest with sets * bytes > 2 * L2 */
  return sets < 1 ? 1 : sets > 8 ? 8 : (int)sets;
}
