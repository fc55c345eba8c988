/*
 * library_types.h - the CUDA emulator's cudaDataType (the values of the
 * CUDA toolkit's library_types.h, so a step of cuBLAS code means the same).
 */
#ifndef DPEMU_LIBRARY_TYPES_H
#define DPEMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
	CUDA_R_32F = 0,  /* float */
	CUDA_R_64F = 1,  /* double */
	CUDA_R_16F = 2,  /* half */
	CUDA_R_8I = 3,   /* int8 */
	CUDA_R_32I = 10, /* int32 */
	CUDA_R_16BF = 14 /* __nv_bfloat16 */
} cudaDataType;

#endif
