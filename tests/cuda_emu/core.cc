/*
 * core.cc - the CUDA emulator's process state: configuration from DPEMU_*
 * variables, diagnostics, error values and strings, the emulated device
 * (versions, properties, attributes) and memory.
 *
 * Memory. Device memory is carved from one PROT_NONE reservation: every
 * cudaMalloc gets its own pages, ending at a page boundary (the 256-byte
 * rounded size is flush with it) and followed by an unmapped guard page, so
 * an access past the end faults. Fresh allocations up to 8 MiB are filled
 * with 0xff bytes (NaN as floats): reading memory nobody wrote shows. Freed ranges
 * are never reused (a dangling pointer faults). The pages of live
 * allocations are readable and writable only while device work runs (from
 * the first operation a Session runs to its end): host code touching device memory faults at the instruction,
 * and the SIGSEGV handler names the allocation and exits. How they are
 * closed: with a memory protection key where the CPU and kernel have them
 * (x86 PKU; DPEMU_PKEY=0 says not to), each allocation's pages are tagged
 * with the key once, at cudaMalloc, and opening and closing is a write of
 * the calling thread's key rights (pkey_set: one instruction, no system
 * call); otherwise each live allocation is mprotect'ed at every opening
 * and closing. The mprotect calls were most of the emulator suites' system
 * time (495,613 of them in one 4-rank, 3-step mlp8 case; each one splits or
 * merges the reservation's mappings). Key rights belong to a thread, so with
 * a key the open state and the Session depth are the calling thread's: the
 * emulator runs device work on the thread that calls the API (teardown
 * threads included, each opening for itself), and every other thread
 * (dpexec's CPU pool, OpenBLAS's workers, MPI's) keeps device memory closed
 * throughout, which mprotect could not do. The guard pages and freed
 * ranges are PROT_NONE in both ways. Pinned host
 * memory (cudaMallocHost/cudaHostAlloc) is ordinary host memory that the
 * emulator tracks: asynchronous copies read it when the stream gets there,
 * and kernels may touch it only when it is mapped (cudaHostAllocMapped).
 */
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

namespace emu {

static const size_t PAGE = 4096;
/* Larger allocations start as zeros: filling them would populate pages that
 * every later mprotect then has to walk (a 32 MiB cuBLAS workspace the
 * emulator never touches). */
static const size_t POISON_MAX = 8u << 20;

State &S()
{
	static State *s = new State; /* never destroyed: atexit order is not ours */
	return *s;
}

double now_s()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- configuration ---- */

static Pick pick_env(const char *name, const char *low, const char *high)
{
	const char *v = getenv(name);
	if (!v || !*v || !strcmp(v, "random"))
		return PICK_RANDOM;
	if (!strcmp(v, low))
		return PICK_LOW;
	if (!strcmp(v, high))
		return PICK_HIGH;
	fprintf(stderr, "cuda-emu: %s=%s: expected %s, %s or random\n", name, v, low, high);
	_exit(99);
}

static long long num_env(const char *name, long long def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	long long x = strtoll(v, &end, 10);
	if (*end) {
		fprintf(stderr, "cuda-emu: %s=%s: not a number\n", name, v);
		_exit(99);
	}
	return x;
}

/* MUTANT(name) in the emulated backend (runtime/cuda/mutant.h): whether
 * DPEMU_MUTANT names it; tests/cuda_emu_mutations.sh runs each mutant so */
extern "C" const char *const dpemu_mutant_env = getenv("DPEMU_MUTANT");
extern "C" int dpemu_mutant(const char *name)
{
	const char *m = dpemu_mutant_env;
	return m && !strncmp(name, "mutant:", 7) && !strcmp(m, name + 7);
}

const Config &cfg()
{
	static Config c;
	static bool loaded;
	if (loaded)
		return c;
	loaded = true;
	c.ndev = (int)num_env("DPEMU_DEVICES", 1);
	c.driver = (int)num_env("DPEMU_DRIVER_VERSION", CUDART_VERSION);
	c.seed = (uint64_t)num_env("DPEMU_SEED", 1);
	c.comm = pick_env("DPEMU_COMM", "late", "early");
	c.run = pick_env("DPEMU_RUN", "lazy", "eager");
	c.threads = pick_env("DPEMU_THREADS", "asc", "desc");
	c.blocks = pick_env("DPEMU_BLOCKS", "asc", "desc");
	c.same_buffers = (int)num_env("DPEMU_NCCL_SAME_BUFFERS", 1);
	c.mem_bytes = (size_t)num_env("DPEMU_MEM_GB", 64) << 30;
	c.sm = (int)num_env("DPEMU_SM", 90);
	c.image_sm = (int)num_env("DPEMU_IMAGE_SM", 80);
	c.lt_epilogue = (int)num_env("DPEMU_LT_EPILOGUE", 1);
	c.lt_slow = (int)num_env("DPEMU_LT_SLOW", -1);
	c.nccl_inprogress = pick_env("DPEMU_NCCL_INPROGRESS", "never", "always");
	c.abort_hang_s = (double)num_env("DPEMU_ABORT_HANG_S", 10);
	c.trace = (int)num_env("DPEMU_TRACE", 0);
	c.copy_late = (int)num_env("DPEMU_COPY_LATE", 0);
	c.copy_early = (int)num_env("DPEMU_COPY_EARLY", 0);
	c.profile = (int)num_env("DPEMU_PROFILE", 0);
	c.stall_ranks = 0;
	c.stall_at = -1;
	const char *st = getenv("DPEMU_STALL");
	if (st && *st) { /* RANK[,RANK...]:N */
		const char *p = st;
		char *end;
		for (;;) {
			long r = strtol(p, &end, 10);
			if (end == p || r < 0 || r > 63)
				break;
			c.stall_ranks |= 1ull << r;
			p = end + 1;
			if (*end != ',')
				break;
		}
		if (*end != ':' || sscanf(end + 1, "%ld", &c.stall_at) != 1 || c.stall_at < 1) {
			fprintf(stderr, "cuda-emu: DPEMU_STALL=%s: expected RANK[,RANK...]:N\n", st);
			_exit(99);
		}
	}
	S().rng = c.seed * 0x2545f4914f6cdd1dull;
	return c;
}

/* splitmix64: cheap (thread orders draw one number per thread per round)
 * and seeded by DPEMU_SEED */
uint64_t rnd(uint64_t n)
{
	cfg();
	uint64_t z = (S().rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (uint64_t)(((unsigned __int128)z * n) >> 64);
}

/* ---- diagnostics ---- */

static void vsay(const char *tag, const char *fmt, va_list ap)
{
	char buf[2048];
	vsnprintf(buf, sizeof buf, fmt, ap);
	if (world_rank() >= 0)
		fprintf(stderr, "cuda-emu: [rank %d] %s%s\n", S().world_rank, tag, buf);
	else
		fprintf(stderr, "cuda-emu: %s%s\n", tag, buf);
}

void fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay("FATAL: ", fmt, ap);
	va_end(ap);
	void *frames[32];
	int n = backtrace(frames, 32);
	fprintf(stderr, "cuda-emu: backtrace:\n");
	backtrace_symbols_fd(frames, n, 2);
	fflush(stderr);
	_exit(99);
}

void note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay("", fmt, ap);
	va_end(ap);
}

cudaError_t record(cudaError_t err)
{
	if (err != cudaSuccess)
		S().last_error = err;
	return err;
}

cudaError_t misuse(cudaError_t err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay("", fmt, ap);
	va_end(ap);
	return record(err);
}

cudaError_t init_error()
{
	const Config &c = cfg();
	if (c.driver <= 0 || c.driver < CUDART_VERSION)
		return cudaErrorInsufficientDriver;
	if (c.ndev <= 0)
		return cudaErrorNoDevice;
	return cudaSuccess;
}

/* ---- memory ---- */

static void reserve()
{
	State &s = S();
	if (s.dev_lo)
		return;
	size_t bytes = cfg().mem_bytes + (64u << 20);
	void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		fatal("cannot reserve %zu bytes of address space for device memory", bytes);
	s.dev_lo = s.dev_next = (uintptr_t)p;
	s.dev_hi = s.dev_lo + bytes;
}

static void protect(const Alloc &a, bool open)
{
	if (mprotect((void *)a.map_base, a.map_size, open ? PROT_READ | PROT_WRITE : PROT_NONE))
		fatal("mprotect of allocation #%d failed", a.ordinal);
}

/* The protection key that closes device memory (the top of the file), or
 * -1: mprotect. Chosen once, at the first use. */
static int mem_key()
{
	static int key = -2;
	if (key == -2) {
		const char *v = getenv("DPEMU_PKEY");
		key = v && !strcmp(v, "0") ? -1 : pkey_alloc(0, PKEY_DISABLE_ACCESS);
		if (key < 0)
			key = -1;
	}
	return key;
}
/* With a key: this thread's Sessions and open state (S()'s serve mprotect) */
static thread_local int t_depth;
static thread_local bool t_open;

static bool is_open()
{
	return mem_key() >= 0 ? t_open : S().open;
}

/* Sessions open device memory lazily: a session that runs nothing (a poll
 * that finds nothing ready) costs nothing. */
static void set_open(bool open)
{
	if (mem_key() >= 0) {
		if (t_open != open && pkey_set(mem_key(), open ? 0 : PKEY_DISABLE_ACCESS))
			fatal("pkey_set of key %d failed", mem_key());
		t_open = open;
		return;
	}
	State &s = S();
	if (s.open == open)
		return;
	for (auto &kv : s.allocs)
		if (kv.second.device && kv.second.live)
			protect(kv.second, open);
	s.open = open;
}

static int &session_depth()
{
	return mem_key() >= 0 ? t_depth : S().session_depth;
}

Session::Session()
{
	session_depth()++;
}

Session::~Session()
{
	if (--session_depth() == 0)
		set_open(false);
}

void open_device_memory()
{
	if (session_depth() > 0 && !S().in_host_fn)
		set_open(true);
}

HostSection::HostSection()
{
	set_open(false);
}

HostSection::~HostSection()
{
}

static const Alloc *find(uintptr_t p)
{
	auto &m = S().allocs;
	auto it = m.upper_bound(p);
	if (it == m.begin())
		return nullptr;
	--it;
	const Alloc &a = it->second;
	if (p >= a.map_base && p < a.map_base + a.map_size + (a.device ? PAGE : 0))
		return &a;
	return nullptr;
}

Where classify(const void *ptr)
{
	uintptr_t p = (uintptr_t)ptr;
	State &s = S();
	const Alloc *a = find(p);
	if (p >= s.dev_lo && p < s.dev_hi) {
		if (a && a->live && p >= a->base && p < a->base + (a->size ? a->size : 1))
			return {MEM_DEVICE, a};
		return {MEM_INVALID, a};
	}
	if (a && a->live && p >= a->base && p < a->base + a->size)
		return {MEM_PINNED, a};
	return {MEM_HOST, nullptr};
}

bool within(const Where &w, const void *ptr, size_t n)
{
	if (w.kind == MEM_HOST)
		return true;
	if (!w.alloc || !w.alloc->live)
		return false;
	uintptr_t p = (uintptr_t)ptr;
	return p >= w.alloc->base && p + n <= w.alloc->base + w.alloc->size;
}

std::string describe(const void *ptr)
{
	char buf[256];
	uintptr_t p = (uintptr_t)ptr;
	Where w = classify(ptr);
	const Alloc *a = w.alloc ? w.alloc : find(p);
	if (!a) {
		snprintf(buf, sizeof buf, "%p (%s)", ptr,
			 p >= S().dev_lo && p < S().dev_hi ? "device range, no allocation" : "host memory");
		return buf;
	}
	long long off = (long long)(p - a->base);
	snprintf(buf, sizeof buf, "%p (%s allocation #%d of %zu bytes%s, offset %lld%s)", ptr,
		 a->device ? "device" : (a->flags & cudaHostAllocMapped) ? "mapped pinned" : "pinned",
		 a->ordinal, a->size, a->live ? "" : ", FREED", off,
		 off >= (long long)a->size ? ": past its end" : off < 0 ? ": before its start" : "");
	return buf;
}

bool device_accessible(const void *ptr, size_t n, std::string *why)
{
	Where w = classify(ptr);
	char buf[512];
	if (w.kind == MEM_DEVICE && within(w, ptr, n))
		return true;
	if (w.kind == MEM_PINNED && (w.alloc->flags & cudaHostAllocMapped) && within(w, ptr, n))
		return true;
	const char *what = w.kind == MEM_HOST     ? "pageable host memory"
			   : w.kind == MEM_PINNED ? ((w.alloc->flags & cudaHostAllocMapped)
							     ? "a range running past its pinned allocation"
							     : "pinned host memory not mapped (cudaHostAllocMapped)")
			   : w.kind == MEM_DEVICE ? "a range running past its device allocation"
						  : "not a live device allocation";
	snprintf(buf, sizeof buf, "%zu bytes at %s: %s", n, describe(ptr).c_str(), what);
	if (why)
		*why = buf;
	return false;
}

cudaError_t dev_alloc(void **out, size_t size)
{
	State &s = S();
	reserve();
	*out = nullptr;
	if (size == 0)
		return cudaSuccess;
	size_t rounded = (size + 255) / 256 * 256;
	size_t map = (rounded + PAGE - 1) / PAGE * PAGE;
	if (dev_used() + map > cfg().mem_bytes || s.dev_next + map + PAGE > s.dev_hi)
		return record(cudaErrorMemoryAllocation);
	Alloc a;
	a.map_base = s.dev_next;
	a.map_size = map;
	a.base = a.map_base + map - rounded;
	a.size = size;
	a.ordinal = s.next_ordinal++;
	a.device = true;
	a.flags = 0;
	a.live = true;
	s.dev_next += map + PAGE; /* one guard page after each allocation */
	if (mem_key() >= 0) { /* readable and writable, by the threads the key lets */
		if (pkey_mprotect((void *)a.map_base, a.map_size, PROT_READ | PROT_WRITE, mem_key()))
			fatal("pkey_mprotect of allocation #%d failed", a.ordinal);
		if (map <= POISON_MAX) {
			bool was = t_open;
			set_open(true);
			memset((void *)a.map_base, 0xff, map);
			set_open(was);
		}
	} else if (map <= POISON_MAX) { /* uninitialised device memory reads as NaN */
		protect(a, true);
		memset((void *)a.map_base, 0xff, map);
		if (!s.open)
			protect(a, false);
	} else if (s.open) {
		protect(a, true);
	}
	s.allocs[a.base] = a;
	*out = (void *)a.base;
	return cudaSuccess;
}

cudaError_t dev_free(void *p)
{
	if (!p)
		return cudaSuccess;
	Where w = classify(p);
	if (w.kind != MEM_DEVICE || (uintptr_t)p != w.alloc->base)
		return misuse(cudaErrorInvalidValue, "cudaFree(%s): not the start of a live cudaMalloc "
			      "allocation", describe(p).c_str());
	Alloc &a = S().allocs[w.alloc->base];
	protect(a, false);
	madvise((void *)a.map_base, a.map_size, MADV_DONTNEED);
	a.live = false;
	return cudaSuccess;
}

size_t dev_used()
{
	size_t n = 0;
	for (auto &kv : S().allocs)
		if (kv.second.device && kv.second.live)
			n += kv.second.map_size;
	return n;
}

cudaError_t host_alloc(void **out, size_t size, unsigned flags)
{
	*out = nullptr;
	size_t map = (size ? size : 1) + PAGE - 1;
	map = map / PAGE * PAGE;
	void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return record(cudaErrorMemoryAllocation);
	Alloc a;
	a.map_base = a.base = (uintptr_t)p;
	a.map_size = map;
	a.size = size ? size : 1;
	a.ordinal = S().next_ordinal++;
	a.device = false;
	a.flags = flags;
	a.live = true;
	S().allocs[a.base] = a;
	*out = p;
	return cudaSuccess;
}

cudaError_t host_free(void *p)
{
	if (!p)
		return cudaSuccess;
	Where w = classify(p);
	if (w.kind != MEM_PINNED || (uintptr_t)p != w.alloc->base)
		return misuse(cudaErrorInvalidValue, "cudaFreeHost(%s): not a pinned allocation",
			      describe(p).c_str());
	Alloc &a = S().allocs[w.alloc->base];
	munmap((void *)a.map_base, a.map_size);
	a.live = false;
	return cudaSuccess;
}

/* ---- the fault handler ---- */

/* kernel.cc: what runs now, for messages ("" when no kernel runs) */
std::string kernel_context();
bool fiber_guard(uintptr_t addr);

static struct sigaction old_segv, old_bus;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	State &s = S();
	if (fiber_guard(a))
		fatal("stack overflow of an emulated GPU thread %s(the emulator gives each "
		      "thread 128 KiB of stack)", kernel_context().c_str());
	if (a >= s.dev_lo && a < s.dev_hi) {
		std::string k = kernel_context();
		if (!k.empty())
			fatal("%sillegal device address: %s (an out-of-bounds access; on a GPU "
			      "cudaErrorIllegalAddress)", k.c_str(), describe((void *)a).c_str());
		if (is_open())
			fatal("illegal device address %s during a copy or cuBLAS call",
			      describe((void *)a).c_str());
		fatal("host code touched device memory: %s. Device memory is not host memory: "
		      "copy it with cudaMemcpy", describe((void *)a).c_str());
	}
	struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
	if (old->sa_flags & SA_SIGINFO && old->sa_sigaction) {
		old->sa_sigaction(sig, si, uc);
		return;
	}
	if (old->sa_handler != SIG_IGN && old->sa_handler != SIG_DFL) {
		old->sa_handler(sig);
		return;
	}
	signal(sig, SIG_DFL); /* not ours: die the normal way */
}

__attribute__((constructor)) static void install_handler()
{
	static char altstack[64 * 1024];
	stack_t ss = {};
	ss.ss_sp = altstack;
	ss.ss_size = sizeof altstack;
	sigaltstack(&ss, NULL);
	struct sigaction sa = {};
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
}

/* The build's kernels run on devices of compute capability image_sm and
 * newer (DPEMU_IMAGE_SM: dp's default CUDA_ARCH); on an older one every
 * kernel is refused, as the runtime refuses a kernel without a cubin or PTX
 * for the device. */
bool kernel_image_fits()
{
	return cfg().sm >= cfg().image_sm;
}

} // namespace emu

using namespace emu;

/* ---- errors, versions, the device ---- */

extern "C" {

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = S().last_error;
	S().last_error = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return S().last_error;
}

static const struct {
	cudaError_t e;
	const char *name, *text;
} errors[] = {
	{cudaSuccess, "cudaSuccess", "no error"},
	{cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
	{cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
	{cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
	{cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
	{cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
	{cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
	{cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
	{cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
	{cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
	{cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
	{cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
	{cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
	{cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
	{cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
	{cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
	{cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
	{cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
	{cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
	{cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
	{cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
	{cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
	{cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
	{cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
	{cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
	{cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
	{cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
	{cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
	{cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
	{cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
	{cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
	{cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
	{cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
	{cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
	{cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
	{cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
	{cudaErrorTimeout, "cudaErrorTimeout", "wait operation timed out"},
	{cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorString(cudaError_t e)
{
	for (auto &x : errors)
		if (x.e == e)
			return x.text;
	return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
	for (auto &x : errors)
		if (x.e == e)
			return x.name;
	return "cudaErrorUnknown";
}

cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return record(cudaErrorInvalidValue);
	*v = cfg().driver > 0 ? cfg().driver : 0;
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return record(cudaErrorInvalidValue);
	*v = CUDART_VERSION;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
	EMU_API_ENTRY("cudaGetDeviceCount");
	if (!count)
		return record(cudaErrorInvalidValue);
	*count = 0;
	if (cudaError_t e = init_error())
		return record(e);
	*count = cfg().ndev;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
	EMU_API_ENTRY("cudaSetDevice");
	if (cudaError_t e = init_error())
		return record(e);
	if (d < 0 || d >= cfg().ndev)
		return record(cudaErrorInvalidDevice);
	S().device = d;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
	if (cudaError_t e = init_error())
		return record(e);
	if (!d)
		return record(cudaErrorInvalidValue);
	*d = S().device;
	return cudaSuccess;
}

/* The emulated device: an sm_90 part sized like an H100 SXM. */
static const int SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN = 227 * 1024, SMEM_SM = 228 * 1024;

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	if (cudaError_t e = init_error())
		return record(e);
	if (!p)
		return record(cudaErrorInvalidValue);
	if (d < 0 || d >= cfg().ndev)
		return record(cudaErrorInvalidDevice);
	memset(p, 0, sizeof *p);
	/* DPEMU_SM=70: pose as an older GPU (a V100's compute capability 7.0) */
	long long sm = cfg().sm;
	snprintf(p->name, sizeof p->name, "dp CUDA emulator (sm_%lld, CPU)", sm);
	p->totalGlobalMem = cfg().mem_bytes;
	p->sharedMemPerBlock = SMEM_DEFAULT;
	p->regsPerBlock = 65536;
	p->warpSize = 32;
	p->memPitch = 2147483647; /* 2 GiB - 1: cudaMemcpy2D's pitch limit */
	p->maxThreadsPerBlock = 1024;
	p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	p->maxGridSize[0] = 2147483647;
	p->maxGridSize[1] = p->maxGridSize[2] = 65535;
	p->totalConstMem = 65536;
	p->major = (int)(sm / 10);
	p->minor = (int)(sm % 10);
	p->multiProcessorCount = 132;
	p->canMapHostMemory = 1;
	p->concurrentKernels = 1;
	p->asyncEngineCount = 2;
	p->unifiedAddressing = 1;
	p->l2CacheSize = 50 << 20;
	p->maxThreadsPerMultiProcessor = 2048;
	p->sharedMemPerMultiprocessor = SMEM_SM;
	p->sharedMemPerBlockOptin = SMEM_OPTIN;
	p->pciBusID = d + 1;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d)
{
	struct cudaDeviceProp p;
	if (cudaError_t e = cudaGetDeviceProperties(&p, d))
		return e;
	if (!v)
		return record(cudaErrorInvalidValue);
	switch (attr) {
	case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
	case cudaDevAttrMaxBlockDimX: *v = p.maxThreadsDim[0]; break;
	case cudaDevAttrMaxGridDimX: *v = p.maxGridSize[0]; break;
	case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
	case cudaDevAttrWarpSize: *v = 32; break;
	case cudaDevAttrMaxPitch: *v = (int)p.memPitch; break;
	case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
	case cudaDevAttrCanMapHostMemory: *v = 1; break;
	case cudaDevAttrUnifiedAddressing: *v = 1; break;
	case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
	case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)p.sharedMemPerMultiprocessor; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
	default:
		return misuse(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not "
			      "emulated", (int)attr);
	}
	return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *freeb, size_t *total)
{
	EMU_API_ENTRY("cudaMemGetInfo");
	if (cudaError_t e = init_error())
		return record(e);
	if (!freeb || !total)
		return record(cudaErrorInvalidValue);
	*total = cfg().mem_bytes;
	*freeb = *total - dev_used();
	return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
	EMU_API_ENTRY("cudaFuncGetAttributes");
	if (cudaError_t e = init_error())
		return record(e);
	if (!attr)
		return record(cudaErrorInvalidValue);
	if (!func)
		return misuse(cudaErrorInvalidDeviceFunction, "cudaFuncGetAttributes: NULL function");
	if (!kernel_image_fits())
		return record(cudaErrorNoKernelImageForDevice);
	memset(attr, 0, sizeof *attr);
	attr->maxThreadsPerBlock = 1024;
	attr->binaryVersion = cfg().sm >= 90 ? 90 : cfg().image_sm;
	attr->ptxVersion = 90;
	auto lim = S().func_smem.find(func);
	attr->maxDynamicSharedSizeBytes = lim != S().func_smem.end() ? lim->second : 48 * 1024;
	return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
	EMU_API_ENTRY("cudaFuncSetAttribute");
	if (cudaError_t e = init_error())
		return record(e);
	if (!func)
		return misuse(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: NULL function");
	if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
		if (value < 0 || value > SMEM_OPTIN)
			return misuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: "
				      "MaxDynamicSharedMemorySize %d is above the device's %d bytes",
				      value, SMEM_OPTIN);
		S().func_smem[func] = value;
		return cudaSuccess;
	}
	if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
		return value >= -1 && value <= 100 ? cudaSuccess : record(cudaErrorInvalidValue);
	return record(cudaErrorInvalidValue);
}

cudaError_t cudaMalloc(void **p, size_t size)
{
	EMU_API_ENTRY("cudaMalloc");
	if (cudaError_t e = init_error())
		return record(e);
	if (!p)
		return record(cudaErrorInvalidValue);
	if (capturing())
		return capture_violation("cudaMalloc");
	return dev_alloc(p, size);
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
	EMU_API_ENTRY("cudaMallocHost");
	if (cudaError_t e = init_error())
		return record(e);
	if (!p)
		return record(cudaErrorInvalidValue);
	if (capturing())
		return capture_violation("cudaMallocHost");
	return host_alloc(p, size, cudaHostAllocDefault);
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
	EMU_API_ENTRY("cudaHostAlloc");
	if (cudaError_t e = init_error())
		return record(e);
	if (!p || (flags & ~0x7u))
		return record(cudaErrorInvalidValue);
	if (capturing())
		return capture_violation("cudaHostAlloc");
	return host_alloc(p, size, flags);
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
	EMU_API_ENTRY("cudaHostGetDevicePointer");
	if (cudaError_t e = init_error())
		return record(e);
	if (!dev || flags)
		return record(cudaErrorInvalidValue);
	Where w = classify(host);
	if (w.kind != MEM_PINNED || !(w.alloc->flags & cudaHostAllocMapped))
		return misuse(cudaErrorInvalidValue, "cudaHostGetDevicePointer(%s): not memory from "
			      "cudaHostAlloc(..., cudaHostAllocMapped)", describe(host).c_str());
	*dev = host; /* unified addressing: the same address */
	return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *ptr)
{
	EMU_API_ENTRY("cudaPointerGetAttributes");
	if (cudaError_t e = init_error())
		return record(e);
	if (!at)
		return record(cudaErrorInvalidValue);
	Where w = classify(ptr);
	memset(at, 0, sizeof *at);
	at->device = S().device;
	switch (w.kind) {
	case MEM_DEVICE:
		at->type = cudaMemoryTypeDevice;
		at->devicePointer = (void *)ptr;
		break;
	case MEM_PINNED:
		at->type = cudaMemoryTypeHost;
		at->hostPointer = (void *)ptr;
		if (w.alloc->flags & cudaHostAllocMapped)
			at->devicePointer = (void *)ptr;
		break;
	case MEM_INVALID:
		return misuse(cudaErrorInvalidValue, "cudaPointerGetAttributes(%s)",
			      describe(ptr).c_str());
	default:
		at->type = cudaMemoryTypeUnregistered;
		at->device = -2;
		break;
	}
	return cudaSuccess;
}

} // extern "C"
