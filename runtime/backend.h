/*
 * backend.h - the compute-backend interface of dpexec: what CommOps is for
 * communication, BackendOps is for computation. The executor (exec.c)
 * walks a program once for every backend and hands each instruction to the
 * backend through this table; a backend never sees the walk, the data
 * loader, the hooks or the mesh logic, and never borrows another backend's
 * checks.
 *
 * A backend owns: its memory (one arena per rank, every tensor at its
 * planned offset: Backend.ptr), an opcode-indexed kernel table (every
 * DP_OPC_KERNEL opcode it implements; one missing is refused at load by the
 * executor, naming the op), the load-time check of its own limits (BLAS int
 * sizes, dtypes it cannot do; the operand rules are the step-file
 * decoder's), and the copies between host memory and its memory.
 *
 * One shape for every backend: each fills every member below, except two
 * optional groups: the graph members (a backend without graphs has all
 * three NULL, and the executor then enqueues every step) and the device
 * timing members (without them, dpexec --trace wants BACKEND_INLINE). The executor's walk is the same for all: run_begin, each
 * instruction through kernel / upload / copy2d / event_record / event_wait /
 * collective (or read / write for INIT and SAVE), run_end, and sync.
 *  - Streams. Calls enqueue work on the instruction's stream, in order;
 *    cross-stream order comes only from events (exec.h says what they
 *    mean). The fork/join of the streams around a program run is
 *    run_begin/run_end; sync() waits for everything issued, under the
 *    --timeout watchdog. A backend chooses how its streams run: the CUDA
 *    backend's are CUDA streams; the CPU backend runs them inline
 *    (BACKEND_INLINE: each call has done its work when it returns, except
 *    collectives, which it starts non-blocking on the MPI comm backend and
 *    progresses between instructions), and checks on the host what a GPU
 *    would race on (cpu/streams.c).
 *  - Collectives go one route: executor -> the backend's collective() ->
 *    its comm backend: MPI's CommOps (comm.h) on the CPU; on CUDA the
 *    backend's own NCCL communicators, one per stream and axis mask (a
 *    CommOps start has no stream, and NCCL serialises a communicator's
 *    work, so NCCL lives in the backend, not behind CommOps).
 *  - Graphs. With the graph members the executor captures one whole
 *    optimizer step once and replays it every step; nothing captured may
 *    depend on a host value that changes between steps (set_step happens
 *    outside the capture; step_head derives lr and t on the device).
 *
 * The CPU backend is linked into dpexec (backend_cpu()); the CUDA backend is
 * a shared object that exports `dp_cuda_backend` (a const BackendOps) and
 * is loaded with dlopen (backend_load_cuda), so dpexec itself never links
 * a CUDA library. DP_BACKEND_ABI guards the layout of these structs across
 * that boundary. Nothing outside a backend asks which backend it has: what
 * differs is said by the table (flags, fallback, describe's answer).
 *
 * Every int function returns 0, or -1 with an RtErr.
 */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "amp.h"
#include "comm.h"
#include "rt.h"

/* Bump when BackendOps, Backend, BackendOpts, Comm or the step-file structs change. */
#define DP_BACKEND_ABI (2400u + DP_STEP_VERSION)

/* BackendOps.flags */
enum {
	/* Work is done when the call that enqueues it returns (the CPU's streams
	 * run inline; only collectives may still be in flight, until an event
	 * wait or run_end): a launched step has finished, exec_prefetch has
	 * nothing to overlap, and the host's clock times each instruction
	 * (dpexec --trace). */
	BACKEND_INLINE = 1u << 0,
};

typedef struct Backend Backend;
typedef struct BackendOps BackendOps;

/* The CPU's kernels for a backend's host step (offload, docs/OFFLOAD.md):
 * the instructions whose operands lie in the host arena (dp_runs_on_host)
 * run on the host through the CPU backend's own kernel table, inner loops
 * and threads, so their arithmetic is the CPU backend's bit for bit
 * (runtime/cpu/core.c). One caller at a time per HostKernels. */
typedef struct HostKernels HostKernels;
typedef struct {
	/* For step s's host instructions over the tensor addresses ptr (the
	 * backend's: those in the host arena host memory); ptr must outlive it. */
	int (*open)(HostKernels **out, const DpStep *s, void *const *ptr, RtErr *e);
	/* One host instruction, with the optimizer step's lr and t (from 1). */
	int (*run)(HostKernels *h, const DpInstr *in, float lr, int64_t t, RtErr *e);
	void (*close)(HostKernels *h);
} HostKernelOps;

/* What the executor tells a backend at init. */
typedef struct {
	int local_rank;   /* this rank's index among the ranks of its node: picks the device */
	int no_graph;     /* 1: enqueue every optimizer step eagerly (no graph replay) */
	double timeout_s; /* > 0: a wait longer than this fails and aborts the collectives */
	int no_progress;  /* 1: do not progress collectives between instructions; they advance
	                     only when waited for (dpexec --no-progress, to measure overlap;
	                     a backend whose collectives progress by themselves ignores it) */
	const HostKernelOps *host; /* the CPU's kernels, for a host step (offload); a
	                              backend whose memory is host memory ignores it */
	int gemm_tune;              /* dpexec --gemm-tune: 1 on (a backend with a choice of
	                               GEMM algorithms times them at load), 0 off */
	const char *gemm_tune_file; /* ... and its cache file, or NULL */
} BackendOpts;

/* Where the executor's walk is, set before each instruction's call (valid
 * between run_begin and run_end): for messages, hazard checks and the
 * watchdog. */
typedef struct {
	int prog;       /* DpProgram */
	uint32_t instr; /* index in the program */
	int micro;      /* micro-batch of the step program */
} BackendAt;

struct Backend {
	const BackendOps *ops;
	const DpStep *s;
	Comm *comm;       /* mesh coordinates, group sizes and ranks; the MPI comm */
	void **ptr;       /* [ntensors]: tensor i's address in the backend's memory,
	                     NULL without storage; set by init */
	BackendAt at;
	void *impl;       /* the backend's own state */
	/* set by the executor before set_step, with loss scaling (amp.h): */
	int amp_set;      /* 1: set_step takes amp as its loss-scaling state (the first
	                     step, a resume) and clears it; 0: the backend's own state,
	                     which every step it ran updated, stands */
	AmpState amp;
};

/* What step k left for the host (step_wait): its metrics and, with loss
 * scaling, what the step did with the scale. */
typedef struct {
	float loss;       /* the loss metric (0 when the step file has none) */
	float grad_norm;  /* the grad-norm metric (0 when none) */
	float amp_scale;  /* the scale the step ran with */
	int amp_skip;     /* 1: its AMP_CHECK found the norm not finite: no update */
	AmpState amp;     /* the loss-scaling state after the step */
} BackendReport;

struct BackendOps {
	const char *name; /* "cpu", "cuda": --device names it */
	unsigned abi;     /* DP_BACKEND_ABI of the build */
	unsigned flags;   /* BACKEND_* */
	/* The --device to suggest when this backend has no kernel for an op
	 * ("cpu"); NULL: none (the reference backend). */
	const char *fallback;

	/* ---- before init: no device state (tests call these) ---- */
	/* Usable devices (> 0); 0 with the reason in why when there is none
	 * (--device auto then runs on the CPU); -1 with the reason when a device
	 * is there but this backend cannot use it (a driver older than the
	 * runtime it was built with): an error, even for --device auto. */
	int (*probe)(char *why, size_t len);
	/* The kernel table: 1 when the backend runs compute opcode op. */
	int (*has_kernel)(unsigned op);
	/* The backend's own limits for one compute instruction it has a kernel
	 * for, at load time (the executor checked presence and ranges). */
	int (*check)(const DpStep *s, const DpInstr *in, RtErr *e);

	/* ---- lifetime ---- */
	/* Device, memory (b->ptr), streams, handles. b->ops, s and comm are set. */
	int (*init)(Backend *b, const BackendOpts *o, RtErr *e);
	/* One line about the device into buf; returns 1 when every run's log
	 * should show it, 0 when only --verbose asks for it. */
	int (*describe)(Backend *b, char *buf, size_t len);
	/* A failing rank, before MPI_Abort: stop collectives without waiting.
	 * free() must still be safe afterwards. */
	void (*abort)(Backend *b);
	/* Waits for issued work (unless aborted), then releases everything. */
	void (*free)(Backend *b);

	/* ---- work in stream order ---- */
	int (*kernel)(Backend *b, const DpInstr *in, RtErr *e);
	/* bytes from host memory into dst (a backend address); the host memory
	 * (from host_alloc, for a capturable copy) must not change until the
	 * stream has passed this point. */
	int (*upload)(Backend *b, unsigned stream, void *dst, const void *host, size_t bytes,
		      RtErr *e);
	/* rows of width bytes, backend memory to backend memory, row r from
	 * src + r*spitch to dst + r*dpitch (regions may overlap: memmove). */
	int (*copy2d)(Backend *b, unsigned stream, void *dst, size_t dpitch, const void *src,
		      size_t spitch, size_t width, size_t rows, RtErr *e);
	int (*zero)(Backend *b, unsigned stream, void *dst, size_t bytes, RtErr *e);

	/* ---- host <-> backend, after every issued piece of work (synchronous) ---- */
	int (*read)(Backend *b, const void *src, void *host, size_t bytes, RtErr *e);
	int (*write)(Backend *b, void *dst, const void *host, size_t bytes, RtErr *e);
	/* Host memory for batches that upload reads (pinned on a GPU); NULL
	 * when out of memory. */
	void *(*host_alloc)(Backend *b, size_t bytes);
	void (*host_free)(Backend *b, void *p);

	/* ---- staged batches and step results ---- */
	/* host (from host_alloc) is about to be written: wait until no copy
	 * that stage_push issued still reads it. */
	int (*stage_wait)(Backend *b, const void *host, RtErr *e);
	/* host (from host_alloc, bytes long) now holds the batches of optimizer
	 * step k: copy them into the backend's memory now, beside whatever runs
	 * (at most the two steps before k may still be in flight), or leave
	 * them where they are when a LOAD can read host memory itself. A LOAD
	 * inside step k then reads step k's batches (upload maps the host
	 * address to the copy), so a captured step reads the batches of
	 * whichever step it is replayed as. */
	int (*stage_push)(Backend *b, const void *host, size_t bytes, uint64_t k, RtErr *e);
	/* Wait for optimizer step k only (steps launched after it keep running)
	 * and give its report (metrics, loss-scaling state), which step_tail
	 * left where the host reads it without a device copy. */
	int (*step_wait)(Backend *b, uint64_t k, BackendReport *r, RtErr *e);

	/* ---- the optimizer step's scalars (lr; t = k + 1 less the steps loss
	 * scaling skipped, counted by the backend) ---- */
	/* Before step k is started, outside any capture. */
	int (*set_step)(Backend *b, uint64_t k, double lr, RtErr *e);
	/* First and last work of a step, in stream order (captured). */
	int (*step_head)(Backend *b, RtErr *e);
	int (*step_tail)(Backend *b, RtErr *e);

	/* ---- streams ---- */
	int (*run_begin)(Backend *b, DpProgram p, RtErr *e); /* both streams see what came before */
	int (*run_end)(Backend *b, RtErr *e);                /* ... and what comes after sees the run */
	int (*event_record)(Backend *b, unsigned stream, unsigned event, RtErr *e);
	int (*event_wait)(Backend *b, unsigned stream, unsigned event, RtErr *e);
	/* A collective instruction (dp_is_collective) on its stream. */
	int (*collective)(Backend *b, const DpInstr *in, RtErr *e);
	/* Wait for everything issued; `what` names it in a timeout message. */
	int (*sync)(Backend *b, const char *what, RtErr *e);

	/* ---- graphs: optional (all three, or none: the executor then enqueues
	 * each step) ---- */
	int (*capture_begin)(Backend *b, RtErr *e);
	int (*capture_end)(Backend *b, RtErr *e); /* ends the capture even after a failure */
	int (*replay)(Backend *b, RtErr *e);

	/* ---- device timing: optional (both, or none), for dpexec --trace on a
	 * backend that is not BACKEND_INLINE (runtime/trace.c); only in eager
	 * runs, never inside a capture ---- */
	/* Timing mark `slot` (from 0; the backend keeps one timing event per
	 * slot, made on first use and reused) recorded on `stream` in stream
	 * order. */
	int (*time_mark)(Backend *b, unsigned stream, uint32_t slot, RtErr *e);
	/* Wait (under the --timeout watchdog) for marks 0..n-1, then ms[i] =
	 * the device's time from mark 0 to mark i, in milliseconds. */
	int (*time_read)(Backend *b, uint32_t n, float *ms, RtErr *e);
};

/* The CPU backend (runtime/cpu/backend_cpu.c). Outside runtime/cpu/ only
 * the registry below names it: the rest asks backend_cpu(). */
extern const BackendOps cpu_backend;
/* The CPU's kernels as a host step for other backends (BackendOpts.host). */
extern const HostKernelOps cpu_host_kernels;

/* Process-wide set-up every backend shares (OpenBLAS's core); dpexec calls
 * it first. */
void backend_process_init(void);

/* ---- choosing and loading a backend (runtime/backend.c) ---- */

/* The CPU backend: always there (--device cpu, and auto without a GPU). */
const BackendOps *backend_cpu(void);

/* The environment variable naming the CUDA backend's shared object. */
#define BACKEND_CUDA_ENV "DPEXEC_CUDA_LIB"
#define BACKEND_CUDA_LIB "libdpcuda.so"

/* Where the CUDA backend is: $DPEXEC_CUDA_LIB, else libdpcuda.so beside
 * the running dpexec (readlink /proc/self/exe). */
void backend_cuda_path(char *buf, size_t len);
/* dlopen the CUDA backend and check its ABI. 0 with *ops and *handle (for
 * dlclose after free), or -1 with the reason (the dlopen error) in why. */
int backend_load_cuda(const BackendOps **ops, void **handle, char *why, size_t len);
/* Is there a GPU, asked of the driver alone (libcuda.so.1: cuInit,
 * cuDeviceGetCount), without loading the CUDA backend or any toolkit
 * library? 1, or 0 with the reason; *driver: whether a CUDA driver is
 * installed at all (libcuda.so.1 loads). */
int backend_gpu_present(char *why, size_t len, int *driver);

#endif
