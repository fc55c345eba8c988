/*
 * sched.cc - the CUDA emulator's streams, events, scheduler, copies, stream
 * capture and graphs.
 *
 * Streams are queues and events are edges: every operation is an Op whose
 * dependencies are the previous operation of its stream (and the legacy
 * stream's implicit synchronisation with blocking streams) plus the
 * operations it was made to wait for (cudaStreamWaitEvent, a graph's
 * edges). Nothing else orders two operations.
 *
 * The scheduler is adversarial within that order. Device work runs on the
 * caller's thread inside API calls: at enqueue (eagerly, if DPEMU_RUN says
 * so), at queries (a few operations per cudaEventQuery/cudaStreamQuery), and
 * at blocking waits (until the awaited operation is done; the lazy policy
 * runs only what it depends on, so work the host forgot to wait for is run
 * late). Among the operations ready to run it picks by DPEMU_COMM
 * (collectives as late as the events allow, as early, or either) and a
 * seeded coin (DPEMU_SEED), and a collective's completion (its results
 * written) is itself a choice the scheduler delays or advances. A missing
 * event therefore shows as a wrong number for some seed, not as luck.
 *
 * Capture follows the CUDA rules the backend depends on: the origin stream
 * and the streams that join it through captured events record nodes
 * instead of running; EndCapture fails on a stream that forked in and did
 * not join back; any synchronous or otherwise unsafe call during a capture
 * in global or thread-local mode (cudaMalloc, cudaMemcpy, a synchronize, a
 * query, work on the legacy stream) fails with
 * cudaErrorStreamCaptureUnsupported and invalidates the capture. A graph
 * launch turns the nodes into operations with the graph's edges (replay
 * re-executes the recorded work, kernels with the arguments they were
 * captured with); the scheduler may run them in any order the edges allow.
 * One capture at a time (the emulator's limit, not CUDA's).
 */
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu.h"

namespace emu {

/* ---- operations ---- */

static void implicit_deps(Stream *s, std::vector<OpRef> &deps)
{
	State &st = S();
	auto add = [&](const OpRef &o) {
		if (o && o->state != Op::DONE)
			deps.push_back(o);
	};
	add(s->last);
	if (s->legacy) {
		for (Stream *b : st.streams)
			if (!(b->flags & cudaStreamNonBlocking))
				add(b->last);
	} else if (!(s->flags & cudaStreamNonBlocking)) {
		add(st.legacy.last);
	}
}

static OpRef new_op(std::shared_ptr<Work> w, int stream_id, std::vector<OpRef> deps)
{
	State &st = S();
	OpRef op = std::make_shared<Op>();
	op->seq = ++st.op_seq;
	op->work = std::move(w);
	op->deps = std::move(deps);
	op->stream_id = stream_id;
	op->work->issued(*op);
	st.pending.push_back(op);
	return op;
}

static OpRef enqueue(Stream *s, std::shared_ptr<Work> w, std::vector<OpRef> extra = {})
{
	std::vector<OpRef> deps;
	implicit_deps(s, deps);
	for (auto &d : extra)
		if (d && d->state != Op::DONE)
			deps.push_back(d);
	OpRef op = new_op(std::move(w), s->id, std::move(deps));
	s->last = op;
	return op;
}

/* DPEMU_PROFILE=1: seconds per kind of work, printed at exit. */
static std::map<std::string, std::pair<double, long>> *profile;
static void profile_print()
{
	std::vector<std::pair<double, std::string>> v;
	for (auto &kv : *profile)
		v.push_back({kv.second.first, kv.first});
	std::sort(v.rbegin(), v.rend());
	for (auto &x : v)
		note("profile: %8.3f s %7ld x %s", x.first, (*profile)[x.second].second, x.second.c_str());
}
static void profile_add(std::string what, double t)
{
	if (!profile) {
		profile = new std::map<std::string, std::pair<double, long>>;
		atexit(profile_print);
	}
	size_t cut = what.find("<<<");
	if (cut != std::string::npos)
		what.resize(cut);
	auto &e = (*profile)[what];
	e.first += t;
	e.second++;
}

static bool deps_done(Op &op)
{
	size_t j = 0;
	for (size_t i = 0; i < op.deps.size(); i++)
		if (op.deps[i]->state != Op::DONE)
			op.deps[j++] = op.deps[i];
	op.deps.resize(j);
	return j == 0;
}

static void complete(Op &op)
{
	op.state = Op::DONE;
	op.deps.clear();
	op.flight.reset();
	op.done_at = now_s();
}

/* One scheduling decision: poll what is in flight, then run or finish one
 * ready operation (preferring those in `prefer`). false: nothing could. */
static bool step(const std::set<Op *> *prefer)
{
	State &st = S();
	std::vector<Op *> ready;
	for (auto &o : st.pending) {
		Op &op = *o;
		if (op.work->comm() && !collective_may_run(op.work->comm()))
			continue; /* an aborting thread other than MPI's main one */
		if (op.state == Op::FLIGHT && op.work->poll(op))
			op.state = Op::FINISHABLE;
		if (op.state == Op::FINISHABLE) {
			ready.push_back(&op);
			continue;
		}
		if (op.state != Op::PENDING || op.stalled || !deps_done(op) || !op.work->can_start(op))
			continue;
		ready.push_back(&op);
	}
	if (ready.empty())
		return false;
	std::vector<Op *> pool;
	if (prefer)
		for (Op *op : ready)
			if (prefer->count(op))
				pool.push_back(op);
	if (pool.empty())
		pool = ready;
	if (cfg().copy_late || cfg().copy_early) { /* copies last (or first) */
		std::vector<Op *> other;
		for (Op *op : pool)
			if ((op->work->what().compare(0, 15, "cudaMemcpyAsync") != 0) ==
			    !cfg().copy_early)
				other.push_back(op);
		if (!other.empty())
			pool = other;
	}
	Pick pc = cfg().comm;
	bool want_comm = pc == PICK_HIGH || (pc == PICK_RANDOM && rnd(2));
	std::vector<Op *> cls;
	for (Op *op : pool)
		if ((op->work->comm() != nullptr) == want_comm)
			cls.push_back(op);
	if (cls.empty())
		cls = pool;
	Op *op = cls[rnd(cls.size())];
	OpRef keep;
	for (auto &o : st.pending)
		if (o.get() == op)
			keep = o;
	if (cfg().trace)
		note("%s #%llu (stream %d): %s", op->state == Op::FINISHABLE ? "finish" : "run",
		     (unsigned long long)op->seq, op->stream_id, op->work->what().c_str());
	open_device_memory();
	double t0 = cfg().profile ? now_s() : 0;
	if (op->state == Op::FINISHABLE) {
		op->work->finish(*op);
		complete(*op);
	} else if (op->work->start(*op)) {
		complete(*op);
	} else if (op->state == Op::PENDING) {
		op->state = Op::FLIGHT;
	}
	if (cfg().profile)
		profile_add(op->work->what(), now_s() - t0);
	auto &p = st.pending;
	p.erase(std::remove_if(p.begin(), p.end(), [](const OpRef &o) { return o->state == Op::DONE; }),
		p.end());
	return true;
}

bool run_one()
{
	Session sess;
	return step(nullptr);
}

static void ancestors(const OpRef &t, std::set<Op *> &out)
{
	std::vector<Op *> stack{t.get()};
	while (!stack.empty()) {
		Op *o = stack.back();
		stack.pop_back();
		if (!out.insert(o).second)
			continue;
		for (auto &d : o->deps)
			if (d->state != Op::DONE)
				stack.push_back(d.get());
	}
}

static std::string pending_text()
{
	std::string s;
	int n = 0;
	for (auto &o : S().pending) {
		if (n++ == 6) {
			s += "; ...";
			break;
		}
		char buf[96];
		snprintf(buf, sizeof buf, "%s#%llu (stream %d, %s): ", n > 1 ? "; " : "",
			 (unsigned long long)o->seq, o->stream_id,
			 o->stalled                      ? "stalled by DPEMU_STALL"
			 : o->state == Op::FLIGHT        ? "in flight"
			 : o->state == Op::FINISHABLE    ? "finishing"
			 : !o->deps.empty()              ? "waiting for its dependencies"
							 : "waiting for its turn on its communicator");
		s += buf + o->work->what();
	}
	return s;
}

std::string pending_ops_text()
{
	return pending_text();
}

void run_until(const std::function<bool()> &done, const OpRef &target, const char *api)
{
	Session sess;
	Pick run = cfg().run;
	bool lazy = run == PICK_LOW || (run == PICK_RANDOM && rnd(2));
	std::set<Op *> anc;
	if (lazy && target)
		ancestors(target, anc);
	double t0 = now_s();
	bool warned = false;
	while (!done()) {
		if (step(lazy && target ? &anc : nullptr))
			continue;
		bool waiting = false, stalled = false;
		for (auto &o : S().pending) {
			waiting |= o->state == Op::FLIGHT;
			stalled |= o->stalled;
		}
		if (!waiting && !stalled)
			fatal("%s waits for device work that can never run: %s", api,
			      pending_text().c_str());
		if (!warned && now_s() - t0 > 30) {
			warned = true;
			note("%s has blocked for 30 s (a blocking wait no watchdog sees): %s", api,
			     pending_text().c_str());
		}
		/* Nothing can run until another rank's collective completes: sleep,
		 * 20 us at first and then a hundredth of the wait so far, at most
		 * 1 ms (runtime/world.c's back-off), so a rank waiting on a peer
		 * that shares its core is not woken 50,000 times a second (system
		 * time that did no work: a fifth of the emulator suites' CPU).
		 * What runs, and in which order, is the scheduler's choice at the
		 * next step() whatever the sleep was. */
		long ns = (long)((now_s() - t0) * 1e7);
		struct timespec ts = {0, ns < 20000 ? 20000 : ns > 1000000 ? 1000000 : ns};
		nanosleep(&ts, NULL);
	}
}

/* What a query lets the device do before answering. */
static void progress()
{
	Pick run = cfg().run;
	long budget = run == PICK_HIGH ? (1L << 30) : run == PICK_LOW ? 1 + (long)rnd(4) : 1 + (long)rnd(16);
	Session sess;
	for (long i = 0; i < budget && step(nullptr); i++)
		;
}

/* After an enqueue: the device may start right away. */
static void maybe_eager()
{
	Pick run = cfg().run;
	long n = run == PICK_HIGH ? (1L << 30) : run == PICK_LOW ? 0 : (rnd(4) == 0 ? (long)rnd(8) : 0);
	if (!n)
		return;
	Session sess;
	for (long i = 0; i < n && step(nullptr); i++)
		;
}

static void wait_op(const OpRef &op, const char *api)
{
	if (op)
		run_until([op] { return op->state == Op::DONE; }, op, api);
}

static void sync_all(const char *api)
{
	run_until([] { return S().pending.empty(); }, nullptr, api);
}

/* ---- streams ---- */

Stream *stream_of(cudaStream_t h, const char *api)
{
	State &st = S();
	if (!h || h == cudaStreamLegacy || h == cudaStreamPerThread)
		return &st.legacy;
	Stream *s = (Stream *)h;
	if (!st.streams.count(s)) {
		misuse(cudaErrorInvalidResourceHandle, "%s: stream %p is not a live stream", api, (void *)h);
		return nullptr;
	}
	return s;
}

bool capturing()
{
	Capture *c = S().capture;
	return c && c->mode != cudaStreamCaptureModeRelaxed;
}

static const char *mode_name(cudaStreamCaptureMode m)
{
	return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

cudaError_t capture_violation(const char *api)
{
	Capture *c = S().capture;
	if (!c->invalid) {
		c->invalid = true;
		c->why = api;
	}
	note("%s while stream %d is capturing (%s mode): not permitted during stream capture; the "
	     "capture is invalidated", api, c->origin->id, mode_name(c->mode));
	return record(cudaErrorStreamCaptureUnsupported);
}

void stream_free_check(const Stream *s, const char *api)
{
	if (s->nccl_pending)
		fatal("%s on stream %d while a collective issued on it returned ncclInProgress and is "
		      "not enqueued yet: NCCL forbids work on its streams until ncclCommGetAsyncError "
		      "says ncclSuccess (the helper thread enqueues the collective later, so this work "
		      "would run before it)", api, s->id);
}

cudaError_t submit(Stream *s, std::shared_ptr<Work> w, const char *api)
{
	State &st = S();
	stream_free_check(s, api);
	if (s->cap) {
		Capture *c = s->cap;
		if (c->invalid)
			return record(cudaErrorStreamCaptureInvalidated);
		int idx = (int)c->g->nodes.size();
		c->g->nodes.push_back(Node{w, s->cap_deps, s->id});
		if (w->comm())
			c->g->comms.insert(w->comm());
		s->cap_deps.assign(1, idx);
		return cudaSuccess;
	}
	if (s->legacy && capturing())
		return capture_violation(api); /* the legacy stream would join the capture */
	(void)st;
	enqueue(s, std::move(w));
	maybe_eager();
	return cudaSuccess;
}

/* A no-op marking a point of a stream (event records, waits, graph ends). */
static std::shared_ptr<Work> mark(const char *what)
{
	return std::make_shared<FnWork>(what, nullptr);
}

/* ---- copies and sets ---- */

struct CopyWork : Work {
	char *dst;
	const char *src;
	size_t dpitch, spitch, width, rows;
	std::vector<char> snapshot; /* pageable host source, staged at the call */
	std::string name;
	std::string what() const override { return name; }
	bool start(Op &) override
	{
		const char *from = snapshot.empty() ? src : snapshot.data();
		size_t sp = snapshot.empty() ? spitch : width;
		for (size_t r = 0; r < rows; r++)
			memcpy(dst + r * dpitch, from + r * sp, width);
		return true;
	}
};

struct SetWork : Work {
	void *dst;
	int value;
	size_t n;
	std::string what() const override
	{
		char b[64];
		snprintf(b, sizeof b, "cudaMemsetAsync %zu bytes", n);
		return b;
	}
	bool start(Op &) override
	{
		memset(dst, value, n);
		return true;
	}
};

struct HostFnWork : Work {
	cudaHostFn_t fn;
	void *data;
	std::string what() const override { return "host function"; }
	bool start(Op &) override
	{
		HostSection hs; /* host code: device memory is closed again */
		S().in_host_fn = true;
		fn(data);
		S().in_host_fn = false;
		return true;
	}
};

static const char *kind_name(cudaMemcpyKind k)
{
	static const char *n[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
	return (unsigned)k <= 4 ? n[k] : "?";
}

static bool host_side(MemKind k) { return k == MEM_HOST || k == MEM_PINNED; }

/* Check a copy's pointers against its kind and its extents against their
 * allocations; on success the inferred kind and the copy's work. */
static cudaError_t make_copy(const char *api, void *dst, size_t dpitch, const void *src,
			     size_t spitch, size_t width, size_t rows, cudaMemcpyKind kind,
			     std::shared_ptr<CopyWork> *out, MemKind *dk, MemKind *sk)
{
	if ((unsigned)kind > cudaMemcpyDefault)
		return misuse(cudaErrorInvalidMemcpyDirection, "%s: kind %d", api, (int)kind);
	if (rows > 1 && (dpitch < width || spitch < width))
		return misuse(cudaErrorInvalidPitchValue, "%s: pitch (dst %zu, src %zu) below the "
			      "width %zu", api, dpitch, spitch, width);
	if (rows > 1 && (dpitch > 2147483647u || spitch > 2147483647u))
		return misuse(cudaErrorInvalidPitchValue, "%s: pitch (dst %zu, src %zu) above the "
			      "device's memPitch (2147483647 bytes)", api, dpitch, spitch);
	size_t dext = rows ? dpitch * (rows - 1) + width : 0, sext = rows ? spitch * (rows - 1) + width : 0;
	Where wd = classify(dst), ws = classify(src);
	*dk = wd.kind;
	*sk = ws.kind;
	if (width && rows) {
		if (!dst || !src)
			return misuse(cudaErrorInvalidValue, "%s: NULL pointer", api);
		if (wd.kind == MEM_INVALID || ws.kind == MEM_INVALID)
			return misuse(cudaErrorInvalidValue, "%s: %s is not a live allocation", api,
				      describe(wd.kind == MEM_INVALID ? dst : src).c_str());
		bool ok = true;
		switch (kind) {
		case cudaMemcpyHostToDevice: ok = host_side(ws.kind) && wd.kind == MEM_DEVICE; break;
		case cudaMemcpyDeviceToHost: ok = ws.kind == MEM_DEVICE && host_side(wd.kind); break;
		case cudaMemcpyDeviceToDevice: ok = ws.kind == MEM_DEVICE && wd.kind == MEM_DEVICE; break;
		case cudaMemcpyHostToHost: ok = host_side(ws.kind) && host_side(wd.kind); break;
		default: break;
		}
		if (!ok)
			return misuse(cudaErrorInvalidValue, "%s: cudaMemcpy%s, but the source is %s and "
				      "the destination %s (a copy of the wrong kind)", api,
				      kind_name(kind), describe(src).c_str(), describe(dst).c_str());
		if (!within(wd, dst, dext) || !within(ws, src, sext))
			return misuse(cudaErrorInvalidValue, "%s: %zu bytes to %s from %s run past the end "
				      "of an allocation", api, width * rows, describe(dst).c_str(),
				      describe(src).c_str());
		uintptr_t d0 = (uintptr_t)dst, s0 = (uintptr_t)src;
		if (d0 != s0 && d0 < s0 + sext && s0 < d0 + dext)
			return misuse(cudaErrorInvalidValue, "%s: source %s and destination %s overlap "
				      "(undefined in CUDA)", api, describe(src).c_str(), describe(dst).c_str());
	}
	auto w = std::make_shared<CopyWork>();
	w->dst = (char *)dst;
	w->src = (const char *)src;
	w->dpitch = rows > 1 ? dpitch : width;
	w->spitch = rows > 1 ? spitch : width;
	w->width = width;
	w->rows = rows;
	char b[160];
	snprintf(b, sizeof b, "%s %zu x %zu bytes %s", api, rows, width,
		 kind_name(kind == cudaMemcpyDefault ? (cudaMemcpyKind)(2 * (ws.kind == MEM_DEVICE) +
									(wd.kind == MEM_DEVICE))
						     : kind));
	w->name = b;
	*out = w;
	return cudaSuccess;
}

static cudaError_t copy(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch,
			size_t width, size_t rows, cudaMemcpyKind kind, cudaStream_t h, bool sync)
{
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = sync ? &S().legacy : stream_of(h, api);
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (sync && capturing())
		return capture_violation(api);
	std::shared_ptr<CopyWork> w;
	MemKind dk = MEM_HOST, sk = MEM_HOST;
	if (cudaError_t e = make_copy(api, dst, dpitch, src, spitch, width, rows, kind, &w, &dk, &sk))
		return e;
	if (!width || !rows)
		return cudaSuccess;
	bool pageable = (dk == MEM_HOST || sk == MEM_HOST) && !(dk == MEM_HOST && sk == MEM_HOST);
	if (pageable && s->cap) {
		if (!s->cap->invalid) {
			s->cap->invalid = true;
			s->cap->why = api + std::string(" with pageable host memory");
		}
		return misuse(cudaErrorStreamCaptureUnsupported, "%s from/to pageable host memory (%s) "
			      "while capturing: a graph cannot stage pageable memory; use pinned memory "
			      "(the capture is invalidated)", api,
			      describe(dk == MEM_HOST ? dst : src).c_str());
	}
	if (sk == MEM_HOST && dk != MEM_HOST) { /* staged now: the host may reuse its buffer */
		w->snapshot.resize(width * rows);
		for (size_t r = 0; r < rows; r++)
			memcpy(w->snapshot.data() + r * width, (const char *)src + r * spitch, width);
	}
	if (cudaError_t e = submit(s, w, api))
		return e;
	/* synchronous: cudaMemcpy except device to device; an asynchronous
	 * copy into pageable memory returns only when done */
	bool wait = (sync && !(dk == MEM_DEVICE && sk == MEM_DEVICE)) || (dk == MEM_HOST && sk != MEM_HOST);
	if (wait)
		wait_op(s->last, api);
	return cudaSuccess;
}

static cudaError_t set(const char *api, void *dst, int value, size_t n, cudaStream_t h, bool sync)
{
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = sync ? &S().legacy : stream_of(h, api);
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (sync && capturing())
		return capture_violation(api);
	if (!n)
		return cudaSuccess;
	Where w = classify(dst);
	if (w.kind != MEM_DEVICE || !within(w, dst, n))
		return misuse(cudaErrorInvalidValue, "%s: %zu bytes at %s: not inside one device "
			      "allocation", api, n, describe(dst).c_str());
	auto sw = std::make_shared<SetWork>();
	sw->dst = dst;
	sw->value = value;
	sw->n = n;
	return submit(s, sw, api);
}

} // namespace emu

using namespace emu;

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	EMU_API_ENTRY("cudaMemcpy");
	return copy("cudaMemcpy", dst, n, src, n, n, 1, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			    cudaStream_t st)
{
	EMU_API_ENTRY("cudaMemcpyAsync");
	return copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, st, false);
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
			 size_t height, enum cudaMemcpyKind kind)
{
	EMU_API_ENTRY("cudaMemcpy2D");
	return copy("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind, nullptr, true);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
			      size_t width, size_t height, enum cudaMemcpyKind kind, cudaStream_t st)
{
	EMU_API_ENTRY("cudaMemcpy2DAsync");
	return copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, st, false);
}

cudaError_t cudaMemset(void *dst, int value, size_t n)
{
	EMU_API_ENTRY("cudaMemset");
	return set("cudaMemset", dst, value, n, nullptr, true);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t st)
{
	EMU_API_ENTRY("cudaMemsetAsync");
	return set("cudaMemsetAsync", dst, value, n, st, false);
}

cudaError_t cudaFree(void *p)
{
	EMU_API_ENTRY("cudaFree");
	if (cudaError_t e = init_error())
		return record(e);
	if (capturing())
		return capture_violation("cudaFree");
	sync_all("cudaFree"); /* cudaFree synchronises the device */
	return dev_free(p);
}

cudaError_t cudaFreeHost(void *p)
{
	EMU_API_ENTRY("cudaFreeHost");
	if (cudaError_t e = init_error())
		return record(e);
	if (capturing())
		return capture_violation("cudaFreeHost");
	sync_all("cudaFreeHost");
	return host_free(p);
}

cudaError_t cudaDeviceSynchronize(void)
{
	EMU_API_ENTRY("cudaDeviceSynchronize");
	if (cudaError_t e = init_error())
		return record(e);
	if (capturing())
		return capture_violation("cudaDeviceSynchronize");
	sync_all("cudaDeviceSynchronize");
	return cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
	return cudaDeviceSynchronize();
}

/* ---- streams ---- */

/* The range an H100 reports (CUDA 12+): 0 (the default, least) to -5. */
enum { EMU_PRIO_LEAST = 0, EMU_PRIO_GREATEST = -5 };

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
	EMU_API_ENTRY("cudaDeviceGetStreamPriorityRange");
	if (cudaError_t e = init_error())
		return record(e);
	if (least)
		*least = EMU_PRIO_LEAST;
	if (greatest)
		*greatest = EMU_PRIO_GREATEST;
	return cudaSuccess;
}

/* A priority outside the range is clamped to it (the runtime's documented
 * behaviour). */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned int flags, int priority)
{
	EMU_API_ENTRY("cudaStreamCreateWithPriority");
	if (cudaError_t e = init_error())
		return record(e);
	if (!ps || (flags & ~1u))
		return record(cudaErrorInvalidValue);
	State &st = S();
	int p = priority > EMU_PRIO_LEAST ? EMU_PRIO_LEAST : priority < EMU_PRIO_GREATEST ? EMU_PRIO_GREATEST
														   : priority;
	Stream *s = new Stream{st.next_stream_id++, flags, false, p, nullptr, nullptr, {}};
	st.streams.insert(s);
	*ps = (cudaStream_t)s;
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
	return cudaStreamCreateWithPriority(ps, flags, 0);
}

cudaError_t cudaStreamGetPriority(cudaStream_t h, int *priority)
{
	EMU_API_ENTRY("cudaStreamGetPriority");
	Stream *s = stream_of(h, "cudaStreamGetPriority");
	if (!s || !priority)
		return record(cudaErrorInvalidValue);
	*priority = s->priority;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *ps)
{
	return cudaStreamCreateWithFlags(ps, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
	EMU_API_ENTRY("cudaStreamDestroy");
	Stream *s = stream_of(h, "cudaStreamDestroy");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (s->legacy)
		return misuse(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the legacy stream");
	if (s->cap)
		return misuse(cudaErrorIllegalState, "cudaStreamDestroy of stream %d while it is "
			      "capturing", s->id);
	S().streams.erase(s); /* its queued work still runs */
	delete s;
	return cudaSuccess;
}

/* A stream a query or a synchronize may look at (not during a capture). */
static cudaError_t waitable_stream(cudaStream_t h, const char *api, Stream **out)
{
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = stream_of(h, api);
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (capturing() || s->cap)
		return capture_violation(api);
	*out = s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
	EMU_API_ENTRY("cudaStreamSynchronize");
	Stream *s = nullptr;
	if (cudaError_t e = waitable_stream(h, "cudaStreamSynchronize", &s))
		return e;
	wait_op(s->last, "cudaStreamSynchronize");
	return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
	EMU_API_ENTRY("cudaStreamQuery");
	Stream *s = nullptr;
	if (cudaError_t e = waitable_stream(h, "cudaStreamQuery", &s))
		return e;
	progress();
	return s->last && s->last->state != Op::DONE ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data)
{
	EMU_API_ENTRY("cudaLaunchHostFunc");
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = stream_of(h, "cudaLaunchHostFunc");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (!fn)
		return record(cudaErrorInvalidValue);
	auto w = std::make_shared<HostFnWork>();
	w->fn = fn;
	w->data = data;
	return submit(s, w, "cudaLaunchHostFunc");
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags)
{
	EMU_API_ENTRY("cudaEventCreateWithFlags");
	if (cudaError_t e = init_error())
		return record(e);
	if (!pe || (flags & ~0x7u))
		return record(cudaErrorInvalidValue);
	Event *ev = new Event;
	ev->flags = flags;
	S().events.insert(ev);
	*pe = (cudaEvent_t)ev;
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe)
{
	return cudaEventCreateWithFlags(pe, cudaEventDefault);
}

static Event *event_of(cudaEvent_t h, const char *api)
{
	Event *ev = (Event *)h;
	if (!ev || !S().events.count(ev)) {
		misuse(cudaErrorInvalidResourceHandle, "%s: event %p is not a live event", api, (void *)h);
		return nullptr;
	}
	return ev;
}

cudaError_t cudaEventDestroy(cudaEvent_t h)
{
	EMU_API_ENTRY("cudaEventDestroy");
	Event *ev = event_of(h, "cudaEventDestroy");
	if (!ev)
		return cudaErrorInvalidResourceHandle;
	S().events.erase(ev);
	delete ev;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t st)
{
	EMU_API_ENTRY("cudaEventRecord");
	if (cudaError_t e = init_error())
		return record(e);
	Event *ev = event_of(h, "cudaEventRecord");
	Stream *s = stream_of(st, "cudaEventRecord");
	if (!ev || !s)
		return cudaErrorInvalidResourceHandle;
	stream_free_check(s, "cudaEventRecord");
	if (s->cap) {
		if (s->cap->invalid)
			return record(cudaErrorStreamCaptureInvalidated);
		ev->rec.reset();
		ev->cap_id = s->cap->id;
		ev->cap_nodes = s->cap_deps;
		return cudaSuccess;
	}
	if (s->legacy && capturing())
		return capture_violation("cudaEventRecord on the legacy stream");
	ev->cap_id = 0;
	ev->rec = enqueue(s, mark("event record"));
	maybe_eager();
	return cudaSuccess;
}

/* An event a query or a synchronize may look at (not during a capture,
 * not last recorded in one). */
static cudaError_t waitable(cudaEvent_t h, const char *api, Event **out)
{
	if (cudaError_t e = init_error())
		return record(e);
	Event *ev = event_of(h, api);
	if (!ev)
		return cudaErrorInvalidResourceHandle;
	if (capturing())
		return capture_violation(api);
	if (ev->cap_id)
		return misuse(cudaErrorCapturedEvent, "%s of an event last recorded in a stream capture",
			      api);
	*out = ev;
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t h)
{
	EMU_API_ENTRY("cudaEventQuery");
	Event *ev = nullptr;
	if (cudaError_t e = waitable(h, "cudaEventQuery", &ev))
		return e;
	progress();
	return ev->rec && ev->rec->state != Op::DONE ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h)
{
	EMU_API_ENTRY("cudaEventSynchronize");
	Event *ev = nullptr;
	if (cudaError_t e = waitable(h, "cudaEventSynchronize", &ev))
		return e;
	wait_op(ev->rec, "cudaEventSynchronize");
	return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	EMU_API_ENTRY("cudaEventElapsedTime");
	Event *ea = event_of(a, "cudaEventElapsedTime"), *eb = event_of(b, "cudaEventElapsedTime");
	if (!ea || !eb)
		return cudaErrorInvalidResourceHandle;
	if (!ms)
		return record(cudaErrorInvalidValue);
	if ((ea->flags | eb->flags) & cudaEventDisableTiming)
		return misuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime on an event made "
			      "with cudaEventDisableTiming");
	if (!ea->rec || !eb->rec)
		return record(cudaErrorInvalidResourceHandle);
	if (ea->rec->state != Op::DONE || eb->rec->state != Op::DONE)
		return cudaErrorNotReady;
	*ms = (float)((eb->rec->done_at - ea->rec->done_at) * 1e3); /* emulator time, not the GPU's */
	return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t h, unsigned int flags)
{
	EMU_API_ENTRY("cudaStreamWaitEvent");
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = stream_of(st, "cudaStreamWaitEvent");
	Event *ev = event_of(h, "cudaStreamWaitEvent");
	if (!ev || !s)
		return cudaErrorInvalidResourceHandle;
	if (flags & ~1u)
		return record(cudaErrorInvalidValue);
	stream_free_check(s, "cudaStreamWaitEvent");
	Capture *c = S().capture;
	if (ev->cap_id) { /* recorded in a capture: join it */
		if (!c || c->id != ev->cap_id)
			return misuse(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent on stream %d: "
				      "the event was last recorded in a capture that has ended", s->id);
		if (s->cap == c) {
			for (int n : ev->cap_nodes)
				if (std::find(s->cap_deps.begin(), s->cap_deps.end(), n) == s->cap_deps.end())
					s->cap_deps.push_back(n);
			return cudaSuccess;
		}
		if (s->cap)
			return misuse(cudaErrorStreamCaptureMerge, "cudaStreamWaitEvent: stream %d is in "
				      "another capture", s->id);
		if (s->legacy)
			return capture_violation("cudaStreamWaitEvent on the legacy stream");
		if (c->invalid)
			return record(cudaErrorStreamCaptureInvalidated);
		s->cap = c;
		s->cap_deps = ev->cap_nodes;
		c->members.insert(s);
		return cudaSuccess;
	}
	if (s->cap) {
		if (!(flags & cudaEventWaitExternal)) {
			if (!s->cap->invalid) {
				s->cap->invalid = true;
				s->cap->why = "cudaStreamWaitEvent on an event recorded outside the capture";
			}
			return misuse(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent: capturing "
				      "stream %d waits for an event recorded outside the capture", s->id);
		}
		return cudaSuccess;
	}
	if (s->legacy && capturing())
		return capture_violation("cudaStreamWaitEvent on the legacy stream");
	if (ev->rec && ev->rec->state != Op::DONE)
		enqueue(s, mark("event wait"), {ev->rec});
	return cudaSuccess;
}

/* ---- capture ---- */

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode)
{
	EMU_API_ENTRY("cudaStreamBeginCapture");
	if (cudaError_t e = init_error())
		return record(e);
	Stream *s = stream_of(st, "cudaStreamBeginCapture");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
		return record(cudaErrorInvalidValue);
	if (s->legacy)
		return misuse(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture on the legacy "
			      "stream");
	if (s->cap)
		return misuse(cudaErrorIllegalState, "cudaStreamBeginCapture: stream %d is already "
			      "capturing", s->id);
	State &S_ = S();
	if (S_.capture)
		fatal("cudaStreamBeginCapture on stream %d while stream %d captures: the emulator runs "
		      "one capture at a time", s->id, S_.capture->origin->id);
	Capture *c = new Capture;
	c->id = ++S_.capture_ids;
	c->origin = s;
	c->mode = mode;
	c->g = std::make_shared<GraphData>();
	c->members.insert(s);
	s->cap = c;
	s->cap_deps.clear();
	S_.capture = c;
	return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *pg)
{
	EMU_API_ENTRY("cudaStreamEndCapture");
	Stream *s = stream_of(st, "cudaStreamEndCapture");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (!pg)
		return record(cudaErrorInvalidValue);
	*pg = nullptr;
	if (!s->cap)
		return misuse(cudaErrorIllegalState, "cudaStreamEndCapture: stream %d is not capturing",
			      s->id);
	Capture *c = s->cap;
	if (s != c->origin)
		return misuse(cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture on stream %d, but "
			      "the capture began on stream %d", s->id, c->origin->id);
	auto end = [c] {
		for (Stream *m : c->members) {
			if (S().streams.count(m) || m == c->origin) {
				m->cap = nullptr;
				m->cap_deps.clear();
			}
		}
		S().capture = nullptr;
		delete c;
	};
	for (Stream *m : c->members)
		if ((S().streams.count(m) || m == c->origin) && m->nccl_pending)
			fatal("cudaStreamEndCapture while a collective captured on stream %d is still "
			      "ncclInProgress: NCCL's helper thread has not enqueued it, so the graph would "
			      "lack it (settle it with ncclCommGetAsyncError first)", m->id);
	if (c->invalid) {
		note("cudaStreamEndCapture: the capture was invalidated by %s", c->why.c_str());
		end();
		return record(cudaErrorStreamCaptureInvalidated);
	}
	/* every stream that joined must have joined back: its last nodes are
	 * ancestors of the origin's */
	std::set<int> anc;
	std::vector<int> stack = s->cap_deps;
	while (!stack.empty()) {
		int n = stack.back();
		stack.pop_back();
		if (!anc.insert(n).second)
			continue;
		for (int d : c->g->nodes[n].deps)
			stack.push_back(d);
	}
	for (Stream *m : c->members) {
		if (m == s)
			continue;
		for (int n : m->cap_deps)
			if (!anc.count(n)) {
				note("cudaStreamEndCapture: stream %d forked into the capture and was not "
				     "joined back (its last captured work: %s)", m->id,
				     c->g->nodes[n].work->what().c_str());
				end();
				return record(cudaErrorStreamCaptureUnjoined);
			}
	}
	auto *g = new std::shared_ptr<GraphData>(c->g);
	S().graphs.insert(g);
	for (NcclComm *nc : c->g->comms)
		comm_graph_ref(nc, +1);
	end();
	*pg = (cudaGraph_t)g;
	return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *status)
{
	EMU_API_ENTRY("cudaStreamIsCapturing");
	Stream *s = stream_of(st, "cudaStreamIsCapturing");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (!status)
		return record(cudaErrorInvalidValue);
	if (s->legacy && capturing())
		return record(cudaErrorStreamCaptureImplicit);
	*status = !s->cap ? cudaStreamCaptureStatusNone
		  : s->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
	return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
	static cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
	if (!mode)
		return record(cudaErrorInvalidValue);
	std::swap(current, *mode);
	return cudaSuccess;
}

/* ---- graphs ---- */

static std::shared_ptr<GraphData> *graph_of(void *h, bool exec, const char *api)
{
	auto *g = (std::shared_ptr<GraphData> *)h;
	auto &set = exec ? S().execs : S().graphs;
	if (!g || !set.count(g)) {
		misuse(cudaErrorInvalidValue, "%s: %p is not a live %s", api, h, exec ? "graph exec" : "graph");
		return nullptr;
	}
	return g;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pe, cudaGraph_t graph, unsigned long long flags)
{
	EMU_API_ENTRY("cudaGraphInstantiate");
	if (!pe)
		return record(cudaErrorInvalidValue);
	auto *g = graph_of(graph, false, "cudaGraphInstantiate");
	if (!g)
		return cudaErrorInvalidValue;
	if (flags & ~0xfull)
		return record(cudaErrorInvalidValue);
	auto *x = new std::shared_ptr<GraphData>(*g);
	S().execs.insert(x);
	for (NcclComm *nc : (*g)->comms)
		comm_graph_ref(nc, +1);
	*pe = (cudaGraphExec_t)x;
	return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pe, cudaGraph_t graph, unsigned long long flags)
{
	return cudaGraphInstantiateWithFlags(pe, graph, flags);
}

cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t st)
{
	EMU_API_ENTRY("cudaGraphUpload");
	if (!graph_of(exec, true, "cudaGraphUpload"))
		return cudaErrorInvalidValue;
	Stream *s = stream_of(st, "cudaGraphUpload");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	return submit(s, mark("graph upload"), "cudaGraphUpload");
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st)
{
	EMU_API_ENTRY("cudaGraphLaunch");
	if (cudaError_t e = init_error())
		return record(e);
	auto *x = graph_of(exec, true, "cudaGraphLaunch");
	if (!x)
		return cudaErrorInvalidValue;
	Stream *s = stream_of(st, "cudaGraphLaunch");
	if (!s)
		return cudaErrorInvalidResourceHandle;
	if (s->cap)
		fatal("cudaGraphLaunch into a capturing stream: child graphs are not emulated");
	stream_free_check(s, "cudaGraphLaunch");
	if (s->legacy && capturing())
		return capture_violation("cudaGraphLaunch on the legacy stream");
	const GraphData &g = **x;
	std::vector<OpRef> base;
	implicit_deps(s, base);
	std::vector<OpRef> ops(g.nodes.size());
	for (size_t i = 0; i < g.nodes.size(); i++) {
		const Node &n = g.nodes[i];
		std::vector<OpRef> deps;
		for (int d : n.deps)
			deps.push_back(ops[d]);
		if (n.deps.empty())
			deps = base;
		ops[i] = new_op(n.work, n.stream_id, std::move(deps));
	}
	/* the launch holds its communicators until its last node is done, as a
	 * launched graph holds NCCL's user objects (a destroyed graph exec is
	 * freed only on completion: ncclCommAbort and Destroy wait for it) */
	std::vector<NcclComm *> held(g.comms.begin(), g.comms.end());
	for (NcclComm *nc : held)
		comm_launch_ref(nc, +1);
	S().exec_launches[exec]++;
	s->last = new_op(std::make_shared<FnWork>("graph end", [held, exec] {
				 for (NcclComm *nc : held)
					 comm_launch_ref(nc, -1);
				 auto it = S().exec_launches.find(exec);
				 if (it != S().exec_launches.end() && --it->second == 0)
					 S().exec_launches.erase(it);
			 }),
			 s->id, ops);
	maybe_eager();
	return cudaSuccess;
}

/* Destroying a graph exec whose launch has not completed waits for the
 * launch (the H200 did, driver 580: a launch stuck on a collective made
 * cuGraphExecDestroy block; emu.h's Teardown says why that matters), running
 * the device meanwhile; a launch that cannot complete is the hang it is. */
static cudaError_t graph_free(void *h, bool exec, const char *api)
{
	Teardown td; /* beside aborts on other threads, as dp's abort does */
	EMU_API_ENTRY(api);
	auto *g = graph_of(h, exec, api);
	if (!g)
		return cudaErrorInvalidValue;
	if (exec)
		teardown_wait(
			td, [h] { return S().exec_launches.count(h) == 0; }, [] { return 0L; },
			[h, api] {
				char buf[1024];
				snprintf(buf, sizeof buf,
					 "%s hangs: %d launch(es) of this graph exec have not completed and no "
					 "device work has completed for %g s; pending: %s. On hardware "
					 "cudaGraphExecDestroy waits for an in-flight launch (the H200, driver "
					 "580): a launch stuck on a collective ends only when its communicator's "
					 "abort flag is raised. Abort the communicators first (each "
					 "ncclCommAbort on a thread of its own), then destroy the graph.",
					 api, S().exec_launches.count(h) ? S().exec_launches[h] : 0,
					 cfg().abort_hang_s, pending_ops_text().c_str());
				return std::string(buf);
			});
	for (NcclComm *nc : (*g)->comms)
		comm_graph_ref(nc, -1);
	(exec ? S().execs : S().graphs).erase(g);
	delete g;
	return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
	return graph_free(exec, true, "cudaGraphExecDestroy");
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	return graph_free(graph, false, "cudaGraphDestroy");
}

} // extern "C"
