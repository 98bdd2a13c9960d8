/* build.c: render + compile in one step, the default kernel set, and well-known device limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_gen.h"
#include "fg_problem.h"

const fg_device_limits fg_limits_a100 = {"NVIDIA A100", 8, 0, 166912, 167936, 65536, 1024, 108};
const fg_device_limits fg_limits_h100 = {"NVIDIA H100", 9, 0, 232448, 233472, 65536, 1024, 132};
const fg_device_limits fg_limits_rtx4090 = {"NVIDIA GeForce RTX 4090", 8, 9, 101376, 102400, 65536,
                                            1024, 128};
static const fg_device_limits limits_rtx3090 = {"NVIDIA GeForce RTX 3090", 8, 6, 101376, 102400,
                                                65536, 1024, 82};

const fg_device_limits *fg_limits_for_arch(fg_arch a) {
  switch (a) {
  case FG_ARCH_SM80: return &fg_limits_a100;
  case FG_ARCH_SM86: return &limits_rtx3090;
  case FG_ARCH_SM89: return &fg_limits_rtx4090;
  default: return &fg_limits_h100;
  }
}

static char *dup_err(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  memcpy(d, s, n);
  return d;
}

int fg_generator_build(fg_generator *g, const fg_variant *v, fg_kernel_image *img, char **errlog) {
  char name[FG_VARIANT_NAME_MAX];
  if (errlog) *errlog = NULL;
  if (fg_variant_name(v, name, sizeof name) < 0) {
    if (errlog) *errlog = dup_err("variant has a field out of range");
    return -1;
  }
  char *src = NULL;
  fg_kernel_meta meta;
  char err[4096];
  if (fg_generator_render(g, v, &src, &meta, err, sizeof err)) {
    if (errlog) {
      char buf[4300];
      snprintf(buf, sizeof buf, "cannot render %s: %s", name, err);
      *errlog = dup_err(buf);
    }
    return -1;
  }
  int rc = fg_nvrtc_compile(src, name, v->arch, &meta, img, errlog);
  free(src);
  return rc;
}

int fg_generator_build_reference(fg_generator *g, fg_dtype dtype, int exact, fg_arch arch,
                                 fg_kernel_image *img, char **errlog) {
  char *src = NULL;
  fg_kernel_meta meta;
  char err[4096];
  if (errlog) *errlog = NULL;
  if (fg_generator_render_reference(g, dtype, exact, &src, &meta, err, sizeof err)) {
    if (errlog) *errlog = dup_err(err);
    return -1;
  }
  char name[64];
  snprintf(name, sizeof name, "ref_%s_%s", exact ? "f64" : "lowp", fg_dtype_name(dtype));
  int rc = fg_nvrtc_compile(src, name, arch, &meta, img, errlog);
  free(src);
  return rc;
}

int fg_default_variants(fg_arch arch, int with_kv_outer, fg_variant *out, int cap) {
  int n = 0;
  for (int d = 32; d <= 256; d += 8)
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int causal = 0; causal <= 1; causal++) {
        fg_variant lens[FG_BUILTIN_MAX];
        const int nl = fg_builtin_variants(d, (fg_dtype)dt, causal, arch, lens);
        for (int i = 0; i < nl; i++)
          if (n < cap) out[n++] = lens[i];
        fg_variant v = lens[0];
        if (with_kv_outer && v.loop != FG_LOOP_Q_OUTER) { /* the portable kernel stays in the set */
          if (n < cap) out[n++] = fg_portable_variant(d, (fg_dtype)dt, causal, arch);
        }
        if (with_kv_outer) {
          v.loop = FG_LOOP_KV_OUTER;
          v.stages = 1;
          v.warps = 4;
          v.br = 64;
          v.bc = d <= 128 ? 32 : 16;
          if (n < cap) out[n++] = v;
        }
      }
  return n;
}

int fg_default_backward_variants(fg_arch arch, fg_variant *out, int cap) {
  int n = 0;
  for (int d = 32; d <= 256; d += 8)
    for (int dt = FG_DTYPE_F16; dt <= FG_DTYPE_BF16; dt++)
      for (int causal = 0; causal <= 1; causal++)
        if (n < cap) out[n++] = fg_builtin_backward_variant(d, (fg_dtype)dt, causal, arch);
  return n;
}
