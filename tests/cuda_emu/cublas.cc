/*
 * cublas.cc - the CUDA emulator's cuBLAS and cuBLASLt subsets (cuBLASLt:
 * the second half, with its own notes). A cuBLAS handle has a stream
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
 * nearest even, from the fp32 result. cuBLASLt also takes fp16 (CUDA_R_16F)
 * wherever it takes bf16, under the same rules: widened exactly, a 16-bit
 * D rounded once (cuda_fp16.h's rounding, F16C's bits).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"
#include "include/cublasLt.h"
#include "include/cublas_v2.h"
#include "include/cuda_bf16.h"
#include "include/cuda_fp16.h"
#include "include/dpemu_mma_ptx.h" /* dpemu_tf32: cvt.rna.tf32.f32 */

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

/* Element i of a matrix of type t (fp32, bf16, fp16) as fp32: exact. */
static float elt(cudaDataType t, const void *p, size_t i)
{
	if (t == CUDA_R_16BF)
		return (float)((const __nv_bfloat16 *)p)[i];
	if (t == CUDA_R_16F)
		return (float)((const __half *)p)[i];
	return ((const float *)p)[i];
}

/* Element i of a matrix of type t set to v (rounded once to nearest even
 * in a 16-bit type). */
static void set_elt(cudaDataType t, void *p, size_t i, float v)
{
	if (t == CUDA_R_16BF)
		((__nv_bfloat16 *)p)[i] = __nv_bfloat16(v);
	else if (t == CUDA_R_16F)
		((__half *)p)[i] = __half(v);
	else
		((float *)p)[i] = v;
}

/* The operand of batch b as fp32 (a copy when converted). */
static const float *as_f32(const Operand &o, int b, bool round_tf32, std::vector<float> &tmp)
{
	if (o.t == CUDA_R_32F && !round_tf32)
		return (const float *)o.at(b);
	size_t n = o.extent() / esize(o.t);
	tmp.resize(n ? n : 1);
	for (size_t i = 0; i < n; i++) {
		float v = elt(o.t, o.at(b), i);
		tmp[i] = round_tf32 ? dpemu_tf32(v) : v;
	}
	return tmp.data();
}

static CBLAS_TRANSPOSE cb(cublasOperation_t op)
{
	return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; /* real: C is T */
}

/* Say why api returns st (a misuse the real library rejects), return st. */
static cublasStatus_t refuse(cublasStatus_t st, const char *api, const char *fmt, va_list ap)
{
	char buf[512];
	vsnprintf(buf, sizeof buf, fmt, ap);
	note("%s: %s: %s", api, buf, cublasGetStatusName(st));
	return st;
}

static cublasStatus_t bad(const char *api, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cublasStatus_t bad(const char *api, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	cublasStatus_t st = refuse(CUBLAS_STATUS_INVALID_VALUE, api, fmt, ap);
	va_end(ap);
	return st;
}

/* What a handle's creation refuses: no place for the handle, no usable
 * device, a capture in progress (what: the call, and why it may not be
 * captured). */
static cublasStatus_t create_refused(const void *h, const char *what)
{
	if (!h)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (init_error())
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (capturing()) {
		capture_violation(what);
		return CUBLAS_STATUS_NOT_INITIALIZED;
	}
	return CUBLAS_STATUS_SUCCESS;
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
	if (cublasStatus_t st = create_refused(h, "cublasCreate (it allocates device memory)"))
		return st;
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

/* ==== cuBLASLt ==== */

/*
 * The descriptors are host objects, as in the library: creating, setting and
 * destroying them is allowed anywhere (also during capture). What the
 * library documents is checked where it checks it: attribute sizes at the
 * set; the problem (types against the compute type, transposes against the
 * layouts' shapes, ld >= rows, the bias epilogue's pointer and type) by the
 * heuristic and again by cublasLtMatmul; the algorithm's alignments and
 * workspace by cublasLtMatmul. A heuristic query is host work that dp does
 * once per GEMM at load: during a capture it is reported (and the capture
 * invalidated), like cublasLtCreate/Destroy and a cublasLtMatmul without an
 * algorithm (which queries the heuristic itself).
 */

struct cublasLtContext {
	int unused;
};
struct cublasLtMatmulDescEmu {
	cublasComputeType_t compute;
	cudaDataType scale;
	int32_t pointer_mode;
	int32_t ta, tb, tc;
	uint32_t epilogue;
	const void *bias;
	int32_t bias_type; /* -1: D's type */
	const void *aux;   /* the GELU epilogues' matrix */
	int64_t aux_ld;
	int32_t aux_type;  /* -1: D's type */
};
struct cublasLtMatrixLayoutEmu {
	cudaDataType t;
	uint64_t rows, cols;
	int64_t ld;
};
struct cublasLtMatmulPreferenceEmu {
	uint64_t max_ws;
	uint32_t reduction_mask;
	uint32_t align[4]; /* A, B, C, D: the minimum alignment the caller guarantees */
};

template <typename T> static std::set<T *> &live_set()
{
	static std::set<T *> *s = new std::set<T *>;
	return *s;
}
template <typename T> static bool lt_live(T *p)
{
	return p && live_set<T>().count(p);
}
/* A new descriptor holding v, in *out. */
template <typename T> static cublasStatus_t lt_make(T **out, const T &v)
{
	T *x = new T(v);
	live_set<T>().insert(x);
	*out = x;
	return CUBLAS_STATUS_SUCCESS;
}
/* Destroy a descriptor (one destroyed already, or never made: FATAL). */
template <typename T> static cublasStatus_t lt_unmake(T *p, const char *api)
{
	if (!lt_live(p))
		fatal("%s: %p is not a live descriptor (destroyed twice?)", api, (void *)p);
	live_set<T>().erase(p);
	delete p;
	return CUBLAS_STATUS_SUCCESS;
}
template <typename T> static void need_live(T *p, const char *api, const char *what)
{
	if (!lt_live(p))
		fatal("%s: %s %p is not a live descriptor (never created, or destroyed)", api, what,
		      (void *)p);
}

#define LT_ALGO_MAGIC 0x44504c54414c474full /* "DPLTALGO" */
/* What the emulated heuristic decided, kept in cublasLtMatmulAlgo_t.data. */
enum { ALGO_MAGIC, ALGO_PROBLEM, ALGO_ALIGN, ALGO_WS, ALGO_REDUCTION, ALGO_BIAS_ALIGN, ALGO_AUX_ALIGN,
       ALGO_CANDIDATE /* the heuristic's index: j > 0 splits k into j + 1 parts */ };

/* How many candidates the emulated heuristic offers at most: its first
 * (lt_choose's), then split-K variants of it (the heuristic's comment
 * below). */
#define LT_CANDIDATES 4

/* One matmul as the descriptors describe it. */
struct LtProblem {
	int m, n, k;
	cublasOperation_t ta, tb;
	cudaDataType ab, cd;
	cublasComputeType_t compute;
	bool bias;               /* CUBLASLT_EPILOGUE_BIAS: + bias[row of D] */
	int bgrad;               /* 'A' (BGRADA: op(A)'s sums over k, m of them), 'B' (BGRADB: n), 0 */
	int gelu;                /* 'F' (GELU_AUX[_BIAS]: D = gelu(x), aux = x), 'D' (DGELU:
	                            D = product * gelu'(aux)), 0 */
	int aux_ld;
	cudaDataType bias_type;  /* the bias's, or the bias gradient's */
	int vec_len() const { return bgrad == 'B' ? n : m; }
	uint64_t signature() const
	{
		uint64_t h = 1469598103934665603ull;
		for (uint64_t v : {(uint64_t)m, (uint64_t)n, (uint64_t)k, (uint64_t)ta, (uint64_t)tb,
				   (uint64_t)ab, (uint64_t)cd, (uint64_t)compute, (uint64_t)bias,
				   (uint64_t)bgrad, (uint64_t)gelu, (uint64_t)aux_ld})
			h = (h ^ v) * 1099511628211ull;
		return h;
	}
};

static uint32_t lt_align_of(const void *p)
{
	uint32_t r = 256;
	while (r > 1 && (uintptr_t)p % r)
		r /= 2;
	return r;
}

static cublasStatus_t lt_unsupported(const char *api, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static cublasStatus_t lt_unsupported(const char *api, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	cublasStatus_t st = refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, fmt, ap);
	va_end(ap);
	return st;
}

/* The checks cuBLASLt makes of a problem (heuristic and matmul alike). */
static cublasStatus_t lt_problem(const char *api, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
				 cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
				 cublasLtMatrixLayout_t D, LtProblem *p)
{
	need_live(d, api, "the matmul descriptor");
	need_live(A, api, "Adesc");
	need_live(B, api, "Bdesc");
	need_live(C, api, "Cdesc");
	need_live(D, api, "Ddesc");
	bool f32 = A->t == CUDA_R_32F && B->t == CUDA_R_32F && D->t == CUDA_R_32F;
	bool bf = A->t == CUDA_R_16BF && B->t == CUDA_R_16BF && (D->t == CUDA_R_16BF || D->t == CUDA_R_32F);
	bool hf = A->t == CUDA_R_16F && B->t == CUDA_R_16F && (D->t == CUDA_R_16F || D->t == CUDA_R_32F);
	bool c32 = d->compute == CUBLAS_COMPUTE_32F || d->compute == CUBLAS_COMPUTE_32F_PEDANTIC;
	bool fast = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 || d->compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
		    d->compute == CUBLAS_COMPUTE_32F_FAST_16F;
	if (C->t != D->t || d->scale != CUDA_R_32F || !((f32 && (c32 || fast)) || ((bf || hf) && c32)))
		return lt_unsupported(api, "A %s, B %s, C %s, D %s with compute type %d and scale type %s "
				      "is not a supported combination", tname(A->t), tname(B->t),
				      tname(C->t), tname(D->t), (int)d->compute, tname(d->scale));
	if (d->pointer_mode != 0)
		return lt_unsupported(api, "only CUBLASLT_POINTER_MODE_HOST is emulated");
	if (d->tc != CUBLAS_OP_N)
		return bad(api, "CUBLASLT_MATMUL_DESC_TRANSC %d: only CUBLAS_OP_N is supported", d->tc);
	for (const cublasLtMatrixLayoutEmu *l : {A, B, C, D}) {
		const char *nm = l == A ? "A" : l == B ? "B" : l == C ? "C" : "D";
		if (l->rows > INT32_MAX || l->cols > INT32_MAX || l->ld > INT32_MAX)
			return lt_unsupported(api, "%s is %llu x %llu, ld %lld: beyond int32", nm,
					      (unsigned long long)l->rows, (unsigned long long)l->cols,
					      (long long)l->ld);
		if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1))
			return bad(api, "%s: ld %lld < max(1, rows %llu): the columns of the column-major "
				   "matrix overlap", nm, (long long)l->ld, (unsigned long long)l->rows);
	}
	/* D is m x n; op(A) must be m x k and op(B) k x n */
	uint64_t ar = d->ta == CUBLAS_OP_N ? A->rows : A->cols, ac = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
	uint64_t br = d->tb == CUBLAS_OP_N ? B->rows : B->cols, bc = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
	if (ar != D->rows || bc != D->cols || ac != br || C->rows != D->rows || C->cols != D->cols)
		return bad(api, "the transposes and layouts disagree: op%s(A) is %llu x %llu, op%s(B) "
			   "%llu x %llu, C %llu x %llu, D %llu x %llu", d->ta == CUBLAS_OP_N ? "N" : "T",
			   (unsigned long long)ar, (unsigned long long)ac, d->tb == CUBLAS_OP_N ? "N" : "T",
			   (unsigned long long)br, (unsigned long long)bc, (unsigned long long)C->rows,
			   (unsigned long long)C->cols, (unsigned long long)D->rows,
			   (unsigned long long)D->cols);
	uint32_t ep = d->epilogue;
	if (ep != CUBLASLT_EPILOGUE_DEFAULT && ep != CUBLASLT_EPILOGUE_BIAS &&
	    ep != CUBLASLT_EPILOGUE_BGRADA && ep != CUBLASLT_EPILOGUE_BGRADB &&
	    ep != CUBLASLT_EPILOGUE_GELU_AUX && ep != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
	    ep != CUBLASLT_EPILOGUE_DGELU)
		return lt_unsupported(api, "epilogue %u: the emulator has DEFAULT, BIAS, BGRADA, BGRADB, "
				      "GELU_AUX, GELU_AUX_BIAS and DGELU only", ep);
	p->bias = ep == CUBLASLT_EPILOGUE_BIAS || ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
	p->gelu = ep == CUBLASLT_EPILOGUE_DGELU ? 'D'
		  : ep == CUBLASLT_EPILOGUE_GELU_AUX || ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? 'F' : 0;
	p->aux_ld = 0;
	if (p->gelu) {
		/* cublasLt.h: the aux pointer and its leading dimension are
		 * required, the ld "must be divisible by 8 and be no less than
		 * the number of rows in the output matrix"; its type is D's
		 * unless set (another type is FP8's business: not emulated) */
		if (!d->aux)
			return bad(api, "epilogue %u without CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", ep);
		if (d->aux_ld % 8 || d->aux_ld < (int64_t)D->rows || d->aux_ld > INT32_MAX)
			return bad(api, "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD %lld: it must be a multiple of 8 "
				   "and at least D's %llu rows", (long long)d->aux_ld,
				   (unsigned long long)D->rows);
		if (d->aux_type >= 0 && (cudaDataType)d->aux_type != D->t)
			return lt_unsupported(api, "aux type %s with D %s: the emulator has D's type only",
					      tname((cudaDataType)d->aux_type), tname(D->t));
		p->aux_ld = (int)d->aux_ld;
	}
	p->bgrad = d->epilogue == CUBLASLT_EPILOGUE_BGRADA ? 'A' : d->epilogue == CUBLASLT_EPILOGUE_BGRADB ? 'B' : 0;
	p->bias_type = d->bias_type < 0 ? D->t : (cudaDataType)d->bias_type;
	if ((p->bias || p->bgrad) && !d->bias)
		return bad(api, "epilogue %u without CUBLASLT_MATMUL_DESC_BIAS_POINTER", d->epilogue);
	/* cublasLt.h: a bias has D's type, a bias gradient the output's
	 * (Ctype; C and D have one type here) */
	if ((p->bias || p->bgrad) && p->bias_type != D->t)
		return lt_unsupported(api, "%s type %s with D %s: it must have D's type",
				      p->bias ? "bias" : "bias gradient", tname(p->bias_type), tname(D->t));
	p->m = (int)D->rows;
	p->n = (int)D->cols;
	p->k = (int)ac;
	p->ta = (cublasOperation_t)d->ta;
	p->tb = (cublasOperation_t)d->tb;
	p->ab = A->t;
	p->cd = D->t;
	p->compute = d->compute;
	return CUBLAS_STATUS_SUCCESS;
}

/* GELU in its tanh form, as cuBLASLt's (and dp's) */
static float emu_gelu(float x)
{
	return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static float emu_gelu_grad(float x)
{
	float th = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
	float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
	return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

/* The GELU epilogues on the fp32 result out (ld, m x n, column-major):
 * 'F': aux = out in D's type (rounded once), out = gelu(out); 'D': out =
 * out * gelu'(aux), aux read in D's type. D's one rounding follows. */
static void gelu_epilogue(int kind, float *out, int ld, int m, int n, const Operand &aux)
{
	for (int j = 0; j < n; j++)
		for (int i = 0; i < m; i++) {
			float &v = out[(size_t)j * ld + i];
			size_t at = (size_t)j * aux.ld + i;
			if (kind == 'F') {
				set_elt(aux.t, (void *)aux.p, at, v);
				v = emu_gelu(v);
			} else {
				v *= emu_gelu_grad(elt(aux.t, aux.p, at));
			}
		}
}

/* The emulated heuristic: one algorithm, needing exactly the alignments
 * the preference allows (a real heuristic picks the fastest it may, and
 * the fastest assume the most alignment), 1 MiB of workspace when allowed
 * (split-K), the first reduction scheme the mask allows. */
static cublasLtMatmulAlgo_t lt_choose(const LtProblem &p, const cublasLtMatmulPreferenceEmu &pref,
				      const void *bias, size_t *ws)
{
	cublasLtMatmulAlgo_t a;
	memset(&a, 0, sizeof a);
	a.data[ALGO_MAGIC] = LT_ALGO_MAGIC;
	a.data[ALGO_PROBLEM] = p.signature();
	for (int i = 0; i < 4; i++)
		a.data[ALGO_ALIGN] |= (uint64_t)(pref.align[i] & 0xffff) << (16 * i);
	/* the bias vector's alignment: the heuristic "depends on its value to
	 * determine expected pointer alignment" (cublasLt.h) */
	a.data[ALGO_BIAS_ALIGN] = p.bias || p.bgrad ? lt_align_of(bias) : 0;
	*ws = pref.max_ws >= (1u << 20) ? (1u << 20) : 0;
	a.data[ALGO_WS] = *ws;
	uint32_t mask = pref.reduction_mask & CUBLASLT_REDUCTION_SCHEME_MASK;
	a.data[ALGO_REDUCTION] = mask & CUBLASLT_REDUCTION_SCHEME_INPLACE ? CUBLASLT_REDUCTION_SCHEME_INPLACE
				 : mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
				 : mask & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE ? CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
				 : CUBLASLT_REDUCTION_SCHEME_NONE;
	return a;
}

static cublasLtMatmulPreferenceEmu lt_default_pref()
{
	return cublasLtMatmulPreferenceEmu{0, CUBLASLT_REDUCTION_SCHEME_MASK, {256, 256, 256, 256}};
}

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
	EMU_API_ENTRY("cublasLtCreate");
	if (cublasStatus_t st = create_refused(h, "cublasLtCreate (it initialises the library on the device)"))
		return st;
	cublasLtContext *c = new cublasLtContext{0};
	live_set<cublasLtContext>().insert(c);
	*h = c;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
	EMU_API_ENTRY("cublasLtDestroy");
	if (!lt_live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (capturing())
		capture_violation("cublasLtDestroy");
	live_set<cublasLtContext>().erase(h);
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t s)
{
	return cublasGetStatusName(s);
}

const char *cublasLtGetStatusString(cublasStatus_t s)
{
	return cublasGetStatusString(s);
}

size_t cublasLtGetVersion(void)
{
	return CUBLAS_VERSION;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
					cudaDataType scale)
{
	if (!d)
		return CUBLAS_STATUS_INVALID_VALUE;
	switch (compute) {
	case CUBLAS_COMPUTE_32F: case CUBLAS_COMPUTE_32F_PEDANTIC: case CUBLAS_COMPUTE_32F_FAST_TF32:
	case CUBLAS_COMPUTE_32F_FAST_16BF: case CUBLAS_COMPUTE_32F_FAST_16F:
		break;
	default:
		return bad("cublasLtMatmulDescCreate", "compute type %d is not one of the emulated 32F ones",
			   (int)compute);
	}
	return lt_make(d, cublasLtMatmulDescEmu{compute, scale, 0, CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_OP_N,
						 CUBLASLT_EPILOGUE_DEFAULT, nullptr, -1, nullptr, 0, -1});
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
	return lt_unmake(d, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t at,
					      const void *buf, size_t size)
{
	const char *api = "cublasLtMatmulDescSetAttribute";
	need_live(d, api, "the matmul descriptor");
	size_t want = at == CUBLASLT_MATMUL_DESC_BIAS_POINTER || at == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
			      ? sizeof(void *)
		      : at == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD ? sizeof(int64_t)
		      : at == CUBLASLT_MATMUL_DESC_EPILOGUE ? sizeof(uint32_t) : sizeof(int32_t);
	if (!buf || size != want)
		return bad(api, "attribute %d: buf %p, %zu bytes (the attribute has %zu)", (int)at, buf, size,
			   want);
	int32_t v;
	memcpy(&v, buf, sizeof v);
	switch (at) {
	case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: d->compute = (cublasComputeType_t)v; break;
	case CUBLASLT_MATMUL_DESC_SCALE_TYPE: d->scale = (cudaDataType)v; break;
	case CUBLASLT_MATMUL_DESC_POINTER_MODE: d->pointer_mode = v; break;
	case CUBLASLT_MATMUL_DESC_TRANSA:
	case CUBLASLT_MATMUL_DESC_TRANSB:
	case CUBLASLT_MATMUL_DESC_TRANSC:
		if ((unsigned)v > CUBLAS_OP_C)
			return bad(api, "transpose %d is not CUBLAS_OP_N, _T or _C", v);
		(at == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : at == CUBLASLT_MATMUL_DESC_TRANSB ? d->tb : d->tc) =
			v == CUBLAS_OP_C ? CUBLAS_OP_T : v; /* real types: C is T */
		break;
	case CUBLASLT_MATMUL_DESC_EPILOGUE: d->epilogue = (uint32_t)v; break;
	case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&d->bias, buf, sizeof d->bias); break;
	case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: d->bias_type = v; break;
	case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: memcpy(&d->aux, buf, sizeof d->aux); break;
	case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: memcpy(&d->aux_ld, buf, sizeof d->aux_ld); break;
	case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: d->aux_type = v; break;
	default:
		return bad(api, "attribute %d is not emulated", (int)at);
	}
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows,
					  uint64_t cols, int64_t ld)
{
	if (!l)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (t != CUDA_R_32F && t != CUDA_R_16BF && t != CUDA_R_16F)
		return lt_unsupported("cublasLtMatrixLayoutCreate", "type %s is not emulated", tname(t));
	if (ld < 0)
		return bad("cublasLtMatrixLayoutCreate", "ld %lld: only non-negative values are supported",
			   (long long)ld);
	return lt_make(l, cublasLtMatrixLayoutEmu{t, rows, cols, ld});
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
	return lt_unmake(l, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
	if (!p)
		return CUBLAS_STATUS_INVALID_VALUE;
	return lt_make(p, lt_default_pref());
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
	return lt_unmake(p, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
						    cublasLtMatmulPreferenceAttributes_t at,
						    const void *buf, size_t size)
{
	const char *api = "cublasLtMatmulPreferenceSetAttribute";
	need_live(p, api, "the preference");
	size_t want = at == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? sizeof(uint64_t) : sizeof(uint32_t);
	if (!buf || size != want)
		return bad(api, "attribute %d: buf %p, %zu bytes (the attribute has %zu)", (int)at, buf, size,
			   want);
	uint32_t v = 0;
	if (at != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
		memcpy(&v, buf, sizeof v);
	switch (at) {
	case CUBLASLT_MATMUL_PREF_SEARCH_MODE: break;
	case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: memcpy(&p->max_ws, buf, sizeof p->max_ws); break;
	case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: p->reduction_mask = v; break;
	case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
	case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
	case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
	case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
		if (!v || (v & (v - 1)) || v > 256)
			return bad(api, "alignment %u is not a power of two up to 256", v);
		p->align[at - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
		break;
	default:
		return bad(api, "attribute %d is not emulated", (int)at);
	}
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
					      cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
					      cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
					      cublasLtMatmulPreference_t pref, int requested,
					      cublasLtMatmulHeuristicResult_t res[], int *count)
{
	const char *api = "cublasLtMatmulAlgoGetHeuristic";
	EMU_API_ENTRY(api);
	if (!lt_live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (capturing()) {
		capture_violation("cublasLtMatmulAlgoGetHeuristic (algorithms are chosen once, before "
				  "any capture)");
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	if (requested <= 0 || !res || !count)
		return bad(api, "requestedAlgoCount %d, results %p, returnAlgoCount %p", requested,
			   (void *)res, (void *)count);
	need_live(pref, api, "the preference");
	LtProblem p;
	if (cublasStatus_t st = lt_problem(api, d, A, B, C, D, &p))
		return st;
	if ((p.bias || p.bgrad || p.gelu) && !cfg().lt_epilogue) { /* DPEMU_LT_EPILOGUE=0: no kernel for it */
		note("%s: no algorithm for the %s epilogue (DPEMU_LT_EPILOGUE=0), m %d n %d k %d", api,
		     p.gelu ? "GELU" : p.bias ? "bias" : "bias gradient", p.m, p.n, p.k);
		return CUBLAS_STATUS_NOT_SUPPORTED;
	}
	memset(res, 0, sizeof *res);
	res[0].algo = lt_choose(p, *pref, d->bias, &res[0].workspaceSize);
	res[0].algo.data[ALGO_AUX_ALIGN] = p.gelu ? lt_align_of(d->aux) : 0;
	res[0].state = CUBLAS_STATUS_SUCCESS;
	res[0].wavesCount = 1.0f;
	*count = 1;
	/* more candidates when asked (dpexec --gemm-tune): candidate j splits k
	 * into j + 1 parts (k >= 2 (j + 1)), each part's product in f32 added
	 * to the first's in order: the same product in another summation
	 * order (other bits, as a real candidate's tile or split-K gives),
	 * needing m n 4 j bytes of workspace for the partial sums, offered only
	 * where the preference's workspace and reduction schemes allow it (a
	 * 16-bit D: COMPUTE_TYPE, f32 partial sums, the only scheme gemm.cu
	 * allows it) */
	bool split_ok = pref->reduction_mask & (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
						CUBLASLT_REDUCTION_SCHEME_INPLACE);
	for (int j = 1; j < requested && j < LT_CANDIDATES && split_ok; j++) {
		size_t need = (size_t)p.m * (size_t)p.n * 4 * (size_t)j;
		if (p.k < 2 * (j + 1) || need > pref->max_ws)
			break;
		res[j] = res[0];
		res[j].algo.data[ALGO_CANDIDATE] = (uint64_t)j;
		res[j].algo.data[ALGO_WS] = need;
		res[j].workspaceSize = need;
		*count = j + 1;
	}
	return CUBLAS_STATUS_SUCCESS;
}

/* Whether algo (a heuristic's, perhaps from a file) fits this problem:
 * cublasLt.h's INVALID_VALUE when the descriptors do not match the ones it
 * was chosen for, else its workspace. */
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
				       cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
				       cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
				       const cublasLtMatmulAlgo_t *algo,
				       cublasLtMatmulHeuristicResult_t *result)
{
	const char *api = "cublasLtMatmulAlgoCheck";
	EMU_API_ENTRY(api);
	if (!lt_live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!algo || !result)
		return bad(api, "algo %p, result %p", (const void *)algo, (void *)result);
	LtProblem p;
	if (cublasStatus_t st = lt_problem(api, d, A, B, C, D, &p))
		return st;
	if (algo->data[ALGO_MAGIC] != LT_ALGO_MAGIC || algo->data[ALGO_CANDIDATE] >= LT_CANDIDATES)
		return bad(api, "the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned");
	if (algo->data[ALGO_PROBLEM] != p.signature())
		return bad(api, "the algorithm was chosen for another problem");
	memset(result, 0, sizeof *result);
	result->algo = *algo;
	result->workspaceSize = (size_t)algo->data[ALGO_WS];
	result->state = CUBLAS_STATUS_SUCCESS;
	result->wavesCount = 1.0f;
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
			      const void *A, cublasLtMatrixLayout_t Ad, const void *B,
			      cublasLtMatrixLayout_t Bd, const void *beta, const void *C,
			      cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
			      const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
			      cudaStream_t stream)
{
	const char *api = "cublasLtMatmul";
	EMU_API_ENTRY(api);
	if (!lt_live(h))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	LtProblem p;
	if (cublasStatus_t st = lt_problem(api, d, Ad, Bd, Cd, Dd, &p))
		return st;
	cublasLtMatmulAlgo_t chosen;
	if (!algo) {
		if (capturing()) {
			capture_violation("cublasLtMatmul without an algorithm (it queries the heuristic)");
			return CUBLAS_STATUS_NOT_SUPPORTED;
		}
		size_t need;
		chosen = lt_choose(p, lt_default_pref(), d->bias, &need);
		chosen.data[ALGO_AUX_ALIGN] = p.gelu ? lt_align_of(d->aux) : 0;
		algo = &chosen;
	}
	if (algo->data[ALGO_MAGIC] != LT_ALGO_MAGIC || algo->data[ALGO_CANDIDATE] >= LT_CANDIDATES)
		return bad(api, "the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned");
	int splits = (int)algo->data[ALGO_CANDIDATE] + 1;
	bool slow = cfg().lt_slow == (int)algo->data[ALGO_CANDIDATE];
	if (algo->data[ALGO_PROBLEM] != p.signature())
		return bad(api, "the algorithm was chosen for another problem (types, sizes, transposes or "
			   "epilogue changed since the heuristic query)");
	if (!alpha || !beta)
		return bad(api, "alpha or beta is NULL");
	float av, bv;
	memcpy(&av, alpha, 4); /* CUBLASLT_POINTER_MODE_HOST: read at the call */
	memcpy(&bv, beta, 4);
	/* the alignments the algorithm was chosen for (a misaligned operand:
	 * the library refuses the algorithm) */
	const void *ptrs[4] = {A, B, C, D};
	for (int i = 0; i < 4; i++) {
		uint32_t need = (uint32_t)(algo->data[ALGO_ALIGN] >> (16 * i)) & 0xffff;
		if (i == 2 && bv == 0)
			continue; /* C is not read */
		if (lt_align_of(ptrs[i]) < need)
			return lt_unsupported(api, "matrix %c at %s is %u-byte aligned, the algorithm needs "
					      "%u (its heuristic query promised CUBLASLT_MATMUL_PREF_"
					      "MIN_ALIGNMENT_%c_BYTES = %u)", "ABCD"[i],
					      describe(ptrs[i]).c_str(), lt_align_of(ptrs[i]), need,
					      "ABCD"[i], need);
	}
	if ((p.bias || p.bgrad) && lt_align_of(d->bias) < algo->data[ALGO_BIAS_ALIGN])
		return lt_unsupported(api, "the bias vector at %s is %u-byte aligned, the algorithm was "
				      "chosen for the %llu-byte aligned pointer its heuristic query saw",
				      describe(d->bias).c_str(), lt_align_of(d->bias),
				      (unsigned long long)algo->data[ALGO_BIAS_ALIGN]);
	if ((p.bias || p.bgrad) && lt_align_of(d->bias) < 16)
		fatal("%s: the epilogue's vector at %s is %u-byte aligned: its kernels access it 16 "
		      "bytes at a time (on a GPU: a misaligned address fault)", api,
		      describe(d->bias).c_str(), lt_align_of(d->bias));
	if (p.gelu && lt_align_of(d->aux) < algo->data[ALGO_AUX_ALIGN])
		return lt_unsupported(api, "the GELU aux at %s is %u-byte aligned, the algorithm was chosen "
				      "for the %llu-byte aligned pointer its heuristic query saw",
				      describe(d->aux).c_str(), lt_align_of(d->aux),
				      (unsigned long long)algo->data[ALGO_AUX_ALIGN]);
	if (p.gelu && lt_align_of(d->aux) < 16)
		fatal("%s: the GELU epilogue's aux at %s is %u-byte aligned: its kernels access it 16 "
		      "bytes at a time (on a GPU: a misaligned address fault)", api,
		      describe(d->aux).c_str(), lt_align_of(d->aux));
	if (ws_bytes < algo->data[ALGO_WS])
		return bad(api, "workspaceSizeInBytes %zu is less than the algorithm's %llu", ws_bytes,
			   (unsigned long long)algo->data[ALGO_WS]);
	if (ws_bytes) {
		std::string why;
		if (!ws || !device_accessible(ws, ws_bytes, &why))
			fatal("%s: the workspace (%zu bytes at %p) is not device memory: %s", api, ws_bytes,
			      ws, why.c_str());
	}
	if (C == D && (Cd->ld != Dd->ld || Cd->t != Dd->t))
		return bad(api, "in place (C == D) with Cdesc and Ddesc of different ld or type");
	Operand Aop{"A", A, Ad->t, (int)Ad->rows, (int)Ad->cols, (int)Ad->ld, 0};
	Operand Bop{"B", B, Bd->t, (int)Bd->rows, (int)Bd->cols, (int)Bd->ld, 0};
	Operand Cop{"C", C, Cd->t, (int)Cd->rows, (int)Cd->cols, (int)Cd->ld, 0};
	Operand Dop{"D", D, Dd->t, (int)Dd->rows, (int)Dd->cols, (int)Dd->ld, 0};
	Operand Bias{p.bgrad ? "the bias gradient" : "the bias", d->bias, p.bias_type, p.vec_len(), 1,
		     p.vec_len(), 0};
	Operand Aux{"the GELU aux", d->aux, Dd->t, p.m, p.n, p.aux_ld, 0};
	for (const Operand *o : {&Aop, &Bop, &Cop, &Dop, &Bias, &Aux}) {
		if ((o == &Aop || o == &Bop) && !p.k)
			continue;
		if ((o == &Cop && bv == 0) || (o == &Bias && !p.bias && !p.bgrad) || (o == &Aux && !p.gelu))
			continue;
		std::string why;
		if (!device_accessible(o->p, o->extent(), &why))
			fatal("%s: %s (%d x %d, ld %d, column-major) is not inside one device buffer: %s "
			      "(a wrong leading dimension or shape reads past the buffer; on a GPU an "
			      "illegal address)", api, o->name, o->rows, o->cols, o->ld, why.c_str());
	}
	Stream *s = stream_of(stream, api);
	if (!s)
		return CUBLAS_STATUS_INVALID_VALUE;
	const char *tf_env = getenv("NVIDIA_TF32_OVERRIDE");
	bool tf = p.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && p.ab == CUDA_R_32F &&
		  !(tf_env && !strcmp(tf_env, "0"));
	char what[200];
	char cand[24] = ""; /* (the heuristic's first: nothing, as before) */
	if (splits > 1)
		snprintf(cand, sizeof cand, " candidate %d", splits - 1);
	snprintf(what, sizeof what, "%s m %d n %d k %d op %c%c%s%s%s", api, p.m, p.n, p.k,
		 p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', tf ? " tf32" : "",
		 p.gelu == 'D' ? " dgelu" : p.gelu ? (p.bias ? " +bias gelu_aux" : " gelu_aux")
		 : p.bias ? " +bias" : p.bgrad == 'A' ? " bgradA" : p.bgrad == 'B' ? " bgradB" : "", cand);
	auto run = [=]() {
		int m = p.m, n = p.n, k = p.k;
		std::vector<float> ta_, tb_, acc;
		const float *a = k ? as_f32(Aop, 0, tf, ta_) : nullptr;
		const float *b = k ? as_f32(Bop, 0, tf, tb_) : nullptr;
		/* the fp32 result: in D itself when D is fp32 and C is D (the
		 * cublasGemmEx path's arithmetic), else in a copy laid out as D */
		bool direct = Dop.t == CUDA_R_32F && (C == D || bv == 0);
		float *out;
		int ld = Dop.ld;
		if (direct) {
			out = (float *)D;
		} else {
			acc.assign((size_t)ld * n, 0.0f);
			out = acc.data();
			if (bv != 0)
				for (int j = 0; j < n; j++)
					for (int i = 0; i < m; i++) {
						size_t at = (size_t)j * Cop.ld + i;
						acc[(size_t)j * ld + i] = elt(Cop.t, C, at);
					}
		}
		if (slow) /* DPEMU_LT_SLOW: this candidate loses the timing */
			usleep(2000);
		if (k && splits > 1) { /* split-K: part 0 with C, the others added in order */
			std::vector<float> part((size_t)ld * n);
			for (int q = 0; q < splits; q++) {
				int kb = (int)((long long)k * q / splits), kn = (int)((long long)k * (q + 1) / splits) - kb;
				const float *aq = a + (p.ta == CUBLAS_OP_N ? (size_t)kb * Aop.ld : (size_t)kb);
				const float *bq = b + (p.tb == CUBLAS_OP_N ? (size_t)kb : (size_t)kb * Bop.ld);
				cblas_sgemm(CblasColMajor, cb(p.ta), cb(p.tb), m, n, kn, av, aq, Aop.ld, bq,
					    Bop.ld, q ? 0.0f : bv, q ? part.data() : out, ld);
				for (int j = 0; q && j < n; j++)
					for (int i = 0; i < m; i++)
						out[(size_t)j * ld + i] += part[(size_t)j * ld + i];
			}
		} else if (k)
			cblas_sgemm(CblasColMajor, cb(p.ta), cb(p.tb), m, n, k, av, a, Aop.ld, b, Bop.ld, bv,
				    out, ld);
		else
			for (int j = 0; j < n; j++)
				for (int i = 0; i < m; i++)
					out[(size_t)j * ld + i] = bv == 0 ? 0.0f : bv * out[(size_t)j * ld + i];
		if (p.bias) /* the epilogue: + bias[row] in fp32, to the finished product */
			for (int j = 0; j < n; j++)
				for (int i = 0; i < m; i++)
					out[(size_t)j * ld + i] += elt(p.bias_type, Bias.p, i);
		if (p.gelu) /* the epilogue: on the finished fp32 value (after the bias) */
			gelu_epilogue(p.gelu, out, ld, m, n, Aux);
		if (p.bgrad) { /* the epilogue: op(A)'s rows or op(B)'s columns summed over k, in
				  fp32 one term after the other (the compute type; the least
				  accurate order, as a bound on the library's), rounded once */
			const float *x = p.bgrad == 'A' ? a : b;
			const Operand &xo = p.bgrad == 'A' ? Aop : Bop;
			bool tr = (p.bgrad == 'A' ? p.ta : p.tb) != CUBLAS_OP_N;
			int len = p.vec_len();
			for (int i = 0; i < len; i++) {
				float sum = 0.0f;
				for (int l = 0; l < k; l++) /* A: op(A)[i, l]; B: op(B)[l, i] */
					sum += p.bgrad == 'A' ? (tr ? x[(size_t)i * xo.ld + l] : x[(size_t)l * xo.ld + i])
							      : (tr ? x[(size_t)l * xo.ld + i] : x[(size_t)i * xo.ld + l]);
				set_elt(p.bias_type, (void *)Bias.p, i, sum);
			}
		}
		if (direct)
			return;
		for (int j = 0; j < n; j++)
			for (int i = 0; i < m; i++) {
				size_t at = (size_t)j * ld + i;
				set_elt(Dop.t, D, at, acc[at]); /* one rounding */
			}
	};
	if (submit(s, std::make_shared<FnWork>(what, run), api))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
