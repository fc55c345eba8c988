/*
 * backend.c - finding and loading a compute backend for `dpexec --device`.
 *
 * The CPU backend is linked in (backend_cpu). The CUDA backend is a shared
 * object, libdpcuda.so, that links the CUDA runtime, cuBLAS and NCCL;
 * dpexec loads it with dlopen only when asked for (--device cuda) or when
 * --device auto finds a GPU, so dpexec itself starts on a machine without
 * any CUDA library. auto asks the driver alone (libcuda.so.1, part of the
 * NVIDIA driver, not of the toolkit) whether there is a GPU before it
 * loads anything else, so a CPU machine pays nothing for it.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/cpu.h"

const BackendOps *backend_cpu(void)
{
	return &cpu_backend;
}

/* Once per process, before MPI_Init and before any backend: OpenBLAS's
 * kernels (cpu/gemm.c says why the choice is the process's). */
void backend_process_init(void)
{
	cpu_blas_choose();
}

void backend_cuda_path(char *buf, size_t len)
{
	const char *env = getenv(BACKEND_CUDA_ENV);
	if (env && *env) {
		snprintf(buf, len, "%s", env);
		return;
	}
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0) {
		snprintf(buf, len, "%s", BACKEND_CUDA_LIB); /* the loader's search path */
		return;
	}
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	if (slash)
		slash[1] = '\0';
	snprintf(buf, len, "%s%s", exe, BACKEND_CUDA_LIB);
}

int backend_load_cuda(const BackendOps **ops, void **handle, char *why, size_t len)
{
	char path[4096];
	backend_cuda_path(path, sizeof path);
	*ops = NULL;
	*handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!*handle) {
		snprintf(why, len, "cannot load the CUDA backend: %s", dlerror());
		return -1;
	}
	const BackendOps *o = dlsym(*handle, "dp_cuda_backend");
	if (!o || o->abi != DP_BACKEND_ABI) {
		if (o)
			snprintf(why, len, "%s was built for another dpexec (backend ABI %u, this "
				 "dpexec has %u): rebuild both", path, o->abi, DP_BACKEND_ABI);
		else
			snprintf(why, len, "%s is not a dp CUDA backend (no dp_cuda_backend)", path);
		dlclose(*handle);
		*handle = NULL;
		return -1;
	}
	*ops = o;
	return 0;
}

/* The driver API's entry points we need, declared here: no CUDA header. */
typedef int (*CuInitFn)(unsigned flags);
typedef int (*CuCountFn)(int *count);

int backend_gpu_present(char *why, size_t len, int *driver)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	*driver = h != NULL;
	if (!h) {
		snprintf(why, len, "no CUDA driver: %s", dlerror());
		return 0;
	}
	CuInitFn init = (CuInitFn)dlsym(h, "cuInit");
	CuCountFn count = (CuCountFn)dlsym(h, "cuDeviceGetCount");
	int n = 0, rc;
	if (!init || !count)
		snprintf(why, len, "libcuda.so.1 has no cuInit/cuDeviceGetCount");
	else if ((rc = init(0)) != 0)
		snprintf(why, len, "the CUDA driver failed to initialise (cuInit error %d)", rc);
	else if ((rc = count(&n)) != 0 || n <= 0)
		snprintf(why, len, "the CUDA driver reports no device (cuDeviceGetCount: %d, %d)", rc,
			 n);
	dlclose(h);
	return n > 0;
}
