/* cuda_driver.c: loads the CUDA driver (libcuda.so.1) with dlopen, resolves the entry points of
 * fg_cuda_api by name, and turns driver results into names, messages and fg_status codes. Also
 * the driver report of `flashgen info`. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fg_cuda.h"

fg_cuda_api fg_cu;

/* One entry point: its member in fg_cu, the symbols to try in order, whether it is required. */
typedef struct fg_cuda_sym {
  size_t offset;
  const char *names[3];
  int required;
} fg_cuda_sym;

#define FG_SYM(member, req, ...) {offsetof(fg_cuda_api, member), {__VA_ARGS__}, req}
static const fg_cuda_sym fg_cuda_syms[] = {
    FG_SYM(cuInit, 1, "cuInit"),
    FG_SYM(cuDriverGetVersion, 1, "cuDriverGetVersion"),
    FG_SYM(cuDeviceGetCount, 1, "cuDeviceGetCount"),
    FG_SYM(cuDeviceGet, 1, "cuDeviceGet"),
    FG_SYM(cuDeviceGetName, 1, "cuDeviceGetName"),
    FG_SYM(cuDeviceGetAttribute, 1, "cuDeviceGetAttribute"),
    FG_SYM(cuDeviceTotalMem, 1, "cuDeviceTotalMem_v2"),
    FG_SYM(cuDevicePrimaryCtxRetain, 1, "cuDevicePrimaryCtxRetain"),
    FG_SYM(cuDevicePrimaryCtxRelease, 1, "cuDevicePrimaryCtxRelease_v2",
           "cuDevicePrimaryCtxRelease"),
    FG_SYM(cuCtxPushCurrent, 1, "cuCtxPushCurrent_v2"),
    FG_SYM(cuCtxPopCurrent, 1, "cuCtxPopCurrent_v2"),
    FG_SYM(cuCtxGetCurrent, 1, "cuCtxGetCurrent"),
    FG_SYM(cuCtxSynchronize, 1, "cuCtxSynchronize"),
    FG_SYM(cuModuleLoadDataEx, 1, "cuModuleLoadDataEx"),
    FG_SYM(cuModuleGetFunction, 1, "cuModuleGetFunction"),
    FG_SYM(cuModuleUnload, 1, "cuModuleUnload"),
    FG_SYM(cuFuncSetAttribute, 1, "cuFuncSetAttribute"),
    FG_SYM(cuFuncGetAttribute, 1, "cuFuncGetAttribute"),
    FG_SYM(cuLaunchKernel, 1, "cuLaunchKernel"),
    FG_SYM(cuPointerGetAttribute, 1, "cuPointerGetAttribute"),
    FG_SYM(cuPointerGetAttributes, 0, "cuPointerGetAttributes"),
    FG_SYM(cuMemAlloc, 1, "cuMemAlloc_v2"),
    FG_SYM(cuMemFree, 1, "cuMemFree_v2"),
    FG_SYM(cuMemAllocAsync, 0, "cuMemAllocAsync"),
    FG_SYM(cuMemFreeAsync, 0, "cuMemFreeAsync"),
    FG_SYM(cuMemPoolCreate, 0, "cuMemPoolCreate"),
    FG_SYM(cuMemPoolDestroy, 0, "cuMemPoolDestroy"),
    FG_SYM(cuMemPoolSetAttribute, 0, "cuMemPoolSetAttribute"),
    FG_SYM(cuMemAllocFromPoolAsync, 0, "cuMemAllocFromPoolAsync"),
    FG_SYM(cuMemAllocHost, 0, "cuMemAllocHost_v2"),
    FG_SYM(cuMemFreeHost, 0, "cuMemFreeHost"),
    FG_SYM(cuMemGetInfo, 1, "cuMemGetInfo_v2"),
    FG_SYM(cuMemcpyHtoD, 1, "cuMemcpyHtoD_v2"),
    FG_SYM(cuMemcpyDtoH, 1, "cuMemcpyDtoH_v2"),
    FG_SYM(cuMemcpyHtoDAsync, 1, "cuMemcpyHtoDAsync_v2"),
    FG_SYM(cuMemcpyDtoHAsync, 1, "cuMemcpyDtoHAsync_v2"),
    FG_SYM(cuMemsetD8, 1, "cuMemsetD8_v2"),
    FG_SYM(cuMemsetD16, 1, "cuMemsetD16_v2"),
    FG_SYM(cuMemsetD32, 1, "cuMemsetD32_v2"),
    FG_SYM(cuMemsetD32Async, 1, "cuMemsetD32Async"),
    FG_SYM(cuStreamCreate, 1, "cuStreamCreate"),
    FG_SYM(cuStreamDestroy, 1, "cuStreamDestroy_v2"),
    FG_SYM(cuStreamSynchronize, 1, "cuStreamSynchronize"),
    FG_SYM(cuEventCreate, 1, "cuEventCreate"),
    FG_SYM(cuEventRecord, 1, "cuEventRecord"),
    FG_SYM(cuEventSynchronize, 1, "cuEventSynchronize"),
    FG_SYM(cuEventElapsedTime, 1, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    FG_SYM(cuEventDestroy, 1, "cuEventDestroy_v2"),
    FG_SYM(cuTensorMapEncodeTiled, 0, "cuTensorMapEncodeTiled"),
    FG_SYM(cuGetErrorName, 1, "cuGetErrorName"),
    FG_SYM(cuGetErrorString, 1, "cuGetErrorString"),
};
#undef FG_SYM
#define FG_NSYMS (sizeof fg_cuda_syms / sizeof fg_cuda_syms[0])

/* Where libcuda.so.1 is looked for after the loader's own search path. */
static const char *const fg_cuda_paths[] = {
    "libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
};

static pthread_once_t fg_cuda_once = PTHREAD_ONCE_INIT;
static int fg_cuda_rc = -1;
static char fg_cuda_msg[2048];   /* why loading failed, or "" */
static char fg_cuda_where[1024]; /* every place looked at */
static char fg_cuda_path[1024];
static char fg_cuda_missing_opt[512]; /* optional entry points the driver lacks */

static void fg_appendf(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, len - n, fmt, ap);
  va_end(ap);
}

static void fg_cuda_do_load(void) {
  void *lib = NULL;
  const char *env = getenv("FLASHGEN_CUDA_LIBRARY");
  char dlerr[512] = "";
  if (env && env[0]) {
    /* An explicit choice is the only place looked at. */
    fg_appendf(fg_cuda_where, sizeof fg_cuda_where, "%s ($FLASHGEN_CUDA_LIBRARY)", env);
    lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *e = dlerror();
      snprintf(fg_cuda_msg, sizeof fg_cuda_msg,
               "the CUDA driver named by FLASHGEN_CUDA_LIBRARY=%s could not be loaded (%s); "
               "point it at libcuda.so.1 of the NVIDIA driver, or unset it to search the usual "
               "places",
               env, e ? e : "unknown dlopen error");
      return;
    }
    snprintf(fg_cuda_path, sizeof fg_cuda_path, "%s", env);
  }
  for (size_t i = 0; !lib && i < sizeof fg_cuda_paths / sizeof fg_cuda_paths[0]; i++) {
    if (fg_cuda_where[0]) fg_appendf(fg_cuda_where, sizeof fg_cuda_where, ", ");
    fg_appendf(fg_cuda_where, sizeof fg_cuda_where, "%s", fg_cuda_paths[i]);
    if (i == 0) fg_appendf(fg_cuda_where, sizeof fg_cuda_where, " (the loader's search path)");
    lib = dlopen(fg_cuda_paths[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      snprintf(fg_cuda_path, sizeof fg_cuda_path, "%s", fg_cuda_paths[i]);
    } else if (i == 0 && !dlerr[0]) {
      const char *e = dlerror();
      snprintf(dlerr, sizeof dlerr, "%s", e ? e : "unknown dlopen error");
    }
  }
  if (!lib) {
    snprintf(fg_cuda_msg, sizeof fg_cuda_msg,
             "libcuda.so.1 (the NVIDIA CUDA driver) was not found; looked in: %s (%s). Install "
             "the NVIDIA driver, or set FLASHGEN_CUDA_LIBRARY to the full path of libcuda.so.1",
             fg_cuda_where, dlerr);
    return;
  }
  fg_cuda_api api;
  memset(&api, 0, sizeof api);
  char missing[512] = "";
  for (size_t i = 0; i < FG_NSYMS; i++) {
    void *fn = NULL;
    for (int k = 0; k < 3 && fg_cuda_syms[i].names[k] && !fn; k++)
      fn = dlsym(lib, fg_cuda_syms[i].names[k]);
    if (fn) {
      memcpy((char *)&api + fg_cuda_syms[i].offset, &fn, sizeof fn);
    } else if (fg_cuda_syms[i].required) {
      fg_appendf(missing, sizeof missing, "%s%s", missing[0] ? ", " : "", fg_cuda_syms[i].names[0]);
    } else {
      fg_appendf(fg_cuda_missing_opt, sizeof fg_cuda_missing_opt, "%s%s",
                 fg_cuda_missing_opt[0] ? ", " : "", fg_cuda_syms[i].names[0]);
    }
  }
  if (missing[0]) {
    snprintf(fg_cuda_msg, sizeof fg_cuda_msg,
             "the CUDA driver %s lacks entry points flashgen needs (%s); it is too old or not "
             "the NVIDIA driver. Update the NVIDIA driver (flashgen needs CUDA 12.0 or newer)",
             fg_cuda_path, missing);
    dlclose(lib);
    return;
  }
  {
    /* Name the file actually loaded (the loader may have found libcuda.so.1 anywhere). */
    Dl_info info;
    void *init_fn;
    memcpy(&init_fn, &api.cuInit, sizeof init_fn);
    if (dladdr(init_fn, &info) && info.dli_fname && info.dli_fname[0] == '/')
      snprintf(fg_cuda_path, sizeof fg_cuda_path, "%s", info.dli_fname);
  }
  fg_cu = api; /* the library stays loaded for the life of the process */
  fg_cuda_rc = 0;
}

int fg_cuda_load(char *err, size_t errlen) {
  pthread_once(&fg_cuda_once, fg_cuda_do_load);
  if (fg_cuda_rc != 0 && err && errlen) snprintf(err, errlen, "%s", fg_cuda_msg);
  return fg_cuda_rc;
}

const char *fg_cuda_library_path(void) {
  pthread_once(&fg_cuda_once, fg_cuda_do_load);
  return fg_cuda_path;
}

/* Names of the results flashgen is likely to meet, for drivers that cannot name them (the
 * toolkit's stub library answers every call with CUDA_ERROR_STUB_LIBRARY, that one included). */
static const struct {
  int code;
  const char *name, *text;
} fg_cuda_known[] = {
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY",
     "the CUDA driver loaded is the toolkit's stub library, which runs nothing; install the "
     "NVIDIA driver (libcuda.so.1)"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for this device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the PTX is newer than this driver supports"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
     "forward compatibility was attempted on non supported HW"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int fg_cuda_known_index(CUresult r) {
  for (size_t i = 0; i < sizeof fg_cuda_known / sizeof fg_cuda_known[0]; i++)
    if (fg_cuda_known[i].code == r) return (int)i;
  return -1;
}

const char *fg_cuda_error_name(CUresult r) {
  static _Thread_local char buf[32];
  const char *name = NULL;
  if (fg_cu.cuGetErrorName && fg_cu.cuGetErrorName(r, &name) == FG_CUDA_SUCCESS && name)
    return name;
  int k = fg_cuda_known_index(r);
  if (k >= 0) return fg_cuda_known[k].name;
  snprintf(buf, sizeof buf, "CUDA_ERROR_%d", (int)r);
  return buf;
}

char *fg_cuda_describe(char *buf, size_t len, const char *call, CUresult r) {
  const char *text = NULL;
  if (!fg_cu.cuGetErrorString || fg_cu.cuGetErrorString(r, &text) != FG_CUDA_SUCCESS || !text) {
    int k = fg_cuda_known_index(r);
    text = k >= 0 ? fg_cuda_known[k].text : "no description from the driver";
  }
  snprintf(buf, len, "%s failed: %s (code %d): %s", call, fg_cuda_error_name(r), (int)r, text);
  return buf;
}

fg_status fg_cuda_status(CUresult r) {
  switch (r) {
    case FG_CUDA_SUCCESS: return FG_OK;
    case FG_CUDA_ERROR_OUT_OF_MEMORY: return FG_ERROR_OUT_OF_MEMORY;
    case FG_CUDA_ERROR_NO_DEVICE:
    case FG_CUDA_ERROR_STUB_LIBRARY:
    case 803: /* CUDA_ERROR_SYSTEM_DRIVER_MISMATCH */
    case 804: /* CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE */
      return FG_ERROR_NO_DRIVER;
    default: return FG_ERROR_CUDA;
  }
}

int fg_cuda_report(char *buf, size_t len) {
  if (!buf || !len) return fg_cuda_load(NULL, 0);
  buf[0] = 0;
  char err[2048];
  if (fg_cuda_load(err, sizeof err) != 0) {
    fg_appendf(buf, len, "CUDA driver: not usable\n  %s\n", err);
    return -1;
  }
  int ver = 0;
  fg_cu.cuDriverGetVersion(&ver);
  fg_appendf(buf, len, "CUDA driver: %s (looked in: %s)\n", fg_cuda_path, fg_cuda_where);
  fg_appendf(buf, len, "  driver API version: %d.%d\n", ver / 1000, (ver % 1000) / 10);
  fg_appendf(buf, len, "  optional entry points missing: %s\n",
             fg_cuda_missing_opt[0] ? fg_cuda_missing_opt : "none");
  CUresult r = fg_cu.cuInit(0);
  if (r != FG_CUDA_SUCCESS) {
    char d[512];
    fg_appendf(buf, len, "  %s\n", fg_cuda_describe(d, sizeof d, "cuInit", r));
    return -1;
  }
  int count = 0;
  r = fg_cu.cuDeviceGetCount(&count);
  if (r != FG_CUDA_SUCCESS || count == 0) {
    fg_appendf(buf, len, "  no CUDA device visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)\n");
    return -1;
  }
  for (int i = 0; i < count; i++) {
    CUdevice dev;
    char name[256] = "?";
    int major = 0, minor = 0, sms = 0, optin = 0, per_sm = 0, regs = 0;
    size_t mem = 0;
    if (fg_cu.cuDeviceGet(&dev, i) != FG_CUDA_SUCCESS) continue;
    fg_cu.cuDeviceGetName(name, (int)sizeof name, dev);
    fg_cu.cuDeviceGetAttribute(&major, FG_CU_DEV_COMPUTE_CAPABILITY_MAJOR, dev);
    fg_cu.cuDeviceGetAttribute(&minor, FG_CU_DEV_COMPUTE_CAPABILITY_MINOR, dev);
    fg_cu.cuDeviceGetAttribute(&sms, FG_CU_DEV_MULTIPROCESSOR_COUNT, dev);
    fg_cu.cuDeviceGetAttribute(&optin, FG_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    fg_cu.cuDeviceGetAttribute(&per_sm, FG_CU_DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev);
    fg_cu.cuDeviceGetAttribute(&regs, FG_CU_DEV_MAX_REGISTERS_PER_MULTIPROCESSOR, dev);
    fg_cu.cuDeviceTotalMem(&mem, dev);
    fg_appendf(buf, len,
               "  device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB, shared memory "
               "%d B per block (opt-in), %d B per SM, %d registers per SM\n",
               i, name, major, minor, sms, (double)mem / (1024.0 * 1024.0 * 1024.0), optin,
               per_sm, regs);
  }
  return 0;
}
