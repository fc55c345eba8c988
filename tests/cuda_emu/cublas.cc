/*
 * cublas.cc - the CUDA emulator's cuBLAS subset. A handle has a stream
 * (cublasSetStream), a workspace, a math mode and a pointer mode. A GEMM is
 * checked when it is called, as cuBLAS checks it (the documented rules: m,
 * n, k >= 0; op N, T or C; lda >= max(1, rows of A as stored), likewise ldb,
 * ldc >= max(1, m); the supported type combinations), then every matrix's
 * column-major extent must lie inside one device allocation (a wrong
 * leading dimension that reads past the buffer is reported here, where the
 * GPU would fault later). The product is queued on the handle's stream and
 * computed by OpenBLAS's cblas_sgemm in column-major order when the stream
 * reaches it.
 *
 * Numerics: fp32 in, fp32 accumulation in OpenBLAS's order (not the GPU's).
 * TF32 (CUBLAS_COMPUTE_32F_FAST_TF32, or CUBLAS_TF32_TENSOR_OP_MATH on the
 * handle, unless NVIDIA_TF32_OVERRIDE=0): A and B are first rounded to 10
 * mantissa bits, to nearest with ties away from zero (cvt.rna.tf32.f32).
 * bf16 inputs are widened to fp32 exactly; a bf16 C is rounded once, to
 * nearest even, from the fp32 result.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu.h"
#include "include/cublas_v2.h"
#include "include/cuda_bf16.h"

using namespace emu;

struct cublasContext {
	cudaStream_t stream;
	void *ws;
	size_t ws_bytes;
	cublasMath_t math;
	cublasPointerMode_t pm;
};

static std::set<cublasContext *> &handles()
{
	static std::set<cublasContext *> *h = new std::set<cublasContext *>;
	return *h;
}

static bool live(cublasHandle_t h)
{
	return h && handles().count(h);
}

static float tf32(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	if ((u & 0x7f800000u) != 0x7f800000u) {
		u += 0x1000u; /* half of the 13 dropped bits: ties away from zero */
		u &= ~0x1fffu;
	}
	memcpy(&x, &u, 4);
	return x;
}

static size_t esize(cudaDataType t)
{
	return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_64F ? 8 : t == CUDA_R_8I ? 1 : 4;
}

static const char *tname(cudaDataType t)
{
	switch (t) {
	case CUDA_R_32F: return "CUDA_R_32F";
	case CUDA_R_16BF: return "CUDA_R_16BF";
	case CUDA_R_16F: return "CUDA_R_16F";
	case CUDA_R_64F: return "CUDA_R_64F";
	default: return "another type";
	}
}

/* A matrix operand as stored: rows x cols, column-major, leading dim ld. */
struct Operand {
	const char *name;
	const void *p;
	cudaDataType t;
	int rows, cols, ld;
	long long stride;
	size_t extent() const { return rows && cols ? ((size_t)(cols - 1) * ld + rows) * esize(t) : 0; }
	const char *at(int b) const { return (const char *)p + (size_t)b * stride * esize(t); }
};

/* The operand of batch b as fp32 (a copy when converted). */
static const float *as_f32(const Operand &o, int b, bool round_tf32, std::vector<float> &tmp)
{
	if (o.t == CUDA_R_32F && !round_tf32)
		return (const float *)o.at(b);
	size_t n = o.extent() / esize(o.t);
	tmp.resize(n ? n : 1);
	for (size_t i = 0; i < n; i++) {
		float v = o.t == CUDA_R_16BF ? (float)((const __nv_bfloat16 *)o.at(b))[i]
					      : ((const float *)o.at(b))[i];
		tmp[i] = round_tf32 ? tf32(v) : v;
	}
	return tmp.data();
}

static CBLAS_TRANSPOSE cb(cublasOperation_t op)
{
	return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; /* real: C is T */
}

static cublasStatus_t bad(const char *api, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cublasStatus_t bad(const char *api, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	note("%s: %s: CUBLAS_STATUS_INVALID_VALUE", api, buf);
	return CUBLAS_STATUS_INVALID_VALUE;
}

static cublasStatus_t gemm(const char *api, cublasHandle_t h, cublasOperation_t ta,
			   cublasOperation_t tb, int m, int n, int k, const void *alpha, Operand A,
			   Operand B, const void *beta, void *C, cudaDataType Ct, int ldc,
			   long long strideC, int batch, cublasComputeType_t compute)
{
	EMU_API_ENTRY(api);
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if ((unsigned)ta > CUBLAS_OP_C || (unsigned)tb > CUBLAS_OP_C)
		return bad(api, "transa %d / transb %d is not CUBLAS_OP_N, _T or _C", (int)ta, (int)tb);
	if (m < 0 || n < 0 || k < 0 || batch < 0)
		return bad(api, "m %d, n %d, k %d, batchCount %d: negative", m, n, k, batch);
	A.rows = ta == CUBLAS_OP_N ? m : k;
	A.cols = ta == CUBLAS_OP_N ? k : m;
	B.rows = tb == CUBLAS_OP_N ? k : n;
	B.cols = tb == CUBLAS_OP_N ? n : k;
	if (A.ld < (A.rows > 1 ? A.rows : 1))
		return bad(api, "lda %d < max(1, %d): A is stored %d x %d (op %s, m %d, k %d)", A.ld,
			   A.rows, A.rows, A.cols, ta == CUBLAS_OP_N ? "N" : "T", m, k);
	if (B.ld < (B.rows > 1 ? B.rows : 1))
		return bad(api, "ldb %d < max(1, %d): B is stored %d x %d (op %s, k %d, n %d)", B.ld,
			   B.rows, B.rows, B.cols, tb == CUBLAS_OP_N ? "N" : "T", k, n);
	if (ldc < (m > 1 ? m : 1))
		return bad(api, "ldc %d < max(1, m = %d)", ldc, m);
	bool f32 = A.t == CUDA_R_32F && B.t == CUDA_R_32F && Ct == CUDA_R_32F;
	bool bf = A.t == CUDA_R_16BF && B.t == CUDA_R_16BF && (Ct == CUDA_R_16BF || Ct == CUDA_R_32F);
	bool compute32 = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
			 compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
			 compute == CUBLAS_COMPUTE_32F_FAST_16F;
	if (!compute32 || !(f32 || (bf && (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC)))) {
		note("%s: A %s, B %s, C %s with compute type %d is not a supported combination: "
		     "CUBLAS_STATUS_NOT_SUPPORTED", api, tname(A.t), tname(B.t), tname(Ct), (int)compute);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	const char *tf_env = getenv("NVIDIA_TF32_OVERRIDE");
	bool tf = f32 && !(tf_env && !strcmp(tf_env, "0")) && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
		  (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH);
	if (!alpha || !beta)
		return bad(api, "alpha or beta is NULL");
	float av = 0, bv = 0;
	if (h->pm == CUBLAS_POINTER_MODE_HOST) {
		memcpy(&av, alpha, 4);
		memcpy(&bv, beta, 4);
	} else {
		std::string why;
		if (!device_accessible(alpha, 4, &why) || !device_accessible(beta, 4, &why))
			fatal("%s: CUBLAS_POINTER_MODE_DEVICE, but alpha/beta: %s", api, why.c_str());
	}
	if (!m || !n || !batch)
		return CUBLAS_STATUS_SUCCESS;
	Operand Cop{"C", C, Ct, m, n, ldc, strideC};
	for (const Operand *o : {&A, &B, &Cop}) {
		if (o == &A || o == &B) {
			if (!k)
				continue;
		}
		for (int b : {0, batch - 1}) {
			std::string why;
			if (!device_accessible(o->at(b), o->extent(), &why))
				fatal("%s: matrix %s of batch %d (%d x %d, ld %d, column-major) is not inside "
				      "one device buffer: %s (a wrong leading dimension or shape reads past "
				      "the buffer; on a GPU an illegal address)", api, o->name, b, o->rows,
				      o->cols, o->ld, why.c_str());
		}
	}
	Stream *s = stream_of(h->stream, api);
	if (!s)
		return CUBLAS_STATUS_INVALID_VALUE;
	char what[200];
	snprintf(what, sizeof what, "%s m %d n %d k %d op %c%c%s%s", api, m, n, k, ta ? 'T' : 'N',
		 tb ? 'T' : 'N', tf ? " tf32" : "", batch > 1 ? " batched" : "");
	cublasPointerMode_t pm = h->pm;
	auto run = [=]() {
		float al = av, be = bv;
		if (pm == CUBLAS_POINTER_MODE_DEVICE) {
			memcpy(&al, alpha, 4);
			memcpy(&be, beta, 4);
		}
		std::vector<float> ta_, tb_, tc_;
		for (int b = 0; b < batch; b++) {
			const float *a = k ? as_f32(A, b, tf, ta_) : (const float *)A.at(b);
			const float *bb = k ? as_f32(B, b, tf, tb_) : (const float *)B.at(b);
			if (Ct == CUDA_R_32F) {
				cblas_sgemm(CblasColMajor, cb(ta), cb(tb), m, n, k, al, a, A.ld, bb, B.ld, be,
					    (float *)Cop.at(b), ldc);
				continue;
			}
			/* bf16 C: fp32 product (beta C widened), rounded once */
			__nv_bfloat16 *c = (__nv_bfloat16 *)Cop.at(b);
			tc_.assign((size_t)ldc * n, 0.0f);
			if (be != 0)
				for (int j = 0; j < n; j++)
					for (int i = 0; i < m; i++)
						tc_[(size_t)j * ldc + i] = (float)c[(size_t)j * ldc + i];
			cblas_sgemm(CblasColMajor, cb(ta), cb(tb), m, n, k, al, a, A.ld, bb, B.ld, be,
				    tc_.data(), ldc);
			for (int j = 0; j < n; j++)
				for (int i = 0; i < m; i++)
					c[(size_t)j * ldc + i] = __nv_bfloat16(tc_[(size_t)j * ldc + i]);
		}
	};
	if (submit(s, std::make_shared<FnWork>(what, run), api))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	EMU_API_ENTRY("cublasCreate");
	if (!h)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (init_error())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (capturing()) {
		capture_violation("cublasCreate (it allocates device memory)");
		return CUBLAS_STATUS_NOT_INITIALIZED;
	}
	cublasContext *c = new cublasContext{nullptr, nullptr, 0, CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST};
	handles().insert(c);
	*h = c;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	EMU_API_ENTRY("cublasDestroy");
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handles().erase(h);
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion(cublasHandle_t h, int *v)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!v)
		return CUBLAS_STATUS_INVALID_VALUE;
	*v = CUBLAS_VERSION;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t st)
{
	EMU_API_ENTRY("cublasSetStream");
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!stream_of(st, "cublasSetStream"))
		return CUBLAS_STATUS_INVALID_VALUE;
	h->stream = st;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *st)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!st)
		return CUBLAS_STATUS_INVALID_VALUE;
	*st = h->stream;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
	EMU_API_ENTRY("cublasSetWorkspace");
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (bytes) {
		std::string why;
		if (!ws || ((uintptr_t)ws & 255))
			return bad("cublasSetWorkspace", "the workspace %p is not 256-byte aligned", ws);
		if (!device_accessible(ws, bytes, &why))
			return bad("cublasSetWorkspace", "the workspace is not device memory: %s", why.c_str());
	}
	h->ws = ws;
	h->ws_bytes = bytes;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	unsigned base = (unsigned)mode & ~16u;
	if (base > CUBLAS_TF32_TENSOR_OP_MATH)
		return bad("cublasSetMathMode", "mode %d", (int)mode);
	h->math = mode;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!mode)
		return CUBLAS_STATUS_INVALID_VALUE;
	*mode = h->math;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if ((unsigned)mode > 1)
		return CUBLAS_STATUS_INVALID_VALUE;
	h->pm = mode;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t h, cublasPointerMode_t *mode)
{
	if (!live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!mode)
		return CUBLAS_STATUS_INVALID_VALUE;
	*mode = h->pm;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
	case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
	case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
	case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
	case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
	case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
	}
	return "unknown error";
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
			   int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
			   const float *beta, float *C, int ldc)
{
	return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, Operand{"A", A, CUDA_R_32F, 0, 0, lda, 0},
		    Operand{"B", B, CUDA_R_32F, 0, 0, ldb, 0}, beta, C, CUDA_R_32F, ldc, 0, 1,
		    CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
					 int m, int n, int k, const float *alpha, const float *A, int lda,
					 long long sA, const float *B, int ldb, long long sB,
					 const float *beta, float *C, int ldc, long long sC, int batch)
{
	return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha,
		    Operand{"A", A, CUDA_R_32F, 0, 0, lda, sA}, Operand{"B", B, CUDA_R_32F, 0, 0, ldb, sB},
		    beta, C, CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
			    int k, const void *alpha, const void *A, cudaDataType At, int lda,
			    const void *B, cudaDataType Bt, int ldb, const void *beta, void *C,
			    cudaDataType Ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, Operand{"A", A, At, 0, 0, lda, 0},
		    Operand{"B", B, Bt, 0, 0, ldb, 0}, beta, C, Ct, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
					  int m, int n, int k, const void *alpha, const void *A,
					  cudaDataType At, int lda, long long sA, const void *B,
					  cudaDataType Bt, int ldb, long long sB, const void *beta, void *C,
					  cudaDataType Ct, int ldc, long long sC, int batch,
					  cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha,
		    Operand{"A", A, At, 0, 0, lda, sA}, Operand{"B", B, Bt, 0, 0, ldb, sB}, beta, C, Ct,
		    ldc, sC, batch, compute);
}

} // extern "C"
