/*
 * kernel.cc - the CUDA emulator's kernels: a launch is a queued stream
 * operation; when the scheduler runs it, its blocks run one after another
 * (in ascending, descending or shuffled order: DPEMU_BLOCKS) and each
 * block's threads run as cooperative fibers (switch.S) on the scheduler's
 * thread. A thread runs until it reaches __syncthreads, a warp primitive or
 * its end; then the next runnable thread runs: in ascending or descending
 * thread order, or a seeded random pick among the runnable ones
 * (DPEMU_THREADS). The thread that stops picks the next one and switches to
 * it directly (one switch per stop, not two through run_block), and a
 * thread that ends runs a next thread that has not started on its own
 * fiber (no switch at all); only the block's last thread switches back to
 * run_block. So code that reads what another thread writes without
 * the barrier between them reads stale shared memory (filled with 0xff
 * bytes before every block) for some order.
 *
 * Rules checked (each an error that names the kernel, its launch site, the
 * block and the thread, and ends the process: on a GPU they are undefined
 * behaviour, a hang or a fault):
 *  - a thread that exits while others wait at __syncthreads, or before a
 *    __syncthreads the others then reach;
 *  - a warp primitive (__shfl*_sync, __ballot_sync, __any/__all_sync,
 *    __syncwarp) whose mask does not name the calling lane, names a lane
 *    that exited or does not exist, or names a lane that waits at a
 *    different primitive or mask; a shuffle that reads a lane outside the
 *    mask;
 *  - every thread of a block waiting with none able to go on (deadlock);
 *  - a launch configuration outside the device's limits (returned as the
 *    launch's error, as CUDA does), dynamic shared memory above 48 KiB
 *    without cudaFuncSetAttribute, a pointer argument that is host memory
 *    or a freed allocation;
 *  - a misaligned access (kernels are built with -fsanitize=alignment and
 *    the handler below reports it with the thread), an access outside any
 *    live device allocation (the fault handler, core.cc).
 * A warp's lanes are not in lock-step: Volta's independent thread
 * scheduling, where only the *_sync primitives synchronise lanes.
 */
#include <algorithm>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "emu.h"
#include "include/dpemu_device.h"

DpemuRegs dpemu_regs;

extern "C" void dpemu_switch(void **save, void *to);
extern "C" void dpemu_fiber_tramp(void);
/* the linker's bounds of every __shared__ variable */
extern "C" char __start_dpemu_shared[] __attribute__((weak));
extern "C" char __stop_dpemu_shared[] __attribute__((weak));

namespace emu {

static const size_t STACK = 128 * 1024, GUARD = 4096;
static const size_t DYN_SMEM = 256 * 1024;

enum TState : uint8_t { T_NEW, T_READY, T_BAR, T_WARP, T_DONE };

/* A cp.async copy issued and not yet landed (dpemu_mma_ptx.h): its 16
 * bytes as read at the issue, its group (0: not committed yet) */
struct CpCopy {
	char *dst;
	unsigned char bytes[16];
	unsigned group;
	const char *file;
	int line;
};

/* An emulated thread: what dpemu_warp, pick_next and the switch touch at
 * every stop, in one 64-byte line (a warp's 32 lanes span 32 lines, not the
 * 64 of a 128-byte Thread). What a stop does not touch (the stack, cp.async
 * copies, which few kernels make) lives apart in ThreadCold, so a block's
 * threads are plain bytes, assigned without constructors. */
struct alignas(64) Thread {
	void *sp;
	uint64_t wval, wres;
	unsigned wmask;
	unsigned warrived; /* a group's leader: the lanes of wmask that have arrived */
	int warg;
	int line;          /* where it waits */
	const char *file;
	void (*wdone)(void *const *); /* DPEMU_COLLECTIVE: what the last lane runs */
	uint32_t tid;      /* threadIdx packed x | y << 10 | z << 20 (block.x, y <= 1024,
	                      z <= 64): set_regs runs at every switch, no divisions there */
	TState st;
	uint8_t wop;       /* warp primitive waited at */
	uint8_t wwidth;    /* its width (1..32: checked before it is stored) */
	uint8_t pred;      /* __syncthreads_count/and/or */
};
static_assert(sizeof(Thread) == 64, "a Thread is one cache line");

/* The rest of a thread, index for index with Block::t, kept across blocks:
 * every thread of a block ends with no stack (thread_main hands it on) and
 * no cp.async copy in flight (or the kernel fails), so a block's start
 * allocates nothing here. */
struct ThreadCold {
	char *stack;
	std::vector<CpCopy> cp; /* cp.async copies in flight, in issue order */
	unsigned cp_groups;     /* commit_groups executed */
};

/* A warp's bookkeeping: the lanes leading a pending primitive (one per
 * group of lanes meeting at one: the first to arrive), and the lanes that
 * returned. */
struct Warp {
	unsigned leaders, exited;
};

struct KernelWork;

/* The block that runs now (one at a time). */
struct Block {
	const KernelWork *k = nullptr;
	unsigned n = 0;            /* threads */
	std::vector<Thread> t;
	std::vector<ThreadCold> cold; /* the rest of t, index for index */
	std::vector<Warp> w;
	std::vector<int> ready;    /* threads that can run (new or released) */
	Pick order;                /* ascending / descending release order, or random picks */
	unsigned arrived = 0;      /* at __syncthreads */
	unsigned exited = 0;
	int bar_result = 0;
	size_t head = 0;           /* ready[head..]: not yet picked */
	int cur = -1;              /* running thread */
	void *sched_sp = nullptr;  /* run_block's context */
	char *dead = nullptr;      /* the stack of a thread that ended and switched away */
	unsigned bid = 0;          /* linear block index */
};

static Block blk;
static std::vector<char *> stack_pool;
static std::vector<std::pair<uintptr_t, uintptr_t>> guards; /* stack guard pages */
static char *dyn_base;
static size_t dyn_open; /* bytes of dynamic shared memory readable now */

struct KernelWork : Work {
	dpemu::LaunchSite at;
	dim3 grid, block;
	size_t smem;
	std::function<void()> body;
	std::string what() const override
	{
		char b[256];
		snprintf(b, sizeof b, "kernel %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>> (%s:%d)", at.kernel,
			 grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, at.file, at.line);
		return b;
	}
	bool start(Op &) override;
};

static uint3 unflatten(unsigned i, dim3 d)
{
	return uint3{i % d.x, (i / d.x) % d.y, i / (d.x * d.y)};
}

std::string kernel_context()
{
	if (!blk.k)
		return "";
	char b[512];
	uint3 bi = unflatten(blk.bid, blk.k->grid);
	if (blk.cur >= 0) {
		uint3 ti = unflatten((unsigned)blk.cur, blk.k->block);
		snprintf(b, sizeof b, "kernel %s (launched at %s:%d), block (%u,%u,%u), thread (%u,%u,%u) "
			 "[warp %d lane %d]: ", blk.k->at.kernel, blk.k->at.file, blk.k->at.line, bi.x,
			 bi.y, bi.z, ti.x, ti.y, ti.z, blk.cur / 32, blk.cur % 32);
	} else {
		snprintf(b, sizeof b, "kernel %s (launched at %s:%d), block (%u,%u,%u): ",
			 blk.k->at.kernel, blk.k->at.file, blk.k->at.line, bi.x, bi.y, bi.z);
	}
	return b;
}

bool fiber_guard(uintptr_t a)
{
	for (auto &g : guards)
		if (a >= g.first && a < g.second)
			return true;
	return false;
}

[[noreturn]] static void kfail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kfail(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fatal("%s%s", kernel_context().c_str(), buf);
}

static char *get_stack()
{
	if (!stack_pool.empty()) {
		char *s = stack_pool.back();
		stack_pool.pop_back();
		return s;
	}
	char *m = (char *)mmap(NULL, STACK + GUARD, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		fatal("out of memory for emulated thread stacks");
	mprotect(m, GUARD, PROT_NONE);
	guards.push_back({(uintptr_t)m, (uintptr_t)m + GUARD});
	return m;
}

static void thread_main(void *);

/* A fresh context on stack s that starts thread_main (switch.S's layout). */
static void *new_context(char *s, unsigned color)
{
	/* stagger the tops: stacks a page multiple apart would all hit the
	 * same cache sets */
	uintptr_t top = ((uintptr_t)s + STACK + GUARD - (color % 61) * 64) & ~(uintptr_t)15;
	uint64_t *a = (uint64_t *)(top - 24); /* the return slot: A = 8 mod 16 */
	uint64_t *sp = a - 6;
	sp[0] = 0;                         /* r15 */
	sp[1] = 0;                         /* r14 */
	sp[2] = (uint64_t)thread_main;     /* r13: the function */
	sp[3] = 0;                         /* r12: its argument */
	sp[4] = 0;                         /* rbx */
	sp[5] = 0;                         /* rbp */
	sp[6] = (uint64_t)dpemu_fiber_tramp;
	return sp;
}

static void set_regs(int t)
{
	uint32_t p = blk.t[t].tid;
	dpemu_regs.tid = uint3{p & 1023, p >> 10 & 1023, p >> 20};
}

static const char *wop_name(int op)
{
	static const char *n[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
				  "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp",
				  "a warp-collective operation (wmma, mma, ldmatrix)"};
	return op >= 0 && op < 9 ? n[op] : "?";
}

/* The next thread to run: the head of the ready list in the block's release
 * order, or (DPEMU_THREADS=random) a seeded random pick among the runnable
 * ones; made blk.cur. Every thread waiting with none runnable: a deadlock. */
[[noreturn]] static void __attribute__((noinline, cold)) deadlock()
{
	std::string who;
	for (unsigned i = 0; i < blk.n && who.size() < 600; i++) {
		const Thread &th = blk.t[i];
		if (th.st == T_DONE)
			continue;
		char b2[160];
		snprintf(b2, sizeof b2, "%sthread %u at %s (%s:%d)", who.empty() ? "" : "; ", i,
			 th.st == T_BAR ? "__syncthreads" : wop_name(th.wop), th.file, th.line);
		who += b2;
	}
	blk.cur = -1;
	kfail("deadlock: no thread of the block can go on (%u returned): %s", blk.exited, who.c_str());
}

static inline __attribute__((always_inline)) int pick_next()
{
	if (__builtin_expect(blk.head == blk.ready.size(), 0))
		deadlock();
	if (blk.order == PICK_RANDOM) /* a random runnable thread next */
		std::swap(blk.ready[blk.head], blk.ready[blk.head + rnd(blk.ready.size() - blk.head)]);
	int i = blk.ready[blk.head++];
	if (blk.head > 4096 && blk.head * 2 > blk.ready.size()) {
		blk.ready.erase(blk.ready.begin(), blk.ready.begin() + (long)blk.head);
		blk.head = 0;
	}
	blk.cur = i;
	set_regs(i);
	return i;
}

/* The stack of a thread that ended goes back to the pool once its fiber
 * has been left (by whichever context runs next). */
static void reap()
{
	if (blk.dead) {
		stack_pool.push_back(blk.dead);
		blk.dead = nullptr;
	}
}

/* Switch from the running context (save: where its stack pointer goes) to
 * thread i, made runnable if it is new. */
static inline __attribute__((always_inline)) void switch_to(void **save, int i)
{
	Thread &th = blk.t[i];
	if (th.st == T_NEW) {
		char *stack = blk.cold[i].stack = get_stack();
		th.sp = new_context(stack, (unsigned)i);
		th.st = T_READY;
	}
	dpemu_switch(save, th.sp);
	reap(); /* resumed */
}

/* The running thread waits (at a barrier or a warp primitive): the next
 * runnable thread runs, directly; this returns when a thread that releases
 * this one has itself stopped and picked it. */
static inline __attribute__((always_inline)) void wait_for_release()
{
	Thread &me = blk.t[blk.cur];
	switch_to(&me.sp, pick_next());
}

static void warp_exit_check(int t);

/* A fiber's life: it runs the thread it was made for, and when that thread
 * ends, the next one the order picks: on this same fiber and stack if that
 * thread has not started (the stack run_block would have handed it: the
 * pool's last), else by a switch to it. The block's last thread switches
 * back to run_block. */
static void thread_main(void *)
{
	for (;;) {
		blk.k->body();
		int t = blk.cur;
		Thread &me = blk.t[t];
		me.st = T_DONE;
		blk.exited++;
		if (blk.arrived) {
			int w = -1;
			for (unsigned i = 0; i < blk.n; i++)
				if (blk.t[i].st == T_BAR)
					w = (int)i;
			kfail("the thread returned while %u thread(s) wait at __syncthreads (thread %d at "
			      "%s:%d): every thread of the block must reach every __syncthreads", blk.arrived,
			      w, blk.t[w].file, blk.t[w].line);
		}
		const std::vector<CpCopy> &cp = blk.cold[t].cp;
		if (!cp.empty())
			kfail("the thread returned with %zu cp.async copies it never waited for (the first "
			      "issued at %s:%d): a cp.async.wait_group must cover every copy", cp.size(),
			      cp[0].file, cp[0].line);
		warp_exit_check(t);
		char *stack = blk.cold[t].stack;
		blk.cold[t].stack = nullptr;
		if (blk.exited == blk.n) {
			blk.cur = -1;
			blk.dead = stack;
			dpemu_switch(&me.sp, blk.sched_sp);
			__builtin_unreachable();
		}
		int i = pick_next();
		Thread &next = blk.t[i];
		if (next.st == T_NEW) { /* it starts here */
			blk.cold[i].stack = stack;
			next.st = T_READY;
			continue;
		}
		blk.dead = stack;
		dpemu_switch(&me.sp, next.sp);
		__builtin_unreachable();
	}
}

/* ---- __syncthreads ---- */

static void release(int t);

static void barrier_complete()
{
	if (!blk.arrived || blk.arrived + blk.exited < blk.n)
		return;
	if (blk.exited) {
		unsigned gone = 0;
		while (blk.t[gone].st != T_DONE)
			gone++;
		kfail("__syncthreads at %s:%d: %u thread(s) returned before it (thread %u first): every "
		      "thread of the block must reach every __syncthreads", blk.t[blk.cur].file,
		      blk.t[blk.cur].line, blk.exited, gone);
	}
	int count = 0, all = 1, any = 0;
	for (auto &th : blk.t) {
		count += th.pred;
		all &= th.pred;
		any |= th.pred;
	}
	blk.bar_result = count; /* the kind decides what the callers read */
	blk.arrived = 0;
	int me = blk.cur;
	if (blk.order == PICK_HIGH) {
		for (int i = (int)blk.n - 1; i >= 0; i--)
			if (i != me)
				release(i);
	} else {
		for (int i = 0; i < (int)blk.n; i++)
			if (i != me)
				release(i);
	}
	blk.t[me].st = T_READY; /* goes on */
	(void)all;
	(void)any;
}

} // namespace emu

using namespace emu;

int dpemu_barrier(int kind, int pred, const char *file, int line)
{
	if (blk.cur < 0)
		fatal("__syncthreads outside a kernel (%s:%d)", file, line);
	Thread &me = blk.t[blk.cur];
	me.st = T_BAR;
	me.pred = pred;
	me.file = file;
	me.line = line;
	blk.arrived++;
	barrier_complete();
	if (me.st == T_BAR)
		wait_for_release();
	int count = blk.bar_result;
	switch (kind) {
	case DPEMU_BAR_COUNT: return count;
	case DPEMU_BAR_AND: return count == (int)blk.n;
	case DPEMU_BAR_OR: return count > 0;
	default: return 0;
	}
}

/* ---- warp primitives ---- */


namespace emu {
static void warp_exit_check(int t)
{
	int base = t / 32 * 32, lane = t % 32;
	Warp &w = blk.w[t / 32];
	w.exited |= 1u << lane;
	for (unsigned l = w.leaders; l; l &= l - 1) {
		Thread &o = blk.t[base + __builtin_ctz(l)];
		if (o.wmask >> lane & 1)
			kfail("the thread (lane %d) returned while lanes 0x%08x wait for it at %s (mask "
			      "0x%08x) at %s:%d", lane, o.warrived, wop_name(o.wop), o.wmask, o.file, o.line);
	}
}

/* The last lane of a warp collective (DPEMU_COLLECTIVE) to arrive: every
 * lane must be at the same call; it does the warp's work on all the lanes'
 * arguments while they wait. Out of line: its 32 arguments would otherwise
 * widen dpemu_warp's frame, which every stop of every lane touches (the
 * fibers' stacks are the emulator's cache misses). */
static void __attribute__((noinline)) warp_collective_run(int base, int lane, void (*done)(void *const *),
							   const char *file, int line)
{
	void *args[32];
	for (int i = 0; i < 32; i++) {
		Thread &o = blk.t[base + i];
		/* the same call site: the same file pointer, almost always (one
		 * string per translation unit), so strcmp only when they differ */
		if (o.wdone != done || o.line != line || (o.file != file && strcmp(o.file, file)))
			kfail("lane %d is at %s (%s:%d) while lane %d is at another one (%s:%d): every "
			      "lane of the warp must make the same call", lane, wop_name(DPEMU_COLLECTIVE),
			      file, line, i, o.file, o.line);
		args[i] = (void *)(uintptr_t)o.wval;
	}
	done(args);
}

/* Threads become runnable in the block's release order. */
static void release(int t)
{
	blk.t[t].st = T_READY;
	blk.ready.push_back(t);
}
} // namespace emu

uint64_t dpemu_warp(int op, unsigned mask, uint64_t value, int arg, int width, const char *file,
		    int line)
{
	if (blk.cur < 0)
		fatal("%s outside a kernel (%s:%d)", wop_name(op), file, line);
	int t = blk.cur, base = t / 32 * 32, lane = t % 32;
	Thread &me = blk.t[t];
	Warp &w = blk.w[t / 32];
	unsigned exist = blk.n - base >= 32 ? ~0u : (1u << (blk.n - base)) - 1;
	if (!(mask >> lane & 1))
		kfail("%s at %s:%d with mask 0x%08x, which does not name the calling lane %d",
		      wop_name(op), file, line, mask, lane);
	if (op <= DPEMU_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
		kfail("%s at %s:%d: width %d is not a power of 2 up to 32", wop_name(op), file, line, width);
	if (mask & ~exist)
		kfail("%s at %s:%d: mask 0x%08x names lane %d, which does not exist (%u threads per "
		      "block)", wop_name(op), file, line, mask, __builtin_ctz(mask & ~exist), blk.n);
	if (mask & w.exited)
		kfail("%s at %s:%d: mask 0x%08x names lane %d, which has returned", wop_name(op), file,
		      line, mask, __builtin_ctz(mask & w.exited));
	me.st = T_WARP;
	me.wop = op;
	me.wmask = mask;
	me.warg = arg;
	me.wwidth = width;
	me.wval = value;
	me.file = file;
	me.line = line;
	/* join the group of lanes waiting with this mask, or lead a new one */
	Thread *lead = nullptr;
	for (unsigned l = w.leaders; l; l &= l - 1) {
		Thread &o = blk.t[base + __builtin_ctz(l)];
		if (o.wmask == mask) {
			if (o.wop != op)
				kfail("%s at %s:%d with mask 0x%08x, while lanes 0x%08x of it wait at %s "
				      "(%s:%d): the lanes of a mask must meet at the same primitive",
				      wop_name(op), file, line, mask, o.warrived, wop_name(o.wop), o.file, o.line);
			lead = &o;
		} else if (o.wmask & mask) {
			kfail("%s at %s:%d with mask 0x%08x, while lanes 0x%08x named in it wait at %s with "
			      "mask 0x%08x (%s:%d): the lanes of a mask must meet at the same primitive",
			      wop_name(op), file, line, mask, o.warrived & mask, wop_name(o.wop), o.wmask,
			      o.file, o.line);
		}
	}
	if (!lead) {
		lead = &me;
		me.warrived = 0;
		w.leaders |= 1u << lane;
	}
	lead->warrived |= 1u << lane;
	if (lead->warrived != mask) {
		wait_for_release(); /* the last lane to arrive completes it */
		return me.wres;
	}
	w.leaders &= ~(1u << (lead - &blk.t[base]));
	if (op == DPEMU_COLLECTIVE)
		warp_collective_run(base, lane, me.wdone, file, line);
	if (op >= DPEMU_SYNCWARP) { /* __syncwarp, a warp collective: every lane reads 0 */
		for (unsigned m = mask; m; m &= m - 1)
			blk.t[base + __builtin_ctz(m)].wres = 0;
	} else if (op >= DPEMU_BALLOT) { /* __ballot/__any/__all_sync */
		uint64_t ballot = 0;
		for (unsigned m = mask; m; m &= m - 1) {
			int i = __builtin_ctz(m);
			if (blk.t[base + i].wval)
				ballot |= 1ull << i;
		}
		uint64_t r = op == DPEMU_BALLOT ? ballot : op == DPEMU_ANY ? ballot != 0 : ballot == mask;
		for (unsigned m = mask; m; m &= m - 1)
			blk.t[base + __builtin_ctz(m)].wres = r;
	} else { /* the shuffles: each lane reads its source lane's value */
		for (unsigned m = mask; m; m &= m - 1) {
			int i = __builtin_ctz(m);
			Thread &o = blk.t[base + i];
			int wd = o.wwidth, seg = i & ~(wd - 1), src = i;
			switch (op) {
			case DPEMU_SHFL_IDX: src = seg + (o.warg & (wd - 1)); break;
			case DPEMU_SHFL_UP: src = i - o.warg >= seg ? i - o.warg : i; break;
			case DPEMU_SHFL_DOWN: src = i + o.warg < seg + wd ? i + o.warg : i; break;
			default: src = (i ^ o.warg) >= seg && (i ^ o.warg) < seg + wd ? i ^ o.warg : i; break;
			}
			if (!(mask >> src & 1))
				kfail("%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x "
				      "(an undefined value on a GPU)", wop_name(op), file, line, i, src, mask);
			o.wres = blk.t[base + src].wval;
		}
	}
	/* the others run again in the block's order; this lane goes on */
	if (blk.order == PICK_HIGH) {
		for (int i = 31; i >= 0; i--)
			if ((mask >> i & 1) && i != lane)
				release(base + i);
	} else {
		for (unsigned m = mask & ~(1u << lane); m; m &= m - 1)
			release(base + __builtin_ctz(m));
	}
	me.st = T_READY;
	return me.wres;
}

void dpemu_warp_collective(void (*done)(void *const *args), void *arg, const char *file, int line)
{
	if (blk.cur < 0)
		fatal("%s outside a kernel (%s:%d)", wop_name(DPEMU_COLLECTIVE), file, line);
	int base = blk.cur / 32 * 32;
	if (blk.n - base < 32)
		kfail("%s at %s:%d in a warp of %u threads: it needs all 32 lanes",
		      wop_name(DPEMU_COLLECTIVE), file, line, blk.n - base);
	blk.t[blk.cur].wdone = done;
	dpemu_warp(DPEMU_COLLECTIVE, ~0u, (uint64_t)(uintptr_t)arg, 0, 32, file, line);
}

void dpemu_kfail(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	kfail("%s", buf);
}

unsigned dpemu_activemask(void)
{
	if (blk.cur < 0)
		return 0;
	int base = blk.cur / 32 * 32;
	unsigned m = 0;
	for (int i = 0; i < 32 && base + i < (int)blk.n; i++)
		if (blk.t[base + i].st != T_DONE)
			m |= 1u << i;
	return m;
}

/* ldmatrix's rule (dpemu_mma_ptx.h): [p, p + n) in the running block's
 * shared memory, a __shared__ variable or the launch's dynamic region */
int dpemu_is_shared(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, sh0 = (uintptr_t)__start_dpemu_shared,
		  sh1 = (uintptr_t)__stop_dpemu_shared, d0 = (uintptr_t)dyn_base;
	if (sh0 && a >= sh0 && a + n <= sh1)
		return 1;
	return blk.k && d0 && a >= d0 && a + n <= d0 + blk.k->smem;
}

/* ---- cp.async: each thread's copies land at its wait_group ---- */

void dpemu_cp_async(void *dst, const void *src, int n, const char *file, int line)
{
	if (blk.cur < 0)
		fatal("cp.async outside a kernel (%s:%d)", file, line);
	if (n != 0 && n != 16)
		kfail("cp.async at %s:%d: src-size %d: the 16-byte .cg copy takes 16 or 0 (zero-fill)",
		      file, line, n);
	if ((uintptr_t)dst % 16 || !dpemu_is_shared(dst, 16))
		kfail("cp.async at %s:%d: the destination %p is not 16-byte aligned shared memory", file,
		      line, dst);
	if (n && ((uintptr_t)src % 16 || dpemu_is_shared(src, 16)))
		kfail("cp.async at %s:%d: the source %p is not 16-byte aligned global memory", file, line,
		      src);
	CpCopy c{(char *)dst, {0}, 0, file, line};
	if (n)
		memcpy(c.bytes, src, 16); /* a device allocation: the fault handler checks */
	blk.cold[blk.cur].cp.push_back(c);
}

void dpemu_cp_async_commit(void)
{
	if (blk.cur < 0)
		fatal("cp.async.commit_group outside a kernel");
	ThreadCold &me = blk.cold[blk.cur];
	me.cp_groups++;
	for (CpCopy &c : me.cp)
		if (!c.group)
			c.group = me.cp_groups;
}

void dpemu_cp_async_wait(int n, const char *file, int line)
{
	if (blk.cur < 0)
		fatal("cp.async.wait_group outside a kernel (%s:%d)", file, line);
	ThreadCold &me = blk.cold[blk.cur];
	size_t kept = 0;
	for (size_t i = 0; i < me.cp.size(); i++) {
		CpCopy &c = me.cp[i];
		if (c.group && c.group + (unsigned)n <= me.cp_groups)
			memcpy(c.dst, c.bytes, 16); /* landed, in issue order */
		else
			me.cp[kept++] = c;
	}
	me.cp.resize(kept);
}

long long dpemu_clock(void)
{
	return (long long)(now_s() * 1e9);
}

void *dpemu_dyn_smem(void)
{
	if (!dyn_base) {
		dyn_base = (char *)mmap(NULL, DYN_SMEM + GUARD, PROT_NONE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (dyn_base == MAP_FAILED)
			fatal("cannot map dynamic shared memory");
		guards.push_back({(uintptr_t)dyn_base, (uintptr_t)dyn_base + DYN_SMEM + GUARD});
	}
	return dyn_base;
}

namespace emu {

static void shuffle(std::vector<unsigned> &v)
{
	for (size_t i = v.size(); i > 1; i--)
		std::swap(v[i - 1], v[rnd(i)]);
}

/* 0..n-1 ascending or descending as the policy (or, for random, a seeded
 * coin among the three) says; PICK_RANDOM: the caller shuffles. */
static Pick make_order(unsigned n, Pick how, std::vector<unsigned> &order)
{
	order.resize(n);
	for (unsigned i = 0; i < n; i++)
		order[i] = i;
	if (how == PICK_RANDOM)
		how = (Pick)rnd(3);
	if (how == PICK_HIGH)
		std::reverse(order.begin(), order.end());
	return how;
}

/* Run one block to its end: the runnable threads (all, at first) one at a
 * time until each reaches a barrier, a warp primitive or its end; a
 * completed barrier or primitive makes its threads runnable again. The
 * order: ascending or descending thread index, or a seeded random pick
 * among the runnable ones (DPEMU_THREADS). */
static void run_block(const KernelWork &k, unsigned b)
{
	unsigned n = k.block.x * k.block.y * k.block.z;
	blk.k = &k;
	blk.n = n;
	blk.bid = b;
	blk.arrived = blk.exited = 0;
	blk.cur = -1;
	blk.t.assign(n, Thread{});
	if (blk.cold.size() < n)
		blk.cold.resize(n); /* no stack, no copies: every thread before ended so */
	for (unsigned i = 0; i < n; i++)
		blk.cold[i].cp_groups = 0;
	uint3 id = {0, 0, 0}; /* unflatten(i, k.block), counted */
	for (unsigned i = 0; i < n; i++) {
		blk.t[i].tid = id.x | id.y << 10 | id.z << 20;
		if (++id.x == k.block.x) {
			id.x = 0;
			if (++id.y == k.block.y) {
				id.y = 0;
				id.z++;
			}
		}
	}
	blk.w.assign((n + 31) / 32, Warp{0, 0});
	dpemu_regs.bid = unflatten(b, k.grid);
	uintptr_t sh0 = (uintptr_t)__start_dpemu_shared, sh1 = (uintptr_t)__stop_dpemu_shared;
	if (sh0 && sh1 > sh0)
		memset((void *)sh0, 0xff, sh1 - sh0);
	if (k.smem)
		memset(dyn_base, 0xff, k.smem);
	std::vector<unsigned> order;
	blk.order = make_order(n, cfg().threads, order);
	blk.ready.assign(order.begin(), order.end());
	blk.head = 0;
	/* the threads switch among themselves; the last one to end returns here */
	switch_to(&blk.sched_sp, pick_next());
	if (blk.exited != n)
		fatal("the emulator's block loop: back in run_block with %u of %u threads ended", blk.exited, n);
	blk.cur = -1;
	blk.k = nullptr;
}

bool KernelWork::start(Op &)
{
	dpemu_regs.gdim = grid;
	dpemu_regs.bdim = block;
	unsigned nb = grid.x * grid.y * grid.z;
	if (smem) {
		dpemu_dyn_smem();
		size_t open = (smem + GUARD - 1) / GUARD * GUARD;
		if (open != dyn_open) {
			mprotect(dyn_base, DYN_SMEM, PROT_NONE);
			mprotect(dyn_base, open, PROT_READ | PROT_WRITE);
			dyn_open = open;
		}
	}
	std::vector<unsigned> order;
	if (make_order(nb, cfg().blocks, order) == PICK_RANDOM)
		shuffle(order);
	for (unsigned b : order)
		run_block(*this, b);
	return true;
}

} // namespace emu

/* ---- launching ---- */

void dpemu::check_arg(const LaunchSite &at, int index, const volatile void *p)
{
	if (!p)
		return;
	std::string why;
	if (!device_accessible((const void *)p, 1, &why))
		fatal("kernel %s (launched at %s:%d): argument %d is %s; a kernel that dereferences it "
		      "faults on a GPU", at.kernel, at.file, at.line, index + 1, why.c_str());
}

cudaError_t dpemu::launch(const LaunchSite &at, dim3 grid, dim3 block, size_t smem, cudaStream_t h,
			  const void *func, std::function<void()> body)
{
	EMU_API_ENTRY("a kernel launch");
	if (cudaError_t e = init_error())
		return record(e);
	if (!kernel_image_fits())
		return record(cudaErrorNoKernelImageForDevice);
	unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
	if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || block.x > 1024 ||
	    block.y > 1024 || block.z > 64 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
		return misuse(cudaErrorInvalidConfiguration, "kernel %s (launched at %s:%d): grid "
			      "(%u,%u,%u) block (%u,%u,%u) is outside the device's limits", at.kernel,
			      at.file, at.line, grid.x, grid.y, grid.z, block.x, block.y, block.z);
	auto lim = S().func_smem.find(func);
	size_t max = lim != S().func_smem.end() ? (size_t)lim->second : 48 * 1024;
	if (smem > max)
		return misuse(cudaErrorInvalidValue, "kernel %s (launched at %s:%d): %zu bytes of dynamic "
			      "shared memory, above its limit of %zu (cudaFuncSetAttribute("
			      "cudaFuncAttributeMaxDynamicSharedMemorySize) raises it up to 227 KiB)",
			      at.kernel, at.file, at.line, smem, max);
	Stream *s = stream_of(h, "a kernel launch");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	auto w = std::make_shared<KernelWork>();
	w->at = at;
	w->grid = grid;
	w->block = block;
	w->smem = smem;
	w->body = std::move(body);
	return submit(s, w, at.kernel);
}

/* ---- misaligned accesses (kernels.cu is built with -fsanitize=alignment) ---- */

namespace {
struct SourceLocation {
	const char *file;
	uint32_t line, column;
};
struct TypeDescriptor {
	uint16_t kind, info;
	char name[1];
};
struct TypeMismatchData {
	SourceLocation loc;
	const TypeDescriptor *type;
	unsigned char log_alignment;
	unsigned char check_kind;
};
} // namespace

extern "C" void __ubsan_handle_type_mismatch_v1(TypeMismatchData *d, uintptr_t ptr)
{
	static const char *kinds[] = {"load of", "store to", "reference binding to", "member access within",
				      "member call on", "constructor call on", "downcast of", "downcast of",
				      "upcast of", "cast to virtual base of", "_Nonnull binding to",
				      "dynamic operation on"};
	const char *k = d->check_kind < 12 ? kinds[d->check_kind] : "access to";
	unsigned long align = 1ul << d->log_alignment;
	if (!ptr)
		fatal("%snull pointer: %s type %s (%s:%u:%u)", kernel_context().c_str(), k, d->type->name,
		      d->loc.file, d->loc.line, d->loc.column);
	fatal("%smisaligned address %p: %s type %s, which needs %lu-byte alignment (%s:%u:%u; on a "
	      "GPU cudaErrorMisalignedAddress)", kernel_context().c_str(), (void *)ptr, k, d->type->name,
	      align, d->loc.file, d->loc.line, d->loc.column);
}

extern "C" void __ubsan_handle_type_mismatch_v1_abort(TypeMismatchData *d, uintptr_t ptr)
{
	__ubsan_handle_type_mismatch_v1(d, ptr);
}
