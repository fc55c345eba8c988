/*
 * cuda_runtime.h - the CUDA emulator's cuda_runtime.h: the runtime API
 * (cuda_runtime_api.h) plus, for C++, the template helpers the toolkit's
 * header adds (cudaFuncSetAttribute and cudaFuncGetAttributes on a kernel). Kernel code gets the
 * device side from dpemu_device.h, which the emulated build force-includes
 * into every .cu file (nvcc includes its device headers implicitly too).
 */
#ifndef DPEMU_CUDA_RUNTIME_H
#define DPEMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{
	return cudaFuncSetAttribute((const void *)entry, attr, value);
}
template <class T>
static inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *entry)
{
	return cudaFuncGetAttributes(attr, (const void *)entry);
}
template <class T>
static inline cudaError_t cudaMallocHost(T **ptr, size_t size)
{
	return cudaMallocHost((void **)ptr, size);
}
#endif

#endif
