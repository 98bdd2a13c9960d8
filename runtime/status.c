/* status.c: static text for status codes and the library version. */
#include "flashgen.h"

#ifndef FG_VERSION_STRING
#error "FG_VERSION_STRING must be defined by the build (CMakeLists.txt)"
#endif

FG_API const char *fg_status_string(fg_status code) {
  switch (code) {
    case FG_OK: return "success";
    case FG_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FG_ERROR_UNSUPPORTED: return "unsupported problem or device";
    case FG_ERROR_NO_DRIVER: return "CUDA driver or device not available";
    case FG_ERROR_NO_COMPILER: return "NVRTC (the CUDA run-time compiler) not available";
    case FG_ERROR_COMPILE: return "kernel compilation failed";
    case FG_ERROR_KERNEL_MISSING: return "kernel missing and the policy forbids compiling";
    case FG_ERROR_CUDA: return "CUDA driver call failed";
    case FG_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FG_ERROR_CACHE: return "kernel cache error";
    case FG_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status code";
}

FG_API const char *fg_version(void) { return FG_VERSION_STRING; }
