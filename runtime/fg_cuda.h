/* fg_cuda.h: the CUDA driver API as flashgen uses it, loaded at run time with
 * dlopen("libcuda.so.1"). Owns the minimal driver types and constants flashgen needs (numbers
 * copied from cuda.h of CUDA 13.0, which this file must not include) and one table of driver entry
 * points, fg_cu, filled by fg_cuda_load. Nothing here needs the CUDA toolkit at build time. */
#ifndef FG_CUDA_H
#define FG_CUDA_H
#include <stddef.h>
#include "flashgen.h" /* CUstream */

typedef int CUresult; /* enum cudaError_enum in cuda.h: an int-sized enum */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUevent_st *CUevent;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

/* CUmemPoolProps (cuda.h 13.0), for a device pool of pinned device memory. */
typedef struct fg_mem_pool_props {
  int alloc_type;       /* CUmemAllocationType: 1 = CU_MEM_ALLOCATION_TYPE_PINNED */
  int handle_types;     /* CUmemAllocationHandleType: 0 = none */
  int location_type;    /* CUmemLocation.type: 1 = CU_MEM_LOCATION_TYPE_DEVICE */
  int location_id;      /* CUmemLocation.id: the device ordinal */
  void *win32_security_attributes;
  size_t max_size;      /* 0: the system's default */
  unsigned short usage;
  unsigned char reserved[54];
} fg_mem_pool_props;
enum { FG_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4 }; /* value: cuuint64_t */

/* CUresult values flashgen looks at. */
enum {
  FG_CUDA_SUCCESS = 0,
  FG_CUDA_ERROR_INVALID_VALUE = 1,
  FG_CUDA_ERROR_OUT_OF_MEMORY = 2,
  FG_CUDA_ERROR_NOT_INITIALIZED = 3,
  FG_CUDA_ERROR_DEINITIALIZED = 4,
  FG_CUDA_ERROR_STUB_LIBRARY = 34,
  FG_CUDA_ERROR_NO_DEVICE = 100,
  FG_CUDA_ERROR_INVALID_DEVICE = 101,
  FG_CUDA_ERROR_INVALID_IMAGE = 200,
  FG_CUDA_ERROR_INVALID_CONTEXT = 201,
  FG_CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  FG_CUDA_ERROR_INVALID_PTX = 218,
  FG_CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  FG_CUDA_ERROR_NOT_FOUND = 500,
  FG_CUDA_ERROR_NOT_SUPPORTED = 801
};

/* CUdevice_attribute values. */
enum {
  FG_CU_DEV_MAX_THREADS_PER_BLOCK = 1,
  FG_CU_DEV_MAX_GRID_DIM_X = 5,
  FG_CU_DEV_MAX_GRID_DIM_Y = 6,
  FG_CU_DEV_MULTIPROCESSOR_COUNT = 16,
  FG_CU_DEV_L2_CACHE_SIZE = 38,
  FG_CU_DEV_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  FG_CU_DEV_UNIFIED_ADDRESSING = 41,
  FG_CU_DEV_COMPUTE_CAPABILITY_MAJOR = 75,
  FG_CU_DEV_COMPUTE_CAPABILITY_MINOR = 76,
  FG_CU_DEV_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  FG_CU_DEV_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
  FG_CU_DEV_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  FG_CU_DEV_MEMORY_POOLS_SUPPORTED = 115
};

/* CUpointer_attribute values and CUmemorytype values. */
enum {
  FG_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,    /* unsigned int (CUmemorytype) */
  FG_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,     /* unsigned int (boolean) */
  FG_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9  /* int */
};
enum {
  FG_CU_MEMORYTYPE_HOST = 1,
  FG_CU_MEMORYTYPE_DEVICE = 2,
  FG_CU_MEMORYTYPE_ARRAY = 3,
  FG_CU_MEMORYTYPE_UNIFIED = 4
};

/* CUfunction_attribute values. */
enum {
  FG_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  FG_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
  FG_CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  FG_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  FG_CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
};

/* CUjit_option values (cuModuleLoadDataEx). */
enum { FG_CU_JIT_ERROR_LOG_BUFFER = 5, FG_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

/* Event flags. */
enum { FG_CU_EVENT_DEFAULT = 0, FG_CU_EVENT_DISABLE_TIMING = 2 };
/* Stream flags. */
enum { FG_CU_STREAM_DEFAULT = 0, FG_CU_STREAM_NON_BLOCKING = 1 };
/* cuda.h's CU_STREAM_LEGACY: the legacy default stream, whatever the thread's default is. */
#define FG_CU_STREAM_LEGACY ((CUstream)0x1)

/* Tensor maps (cuTensorMapEncodeTiled; cuda.h 13.0: CUtensorMapDataType, CUtensorMapInterleave,
 * CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill, all int-sized enums). The
 * map itself is 128 opaque bytes, 64-byte aligned: fg_tmap of templates/fg_params.h. */
enum {
  FG_CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  FG_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
  FG_CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
  FG_CU_TENSOR_MAP_SWIZZLE_128B = 3,
  FG_CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
  FG_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 /* out-of-bounds elements read as zeros */
};
/* What the driver accepts (cuTensorMapEncodeTiled's documentation): ranks 1..5, each dimension
 * 1..2^32, global strides (bytes, of dims 1..rank-1) multiples of 16 below 2^40, box sides 1..256,
 * a base address 16-byte aligned. */
#define FG_TMA_MAX_DIM (1ull << 32)
#define FG_TMA_MAX_STRIDE (1ull << 40)
#define FG_TMA_MAX_BOX 256

/* The driver entry points. Members are named after the driver API (cuda.h's names, without the
 * _v2 suffixes cuda.h adds by macro; the _v2 symbols are what is loaded where the driver has
 * them). Required entries are never NULL after a successful fg_cuda_load; optional ones (marked)
 * may be NULL on old drivers. */
typedef struct fg_cuda_api {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDriverGetVersion)(int *version);
  CUresult (*cuDeviceGetCount)(int *count);
  CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
  CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
  CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev);
  CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);
  CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
  CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuModuleLoadDataEx)(CUmodule *mod, const void *image, unsigned int n, int *options,
                                 void **values);
  CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule mod, const char *name);
  CUresult (*cuModuleUnload)(CUmodule mod);
  CUresult (*cuFuncSetAttribute)(CUfunction fn, int attrib, int value);
  CUresult (*cuFuncGetAttribute)(int *value, int attrib, CUfunction fn);
  CUresult (*cuLaunchKernel)(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int smem_bytes, CUstream stream, void **params, void **extra);
  CUresult (*cuPointerGetAttribute)(void *data, int attrib, CUdeviceptr ptr);
  CUresult (*cuPointerGetAttributes)(unsigned int n, int *attribs, void **data,
                                     CUdeviceptr ptr); /* optional */
  CUresult (*cuMemAlloc)(CUdeviceptr *ptr, size_t bytes);
  CUresult (*cuMemFree)(CUdeviceptr ptr);
  CUresult (*cuMemAllocAsync)(CUdeviceptr *ptr, size_t bytes, CUstream s); /* optional */
  CUresult (*cuMemFreeAsync)(CUdeviceptr ptr, CUstream s);                 /* optional */
  /* Memory pools of our own (a context's workspace pool); optional. props points at a
   * CUmemPoolProps (fg_mem_pool_props below). */
  CUresult (*cuMemPoolCreate)(CUmemoryPool *pool, const void *props);
  CUresult (*cuMemPoolDestroy)(CUmemoryPool pool);
  CUresult (*cuMemPoolSetAttribute)(CUmemoryPool pool, int attr, void *value);
  CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *ptr, size_t bytes, CUmemoryPool pool,
                                      CUstream s);
  CUresult (*cuMemAllocHost)(void **ptr, size_t bytes);                    /* optional */
  CUresult (*cuMemFreeHost)(void *ptr);                                    /* optional */
  CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
  CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
  CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
  CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t count);
  CUresult (*cuMemsetD16)(CUdeviceptr dst, unsigned short value, size_t count);
  CUresult (*cuMemsetD32)(CUdeviceptr dst, unsigned int value, size_t count);
  CUresult (*cuMemsetD32Async)(CUdeviceptr dst, unsigned int value, size_t count, CUstream s);
  CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
  CUresult (*cuStreamDestroy)(CUstream s);
  CUresult (*cuStreamSynchronize)(CUstream s);
  CUresult (*cuEventCreate)(CUevent *ev, unsigned int flags);
  CUresult (*cuEventRecord)(CUevent ev, CUstream s);
  CUresult (*cuEventSynchronize)(CUevent ev);
  CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
  CUresult (*cuEventDestroy)(CUevent ev);
  /* Encodes a tiled tensor map into map (a 64-byte aligned CUtensorMap: fg_tmap); optional
   * (CUDA 12.0 and newer drivers have it). cuuint32_t / cuuint64_t are unsigned int and
   * unsigned long long (cuda.h). */
  CUresult (*cuTensorMapEncodeTiled)(void *map, int data_type, unsigned int rank, void *address,
                                     const unsigned long long *dims,
                                     const unsigned long long *strides, const unsigned int *box,
                                     const unsigned int *element_strides, int interleave,
                                     int swizzle, int l2_promotion, int oob_fill);
  CUresult (*cuGetErrorName)(CUresult r, const char **name);
  CUresult (*cuGetErrorString)(CUresult r, const char **text);
} fg_cuda_api;

/* The loaded entry points; valid (and never changed again) once fg_cuda_load returned 0. */
extern fg_cuda_api fg_cu;

/* Loads the driver once per process: $FLASHGEN_CUDA_LIBRARY if set, else libcuda.so.1 through the
 * dynamic loader's search path, then the usual absolute locations. Returns 0, or -1 with err
 * saying what was missing and every place looked at. Thread-safe; later calls return the first
 * result (and the same message). err may be NULL. */
int fg_cuda_load(char *err, size_t errlen);

/* The path the driver was loaded from (as given to dlopen, resolved when possible), or "". */
const char *fg_cuda_library_path(void);

/* A multi-line, human-readable report for `flashgen info`: where the driver was looked for and
 * found, its version, the required and optional entry points that are missing, and the devices
 * with their compute capability and shared-memory limits. Loads the driver if needed. Writes at
 * most len bytes (NUL-terminated when len > 0). Returns 0 when the driver is usable, -1 if not. */
int fg_cuda_report(char *buf, size_t len);

/* The driver's name for a result, e.g. "CUDA_ERROR_OUT_OF_MEMORY"; "CUDA_ERROR_<n>" when the
 * driver does not know it. The returned string is static or owned by the driver. */
const char *fg_cuda_error_name(CUresult r);

/* Formats "call failed: NAME (code N): driver text" into buf. Returns buf. */
char *fg_cuda_describe(char *buf, size_t len, const char *call, CUresult r);

/* The fg_status a failed driver call maps to: FG_ERROR_OUT_OF_MEMORY for out-of-memory,
 * FG_ERROR_NO_DRIVER for no device / stub library / driver mismatch, FG_ERROR_CUDA otherwise. */
fg_status fg_cuda_status(CUresult r);
#endif
