/*
 * A libcuda.so.1 for a machine with no GPU: NIXL's LIBFABRIC plugin links
 * libcuda.so.1 and will not load without it (NIXL then reports
 * "createBackend: unsupported backend 'LIBFABRIC'"). Every entry point the
 * plugin resolves reports that there is no device, so NIXL takes its
 * "System runtime: SYSTEM (no accelerators)" path and moves host memory.
 * Compiled at rehearsal time; never shipped.
 */
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CUDA_ERROR_NO_DEVICE 100

static const char no_device[] = "no CUDA device (rehearsal stub)";

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *version) { if (version) *version = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *count) { if (count) *count = 0; return 0; }
CUresult cuCtxSetCurrent(CUcontext ctx) { (void)ctx; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
    (void)dev;
    if (bus_id && len > 0) bus_id[0] = '\0';
    return CUDA_ERROR_NO_DEVICE;
}
CUresult cuPointerGetAttributes(unsigned int n, void *attributes, void **data, CUdeviceptr ptr) {
    (void)n; (void)attributes; (void)data; (void)ptr;
    return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetErrorString(CUresult error, const char **text) { (void)error; if (text) *text = no_device; return 0; }
CUresult cuGetErrorName(CUresult error, const char **text) { (void)error; if (text) *text = "CUDA_ERROR_NO_DEVICE"; return 0; }
