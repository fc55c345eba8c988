/*
 * cublasLt.h - the CUDA emulator's cuBLASLt subset (the toolkit's names,
 * enum values and documented argument rules): handles, matmul descriptors
 * (compute and scale type, transposes, the bias epilogue), column-major
 * matrix layouts, heuristic preferences (workspace, alignments, reduction
 * schemes), the heuristic query and cublasLtMatmul. Computed with OpenBLAS
 * when the stream reaches the call (tests/cuda_emu/cublas.cc;
 * docs/CUDA-EMU.md says what is checked).
 */
#ifndef DPEMU_CUBLASLT_H
#define DPEMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cublas_v2.h"
#include "cuda_runtime_api.h"
#include "library_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescEmu *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutEmu *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceEmu *cublasLtMatmulPreference_t;

/* Semi-opaque, as in the toolkit (the emulator keeps what the heuristic
 * decided in it). */
typedef struct {
	uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
	CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,   /* int32_t cublasComputeType_t */
	CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,     /* int32_t cudaDataType */
	CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,   /* int32_t */
	CUBLASLT_MATMUL_DESC_TRANSA = 3,         /* int32_t cublasOperation_t */
	CUBLASLT_MATMUL_DESC_TRANSB = 4,         /* int32_t cublasOperation_t */
	CUBLASLT_MATMUL_DESC_TRANSC = 5,         /* int32_t: CUBLAS_OP_N only */
	CUBLASLT_MATMUL_DESC_EPILOGUE = 7,       /* uint32_t cublasLtEpilogue_t */
	CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,   /* const void * */
	CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11, /* void *: the GELU epilogues' aux */
	CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,      /* int64_t: its leading dimension */
	CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22, /* int32_t cudaDataType, -1: D's type */
	CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26 /* int32_t cudaDataType, -1: D's type */
} cublasLtMatmulDescAttributes_t;

typedef enum {
	CUBLASLT_MATRIX_LAYOUT_TYPE = 0,  /* uint32_t cudaDataType */
	CUBLASLT_MATRIX_LAYOUT_ORDER = 1, /* int32_t: CUBLASLT_ORDER_COL only */
	CUBLASLT_MATRIX_LAYOUT_ROWS = 2,  /* uint64_t */
	CUBLASLT_MATRIX_LAYOUT_COLS = 3,  /* uint64_t */
	CUBLASLT_MATRIX_LAYOUT_LD = 4     /* int64_t */
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
	CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            /* uint32_t */
	CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    /* uint64_t, default 0 */
	CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  /* uint32_t, default all */
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  /* uint32_t, default 256 */
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
	CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

typedef enum {
	CUBLASLT_EPILOGUE_DEFAULT = 1,
	CUBLASLT_EPILOGUE_RELU = 2,
	CUBLASLT_EPILOGUE_BIAS = 4,
	CUBLASLT_EPILOGUE_RELU_BIAS = 6,
	CUBLASLT_EPILOGUE_GELU = 32,
	CUBLASLT_EPILOGUE_GELU_BIAS = 36,
	CUBLASLT_EPILOGUE_GELU_AUX = 160,      /* GELU | 128: D = gelu(x), aux = x */
	CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164, /* ... with x = product + bias */
	CUBLASLT_EPILOGUE_DGELU = 192,         /* 64 | 128: D = product * gelu'(aux) */
	CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,   /* ... and D's bias gradient */
	CUBLASLT_EPILOGUE_BGRADA = 256, /* column sums of op(A) over k into the bias pointer (m) */
	CUBLASLT_EPILOGUE_BGRADB = 512  /* ... of op(B) over k (n) */
} cublasLtEpilogue_t;

typedef enum {
	CUBLASLT_REDUCTION_SCHEME_NONE = 0,
	CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,      /* partial sums in D, in D's type */
	CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2, /* partial sums in the compute type */
	CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,  /* partial sums in D's type */
	CUBLASLT_REDUCTION_SCHEME_MASK = 7
} cublasLtReductionScheme_t;

typedef enum { CUBLASLT_ORDER_COL = 0, CUBLASLT_ORDER_ROW = 1 } cublasLtOrder_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char *cublasLtGetStatusName(cublasStatus_t status);
const char *cublasLtGetStatusString(cublasStatus_t status);
size_t cublasLtGetVersion(void);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
					cublasComputeType_t computeType, cudaDataType scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
					      cublasLtMatmulDescAttributes_t attr, const void *buf,
					      size_t sizeInBytes);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
					  uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
						    cublasLtMatmulPreferenceAttributes_t attr,
						    const void *buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
					      cublasLtMatmulDesc_t operationDesc,
					      cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
					      cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
					      cublasLtMatmulPreference_t preference,
					      int requestedAlgoCount,
					      cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
					      int *returnAlgoCount);

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle,
				       cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
				       cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
				       cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
				       cublasLtMatmulHeuristicResult_t *result);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
			      const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
			      const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
			      const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
			      cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
			      void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
