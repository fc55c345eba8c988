/*
 * emu.h - the CUDA emulator's internals (tests/cuda_emu; test code, never
 * shipped as a backend). The emulator runs the real runtime/cuda sources on
 * the CPU: libdpcuda.so built by `make cuda-emu` links these files in place
 * of cudart, cuBLAS and NCCL. docs/CUDA-EMU.md is the user's page; this
 * header is the map of the implementation:
 *
 *   core.cc    process state, configuration (DPEMU_* variables), errors,
 *              device and pinned memory (device memory is PROT_NONE to the
 *              host outside device work), the fault handler
 *   sched.cc   streams as queues and events as edges, the adversarial
 *              scheduler, copies/sets/host functions, stream capture and
 *              graphs, and the runtime API over them
 *   kernel.cc  kernels: blocks in turn, threads as fibers (switch.S),
 *              __syncthreads, warp primitives with mask checks
 *   cublas.cc  the cuBLAS subset over OpenBLAS
 *   nccl.cc    the NCCL subset over MPI
 *
 * The emulator is a process-wide runtime, like the CUDA runtime it stands
 * for: its state is one struct (State, S()). It is single-threaded: every
 * API call runs on the caller's thread, and device work runs inside API
 * calls (at enqueue when the scheduler chooses to, at queries, at waits).
 * One exception, as NCCL allows it: ncclCommAbort of different
 * communicators from several threads at once (nccl.cc serialises them with
 * a lock, and while one runs any other API call is FATAL).
 */
#ifndef DPEMU_EMU_H
#define DPEMU_EMU_H

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "include/cuda_runtime_api.h"

namespace emu {

/* ---- diagnostics (core.cc) ---- */

/* "cuda-emu: FATAL: ..." on stderr, a backtrace, exit status 99: what
 * hardware would turn into a fault, a hang or undefined behaviour. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "cuda-emu: ..." on stderr. */
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A misuse the real call would reject: say why, record it as the last
 * error, return it. */
cudaError_t misuse(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Record err as the last error (cudaSuccess records nothing); return it. */
cudaError_t record(cudaError_t err);
/* The error every call returns before a device exists (no driver, driver
 * too old, no device), else cudaSuccess. */
cudaError_t init_error();
/* The build's kernels have an image for the emulated device (DPEMU_SM >=
 * DPEMU_IMAGE_SM); else every launch is cudaErrorNoKernelImageForDevice. */
bool kernel_image_fits();

/* ---- configuration (DPEMU_* environment variables, read once) ---- */

enum Pick { PICK_RANDOM, PICK_LOW, PICK_HIGH };
struct Config {
	int ndev;              /* DPEMU_DEVICES (1) */
	int driver;            /* DPEMU_DRIVER_VERSION (13000; 0: no driver) */
	uint64_t seed;         /* DPEMU_SEED (1) */
	Pick comm;             /* DPEMU_COMM: late (LOW) | early (HIGH) | random */
	Pick run;              /* DPEMU_RUN: lazy (LOW) | eager (HIGH) | random */
	Pick threads;          /* DPEMU_THREADS: asc (LOW) | desc (HIGH) | random */
	Pick blocks;           /* DPEMU_BLOCKS: asc | desc | random */
	uint64_t stall_ranks;  /* DPEMU_STALL=RANK[,RANK...]:N: these world ranks' devices */
	long stall_at;         /*   stop at their N-th collective (1-based); -1 none */
	int same_buffers;      /* DPEMU_NCCL_SAME_BUFFERS (1): ranks pass the same arena offsets */
	size_t mem_bytes;      /* DPEMU_MEM_GB (64): device memory */
	int sm;                /* DPEMU_SM (90): the compute capability, major * 10 + minor */
	int lt_epilogue;       /* DPEMU_LT_EPILOGUE (1); 0: cuBLASLt's heuristic has no
	                          algorithm for a bias epilogue (CUBLAS_STATUS_NOT_SUPPORTED) */
	int lt_slow;           /* DPEMU_LT_SLOW (-1): the heuristic's candidate of this index
	                          (0: its first) sleeps 2 ms per call, so that timing them
	                          (dpexec --gemm-tune) has a loser to avoid */
	int image_sm;          /* DPEMU_IMAGE_SM (80): the oldest compute capability the
	                          build's kernels run on (mk/cuda.mk's default CUDA_ARCH:
	                          sm_80 and sm_90 cubins, compute_90 PTX) */
	Pick nccl_inprogress;  /* DPEMU_NCCL_INPROGRESS: never (LOW) | always (HIGH) | random:
	                          whether a collective on a non-blocking communicator
	                          returns ncclInProgress (enqueued later, "by NCCL's
	                          helper thread", once ncclCommGetAsyncError settles it) */
	double abort_hang_s;   /* DPEMU_ABORT_HANG_S (10): an ncclCommAbort that has waited
	                          this long without any device work completing is the
	                          hang it is on hardware: FATAL */
	int trace;             /* DPEMU_TRACE (0): print every executed operation */
	int copy_late;         /* DPEMU_COPY_LATE (0): 1 runs a ready cudaMemcpyAsync only
	                          when nothing else is ready (a copy as late as the
	                          events allow: a reader that does not wait for it
	                          reads the old bytes) */
	int copy_early;        /* DPEMU_COPY_EARLY (0): 1 runs a ready cudaMemcpyAsync before
	                          anything else ready (a copy as early as the events
	                          allow: a copy that waits for the wrong event reads
	                          what its producer has not written yet) */
	int profile;           /* DPEMU_PROFILE (0): time per kind of work, at exit */
};
const Config &cfg();

/* ---- memory (core.cc) ---- */

struct Alloc {
	uintptr_t base;        /* what the caller got */
	size_t size;
	uintptr_t map_base;    /* whole pages: [map_base, map_base + map_size) */
	size_t map_size;
	int ordinal;           /* allocation order (the same on every rank) */
	bool device;           /* else pinned host memory */
	unsigned flags;        /* cudaHostAlloc flags */
	bool live;
};
enum MemKind {
	MEM_HOST,    /* pageable host memory (anything the emulator did not allocate) */
	MEM_PINNED,  /* cudaMallocHost / cudaHostAlloc */
	MEM_DEVICE,  /* a live cudaMalloc allocation */
	MEM_INVALID  /* in the device range, but not in a live allocation */
};
struct Where {
	MemKind kind;
	const Alloc *alloc;   /* the allocation (live or freed), or NULL */
};
Where classify(const void *p);
/* [p, p + n) lies in one live allocation of the kind classify found. */
bool within(const Where &w, const void *p, size_t n);
/* Device code may touch [p, p + n): device memory or mapped pinned memory.
 * Else false with a sentence in why. */
bool device_accessible(const void *p, size_t n, std::string *why);
/* "allocation #3 (4096 bytes, device) + 0x40" */
std::string describe(const void *p);
cudaError_t dev_alloc(void **p, size_t size);
cudaError_t dev_free(void *p);
cudaError_t host_alloc(void **p, size_t size, unsigned flags);
cudaError_t host_free(void *p);
size_t dev_used();

/* Device memory is host-accessible only while a Session is alive (the
 * scheduler runs device work inside one); host code touching it otherwise
 * faults, and the fault handler names the allocation. */
struct Session {
	Session();
	~Session();
};
/* Device work is about to touch device memory: open it (inside a Session;
 * it stays open until the outermost Session ends). */
void open_device_memory();
/* Inside a Session, host-side work (a host function) runs with device
 * memory protected again. */
struct HostSection {
	HostSection();
	~HostSection();
};

/* ---- work and the scheduler (sched.cc) ---- */

struct Op;
using OpRef = std::shared_ptr<Op>;
struct NcclComm;

/* What an operation does. One Work is shared by a stream operation or by a
 * graph node and all its replays; per-execution state lives in Op::flight. */
struct Work {
	virtual ~Work() {}
	virtual std::string what() const = 0;
	/* Run. true: done; false: in flight (poll until ready, then finish). */
	virtual bool start(Op &op) = 0;
	virtual bool poll(Op &op) { return true; }
	virtual void finish(Op &op) {}
	/* May it start now? (a collective: its turn on its communicator) */
	virtual bool can_start(Op &op) { return true; }
	/* Called once when an Op is made from this work (issue order). */
	virtual void issued(Op &op) {}
	virtual NcclComm *comm() const { return nullptr; }
};

struct Op {
	uint64_t seq;                  /* issue order */
	std::shared_ptr<Work> work;
	std::vector<OpRef> deps;       /* cleared as they complete */
	enum State { PENDING, FLIGHT, FINISHABLE, DONE } state = PENDING;
	int stream_id;
	std::shared_ptr<void> flight;  /* per-execution state of a Work */
	uint64_t comm_seq = 0;         /* a collective's index on its communicator */
	bool stalled = false;          /* DPEMU_STALL: never starts */
	double done_at = 0;            /* host seconds (cudaEventElapsedTime) */
};

struct Capture;
struct Stream {
	int id;
	unsigned flags;
	bool legacy;
	int priority;                  /* lower is higher; 0 the default (no effect on the
	                                  emulated order: a scheduling hint on GPUs) */
	OpRef last;                    /* the latest operation (implicit dependency) */
	Capture *cap = nullptr;        /* capturing into this capture */
	std::vector<int> cap_deps;     /* nodes the next captured operation depends on */
	NcclComm *nccl_pending = nullptr; /* a collective on this stream returned
	                                     ncclInProgress and is not enqueued yet */
};
struct Event {
	unsigned flags;
	OpRef rec;                     /* the latest record outside capture */
	Capture *cap = nullptr;        /* the latest record was in this capture */
	uint64_t cap_id = 0;
	std::vector<int> cap_nodes;
};

struct Node {
	std::shared_ptr<Work> work;
	std::vector<int> deps;
	int stream_id;
};
struct GraphData {
	std::vector<Node> nodes;
	std::set<NcclComm *> comms;    /* communicators the graph captured */
};
struct Capture {
	uint64_t id;
	Stream *origin;
	cudaStreamCaptureMode mode;
	std::shared_ptr<GraphData> g;
	bool invalid = false;
	std::string why;
	std::set<Stream *> members;
};

/* The stream a handle names (0, cudaStreamLegacy, cudaStreamPerThread: the
 * legacy stream), or NULL after recording cudaErrorInvalidResourceHandle. */
Stream *stream_of(cudaStream_t h, const char *api);
/* Enqueue work on a stream, or record it as a node when the stream is
 * capturing. cudaSuccess or the error (recorded). */
cudaError_t submit(Stream *s, std::shared_ptr<Work> w, const char *api);
/* Run device work until done() (a blocking wait: a stalled device blocks
 * forever, as a hung GPU would). target: the operation waited for (the
 * lazy policy runs only what it depends on), or NULL. */
void run_until(const std::function<bool()> &done, const OpRef &target, const char *api);
/* A synchronous call during a capture in global or thread-local mode:
 * invalidate the capture, say why, and return the error to return. */
cudaError_t capture_violation(const char *api);
bool capturing();
/* Make the comm graph references of a graph's communicators follow its
 * lifetime (nccl.cc): graph and graph exec objects (graph_ref), and each
 * launch until its last node completes (launch_ref: a destroyed graph exec
 * keeps its in-flight launches, and NCCL waits for them). */
void comm_graph_ref(NcclComm *c, int delta);
void comm_launch_ref(NcclComm *c, int delta);
/* May this thread run or poll a collective of c now? Aborted ones always
 * (they end without results); others only on MPI's main thread, the one
 * that may call MPI (nccl.cc). */
bool collective_may_run(NcclComm *c);
/* One scheduling decision inside a Session: true when something ran or
 * finished (nccl.cc's abort waits with it). */
bool run_one();
/* What the device has not done yet, for messages (the first few operations). */
std::string pending_ops_text();
/* Work submitted to a stream on which a collective is still ncclInProgress
 * is FATAL (NCCL: no work on its streams until the communicator's state is
 * ncclSuccess). */
void stream_free_check(const Stream *s, const char *api);
/* The calling thread is a teardown thread (inside ncclCommAbort or a graph
 * destroy, a Teardown below); while any is, every API call from another
 * thread is FATAL. */
bool in_abort_thread();
/* Teardown (nccl.cc). On hardware ncclCommAbort raises its communicator's
 * abort flag and then waits until every CUDA graph that captured the
 * communicator is destroyed and every launch of one has completed; and
 * cudaGraphExecDestroy of an exec whose launch is still running waits for
 * that launch (seen on the H200, driver 580: a rank's main thread blocked
 * in cuGraphExecDestroy while the graph's NCCL kernel waited on a stopped
 * peer; docs/CUDA.md). Each waits for the other, so dp raises every abort
 * flag first, on threads of their own, and destroys the graph beside them.
 * A Teardown marks the calling thread as one of those (in_abort_thread;
 * S().aborting counts them) and holds the teardown lock for its lifetime;
 * teardown_wait runs device work under it until done(), letting the other
 * teardown threads in between, and is FATAL with hang()'s text when
 * nothing ran and progress() did not change for DPEMU_ABORT_HANG_S
 * seconds: the hang it would be on hardware. */
struct Teardown {
	Teardown();
	~Teardown();
	std::unique_lock<std::mutex> lock;
	bool was;
};
void teardown_wait(Teardown &t, const std::function<bool()> &done, const std::function<long()> &progress,
		   const std::function<std::string()> &hang);

/* A Work from a closure (cuBLAS, zero-size marks). */
struct FnWork : Work {
	std::string name;
	std::function<void()> fn;
	FnWork(std::string n, std::function<void()> f) : name(std::move(n)), fn(std::move(f)) {}
	std::string what() const override { return name; }
	bool start(Op &) override
	{
		if (fn)
			fn();
		return true;
	}
};

/* ---- process state ---- */

struct State {
	cudaError_t last_error = cudaSuccess;
	int device = 0;
	int world_rank = -1;           /* MPI_COMM_WORLD rank, once MPI is up */

	/* memory */
	uintptr_t dev_lo = 0, dev_hi = 0, dev_next = 0;
	std::map<uintptr_t, Alloc> allocs;   /* live and freed, by base */
	int next_ordinal = 0;
	int session_depth = 0;
	bool open = false;                   /* device memory is host-accessible now */

	/* scheduling */
	Stream legacy{0, 0, true, 0, nullptr, nullptr, {}};
	std::set<Stream *> streams;
	std::set<Event *> events;
	std::set<std::shared_ptr<GraphData> *> graphs, execs;
	std::vector<OpRef> pending;          /* not done, in issue order */
	uint64_t op_seq = 0;
	int next_stream_id = 1;
	uint64_t rng = 0;                    /* splitmix64 state (rnd) */
	Capture *capture = nullptr;          /* one capture at a time */
	uint64_t capture_ids = 0;
	std::map<const void *, int> func_smem; /* cudaFuncSetAttribute */
	bool in_host_fn = false;
	long collectives_started = 0;        /* for DPEMU_STALL */
	bool stall_noted = false;
	std::atomic<int> aborting{0};        /* teardown threads (Teardown) */
	std::map<const void *, int> exec_launches; /* graph exec -> launches not completed */
};
State &S();
/* This process's MPI_COMM_WORLD rank once MPI is up, else -1 (nccl.cc). */
int world_rank();
/* A uniform draw in [0, n). */
uint64_t rnd(uint64_t n);
double now_s();

} // namespace emu

/* Every API entry point: refuses calls from a host function, which CUDA
 * forbids to call the runtime. */
#define EMU_API_ENTRY(name)                                                                    \
	do {                                                                                   \
		if (emu::S().in_host_fn)                                                       \
			emu::fatal("%s called from a host function (cudaLaunchHostFunc): CUDA " \
				   "forbids runtime calls there", name);                          \
		if (emu::S().aborting.load() > 0 && !emu::in_abort_thread())                  \
			emu::fatal("%s called while another thread is inside ncclCommAbort: the " \
				   "emulator runs concurrent aborts only", name);                 \
	} while (0)

#endif
