/*
 * nccl.cc - the CUDA emulator's NCCL subset over MPI (each rank is an MPI
 * process). A communicator is an MPI communicator: ncclCommInitRank splits
 * MPI_COMM_WORLD by the unique id (so every world rank must be initialising
 * some communicator at that point: the emulator's limit), ncclCommSplit
 * splits its parent's (collective over the parent, as in NCCL). With a
 * non-blocking config, init returns ncclInProgress and
 * ncclCommGetAsyncError reports ncclInProgress for a few polls (a seeded
 * number) before ncclSuccess; the MPI part itself is done at the call. A
 * split of a non-blocking parent returns ncclInProgress with newcomm still
 * NULL: the PARENT reports ncclInProgress for a few polls, and the poll
 * that reports ncclSuccess fills newcomm (NCCL 2.23 on, NVIDIA/nccl #1472;
 * PyTorch settles the parent for that reason), after which a non-blocking
 * child settles on its own polls.
 *
 * A collective is queued on its stream (or captured into a graph) when it
 * is called, after NCCL's argument checks (communicator, type, operation,
 * device buffers of the right extent). A communicator runs its collectives
 * one at a time in the order they were issued on it (calls, and a graph's
 * collectives in capture order at each launch), as NCCL does. When its
 * stream and its communicator let it start, the collective:
 *  1. stages its input in host memory and exchanges a descriptor with every
 *     rank (MPI_Iallgather): kind, type, reduction, count, its number among
 *     the communicator's collectives (its point-to-point calls not counted:
 *     they pair per peer, below) and, unless DPEMU_NCCL_SAME_BUFFERS=0, the
 *     allocation and offset of its buffers (dp's ranks share one layout,
 *     so a different buffer means a different tensor). Any difference is a
 *     mismatch: every rank reports it and exits, where NCCL would hang or
 *     reduce garbage;
 *  2. fills its output with 0xff bytes (NaN) and runs the MPI collective
 *     (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
 *     MPI_Ibcast) while the scheduler runs other work: compute that reads
 *     the output before an event says it may reads NaN;
 *  3. writes the result when the scheduler decides it completes (as late
 *     or as early as the events allow: DPEMU_COMM).
 * bf16 and f16 (ncclHalf, cuda_fp16.h) are summed in fp32 (MPI_FLOAT) and
 * rounded once to nearest even;
 * NCCL rounds after every step of its ring, so NCCL's bf16 sums differ in
 * the last bit (docs/CUDA-EMU.md).
 *
 * Non-blocking communicators (ncclConfig_t.blocking = 0). A collective on
 * one may return ncclInProgress (DPEMU_NCCL_INPROGRESS: never, always, or
 * a seeded coin per call), as NCCL 2.28 does when its helper thread
 * launches the work: the collective is then not on its stream yet; the
 * communicator reports ncclInProgress for a few ncclCommGetAsyncError polls,
 * and the poll that reports ncclSuccess enqueues it (or records it into the
 * capture its stream belongs to). Until then, NCCL's rules are checked
 * (FATAL, where NCCL's behaviour is undefined): no other NCCL call on the
 * communicator but ncclCommGetAsyncError and ncclCommAbort, no work on the
 * stream, and no cudaStreamEndCapture of a capture the stream is in.
 *
 * Abort. NCCL 2.28's ncclCommAbort raises the communicator's abort flag,
 * which makes its kernels (queued, running, or inside graphs) end without
 * results when they next look at it, and then waits (commDestroySync)
 * until every CUDA graph that captured the communicator has been destroyed
 * and every launch of one has completed. cudaGraphExecDestroy of an exec
 * whose launch is in flight waits for the launch (the H200 did; emu.h's
 * Teardown). So a launch stuck on a collective ends only once its
 * communicator's flag is up, the exec is freed only after that, and the
 * abort returns only after that: dp raises every flag first, one thread
 * per communicator, and destroys the graph beside them. Aborts and graph
 * destroys may run on several threads at once (serialised here by the
 * teardown lock); each waits by running the device, and if nothing
 * progresses for DPEMU_ABORT_HANG_S seconds it is the hang it would be on
 * hardware (a launch stuck on a collective of a communicator nobody
 * aborts; a graph nobody destroys): FATAL. A thread other than MPI's main
 * one runs only device work that needs no MPI call (no collective of a
 * communicator not yet aborted).
 *
 * Point-to-point (ncclSend, ncclRecv: the pipeline's transfers). Each is an
 * operation of its communicator like a collective (its turn in the
 * communicator's order, DPEMU_STALL counts it, ncclInProgress on a
 * non-blocking one), between this rank and one
 * peer: when it starts, the two exchange a descriptor (MPI_Isend/MPI_Irecv
 * on the communicator): which call, type, count and the pair's sequence
 * number. The peer's call at the same point of the pair's order must be the
 * other half (a send meets a recv) of the same type and count; anything else
 * is a mismatch that every rank involved reports naming both ranks (NCCL
 * would hang, or move the wrong bytes). A send stages its buffer when it
 * starts (what a stream wait it lacks would leave unwritten, it sends); a
 * recv fills its buffer with 0xff bytes until it finishes.
 *
 * Groups (ncclGroupStart/End) issue their calls at the end, in call order;
 * on a non-blocking communicator ncclGroupEnd may return ncclInProgress as a
 * collective does (the whole group then waits for the polls), when every
 * call of the group is on one communicator and stream.
 *
 * ncclCommFinalize and ncclCommDestroy of a communicator that a live graph
 * captured are reported as a hang too. DPEMU_STALL=RANK[,RANK...]:N stops
 * those ranks' devices at their N-th collective (the fault tests).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>

#include "emu.h"
#include "include/nccl.h"

using namespace emu;

enum Kind { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST };
static const char *kind_names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast"};
static const char *type_names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
				   "float16", "float32", "float64", "bfloat16"};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

namespace emu {
struct NcclComm {
	int id;
	MPI_Comm mpi = MPI_COMM_NULL;
	int rank = 0, nranks = 1;
	int init_polls = 0;       /* non-blocking init or split: polls left reporting ncclInProgress */
	/* a non-blocking split of this communicator: NCCL (2.23 on, NVIDIA/nccl
	 * #1472) fills the caller's newcomm only when this, the parent, stops
	 * reporting ncclInProgress; until then *split_slot stays NULL */
	struct ::ncclComm **split_slot = nullptr;
	struct ::ncclComm *split_child = nullptr;
	bool aborted = false, finalized = false;
	ncclResult_t async = ncclSuccess;
	std::deque<Op *> fifo;    /* issued, not started */
	Op *active = nullptr;     /* started, not finished */
	/* collectives issued: a collective's number, which every rank must
	 * agree on; the point-to-point calls pair per peer (p2p_seq) and are
	 * not counted, since the ranks of a pipeline make different numbers of
	 * them between two collectives of one communicator (NCCL's rule: "the
	 * same order on all ranks" is the collectives'; a send needs only its
	 * peer's recv) */
	uint64_t collectives = 0;
	int graph_refs = 0;       /* graphs and graph execs that captured it */
	int launch_refs = 0;      /* launches of such graphs not finished */
	bool blocking = true;
	/* a collective that returned ncclInProgress: its enqueue, the stream it
	 * waits on, and the polls before ncclCommGetAsyncError runs it */
	std::function<ncclResult_t()> deferred;
	Stream *deferred_stream = nullptr;
	std::string deferred_what;
	int deferred_polls = 0;
	std::map<int, uint64_t> p2p_seq; /* per peer: the transfers started with it */
};
} // namespace emu

struct ncclComm : NcclComm {};

static std::set<ncclComm *> &comms()
{
	static std::set<ncclComm *> *c = new std::set<ncclComm *>;
	return *c;
}
static int next_comm_id;
static std::string last_error;
static int group_depth;
/* a group's calls, issued at its end; each with its communicator and stream */
struct GroupOp {
	std::function<ncclResult_t()> enq;
	ncclComm *comm;
	Stream *stream;
	std::string what;
};
static std::vector<GroupOp> group_ops;

static ncclResult_t nfail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t nfail(ncclResult_t r, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	last_error = buf;
	note("%s", buf);
	return r;
}

static thread_local bool tl_abort; /* this thread is a teardown thread (Teardown) */

static std::mutex &teardown_lock()
{
	static std::mutex *m = new std::mutex; /* never destroyed, as State */
	return *m;
}

namespace emu {
Teardown::Teardown() : was(tl_abort)
{
	tl_abort = true;
	S().aborting++;
	lock = std::unique_lock<std::mutex>(teardown_lock());
}

Teardown::~Teardown()
{
	lock.unlock();
	S().aborting--;
	tl_abort = was;
}

void teardown_wait(Teardown &t, const std::function<bool()> &done, const std::function<long()> &progress,
		   const std::function<std::string()> &hang)
{
	double idle = now_s();
	long seen = progress();
	while (!done()) {
		long p = progress();
		if (run_one() || p != seen) {
			seen = p;
			idle = now_s();
			continue;
		}
		if (now_s() - idle > cfg().abort_hang_s)
			fatal("%s", hang().c_str());
		t.lock.unlock(); /* let the other teardown threads raise flags, destroy graphs */
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
		t.lock.lock();
	}
}
} // namespace emu

namespace emu {
void comm_graph_ref(NcclComm *c, int delta)
{
	c->graph_refs += delta;
}

void comm_launch_ref(NcclComm *c, int delta)
{
	c->launch_refs += delta;
}

bool in_abort_thread()
{
	return tl_abort;
}

bool collective_may_run(NcclComm *c)
{
	if (c->aborted || S().aborting.load() == 0)
		return true;
	int main_thread = 1;
	MPI_Is_thread_main(&main_thread);
	return main_thread != 0;
}
} // namespace emu

static bool live(ncclComm_t c)
{
	return c && comms().count(c);
}

namespace emu {
int world_rank()
{
	int init = 0, fin = 0;
	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	if (init && !fin && S().world_rank < 0)
		MPI_Comm_rank(MPI_COMM_WORLD, &S().world_rank);
	return S().world_rank;
}
} // namespace emu

/* ---- the collective ---- */

struct Desc {
	int32_t kind, dtype, redop, root;
	int64_t count;
	uint64_t seq;
	int32_t send_alloc, recv_alloc;
	int64_t send_off, recv_off;
};

struct Flight {
	int phase = 0;
	Desc mine;
	std::vector<Desc> all;
	std::vector<char> in, out; /* staged, in the MPI type */
	MPI_Request req = MPI_REQUEST_NULL;
};

static bool staged_as_float(ncclDataType_t t)
{
	return t == ncclBfloat16 || t == ncclFloat16 || t == ncclFloat32;
}
static size_t nccl_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8: case ncclUint8: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	default: return 4;
	}
}
static size_t staged_size(ncclDataType_t t) { return staged_as_float(t) ? 4 : nccl_size(t); }
static MPI_Datatype mpi_type(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8: return MPI_SIGNED_CHAR;
	case ncclUint8: return MPI_UNSIGNED_CHAR;
	case ncclInt32: return MPI_INT;
	case ncclUint32: return MPI_UNSIGNED;
	case ncclInt64: return MPI_LONG_LONG;
	case ncclUint64: return MPI_UNSIGNED_LONG_LONG;
	case ncclFloat64: return MPI_DOUBLE;
	default: return MPI_FLOAT;
	}
}
static MPI_Op mpi_op(ncclRedOp_t op)
{
	switch (op) {
	case ncclProd: return MPI_PROD;
	case ncclMax: return MPI_MAX;
	case ncclMin: return MPI_MIN;
	default: return MPI_SUM;
	}
}

static void stage_in(const void *dev, size_t n, ncclDataType_t t, std::vector<char> &out)
{
	out.resize(n * staged_size(t) + 1);
	if (t == ncclBfloat16) {
		float *f = (float *)out.data();
		for (size_t i = 0; i < n; i++)
			f[i] = (float)((const __nv_bfloat16 *)dev)[i];
	} else if (t == ncclFloat16) {
		float *f = (float *)out.data();
		for (size_t i = 0; i < n; i++)
			f[i] = (float)((const __half *)dev)[i];
	} else {
		memcpy(out.data(), dev, n * nccl_size(t));
	}
}

static void stage_out(void *dev, size_t n, ncclDataType_t t, const std::vector<char> &in)
{
	if (t == ncclBfloat16) {
		const float *f = (const float *)in.data();
		for (size_t i = 0; i < n; i++)
			((__nv_bfloat16 *)dev)[i] = __nv_bfloat16(f[i]);
	} else if (t == ncclFloat16) {
		const float *f = (const float *)in.data();
		for (size_t i = 0; i < n; i++)
			((__half *)dev)[i] = __half(f[i]);
	} else {
		memcpy(dev, in.data(), n * nccl_size(t));
	}
}

static std::string desc_text(const Desc &d)
{
	char b[256];
	int n = snprintf(b, sizeof b, "call #%llu %s of %lld x %s", (unsigned long long)d.seq,
			 kind_names[d.kind], (long long)d.count, type_names[d.dtype]);
	if (d.kind == K_ALLREDUCE || d.kind == K_REDUCESCATTER)
		n += snprintf(b + n, sizeof b - n, " (%s)", op_names[d.redop]);
	if (d.kind == K_BROADCAST)
		n += snprintf(b + n, sizeof b - n, " (root %d)", d.root);
	snprintf(b + n, sizeof b - n, ", send buffer: allocation #%d + %lld, receive buffer: allocation #%d + %lld",
		 d.send_alloc, (long long)d.send_off, d.recv_alloc, (long long)d.recv_off);
	return b;
}

/* What a collective and a point-to-point call share: an operation of its
 * communicator, run one at a time in the order issued on it. */
struct CommWork : Work {
	ncclComm *c;
	size_t count; /* NCCL's count argument */

	NcclComm *comm() const override { return c; }
	void issued(Op &op) override
	{
		if (!c->aborted)
			c->fifo.push_back(&op);
	}
	/* its turn in the communicator's order, unless DPEMU_STALL stops this
	 * rank's device here */
	bool can_start(Op &op) override
	{
		if (c->aborted)
			return true;
		if (c->active || c->fifo.empty() || c->fifo.front() != &op)
			return false;
		const Config &cf = cfg();
		if (cf.stall_at > 0 && world_rank() >= 0 && world_rank() < 64 &&
		    (cf.stall_ranks >> world_rank() & 1) && S().collectives_started + 1 == cf.stall_at) {
			op.stalled = true;
			note("DPEMU_STALL: this rank's device stops at its collective %ld: %s", cf.stall_at,
			     what().c_str());
			return false;
		}
		return true;
	}
	/* a start's first part: op is the communicator's active operation */
	void begin(Op &op)
	{
		c->fifo.pop_front();
		c->active = &op;
		S().collectives_started++;
	}
};

struct CollWork : CommWork {
	Kind kind;
	const void *send;
	void *recv;
	ncclDataType_t dtype;
	ncclRedOp_t op;
	int root;

	void issued(Op &op) override
	{
		op.comm_seq = c->collectives++;
		CommWork::issued(op);
	}
	size_t in_elems() const { return kind == K_REDUCESCATTER ? count * c->nranks : count; }
	size_t out_elems() const { return kind == K_ALLGATHER ? count * c->nranks : count; }
	std::string what() const override
	{
		char b[200];
		snprintf(b, sizeof b, "%s of %zu x %s on communicator #%d (rank %d of %d)", kind_names[kind],
			 count, type_names[dtype], c->id, c->rank, c->nranks);
		return b;
	}
	bool start(Op &op) override
	{
		if (c->aborted)
			return true;
		begin(op);
		auto f = std::make_shared<Flight>();
		Desc &d = f->mine;
		memset(&d, 0, sizeof d);
		d.kind = kind;
		d.dtype = dtype;
		d.redop = kind == K_ALLREDUCE || kind == K_REDUCESCATTER ? op_ : 0;
		d.root = root;
		d.count = (int64_t)count;
		d.seq = op.comm_seq;
		if (cfg().same_buffers) {
			Where ws = classify(send), wr = classify(recv);
			d.send_alloc = ws.alloc ? ws.alloc->ordinal : -1;
			d.recv_alloc = wr.alloc ? wr.alloc->ordinal : -1;
			d.send_off = ws.alloc ? (int64_t)((uintptr_t)send - ws.alloc->base) : 0;
			d.recv_off = wr.alloc ? (int64_t)((uintptr_t)recv - wr.alloc->base) : 0;
		}
		stage_in(send, in_elems(), dtype, f->in);
		f->all.resize(c->nranks);
		MPI_Iallgather(&f->mine, sizeof(Desc), MPI_BYTE, f->all.data(), sizeof(Desc), MPI_BYTE,
			       c->mpi, &f->req);
		op.flight = f;
		return false;
	}
	int op_ = 0;
	bool poll(Op &op) override
	{
		if (c->aborted)
			return true;
		Flight &f = *(Flight *)op.flight.get();
		int done = 0;
		MPI_Test(&f.req, &done, MPI_STATUS_IGNORE);
		if (!done)
			return false;
		if (f.phase == 1)
			return true;
		/* phase 0 done: every rank's descriptor is here */
		for (int r = 0; r < c->nranks; r++)
			if (memcmp(&f.all[r], &f.all[0], sizeof(Desc))) {
				std::string s;
				for (int q = 0; q < c->nranks; q++)
					s += "\n  rank " + std::to_string(q) + ": " + desc_text(f.all[q]);
				fatal("NCCL collective mismatch on communicator #%d (%d ranks): the ranks issued "
				      "different collectives at the same point of the communicator's order (NCCL "
				      "would hang or reduce unrelated buffers):%s", c->id, c->nranks, s.c_str());
			}
		f.phase = 1;
		open_device_memory();
		memset(recv, 0xff, out_elems() * nccl_size(dtype)); /* in flight: undefined */
		size_t n = in_elems(), sz = staged_size(dtype);
		MPI_Datatype mt = mpi_type(dtype);
		switch (kind) {
		case K_ALLREDUCE:
			MPI_Iallreduce(MPI_IN_PLACE, f.in.data(), (int)n, mt, mpi_op((ncclRedOp_t)op_), c->mpi, &f.req);
			break;
		case K_REDUCESCATTER:
			f.out.resize(count * sz + 1);
			MPI_Ireduce_scatter_block(f.in.data(), f.out.data(), (int)count, mt,
						  mpi_op((ncclRedOp_t)op_), c->mpi, &f.req);
			break;
		case K_ALLGATHER:
			f.out.resize(count * c->nranks * sz + 1);
			MPI_Iallgather(f.in.data(), (int)count, mt, f.out.data(), (int)count, mt, c->mpi, &f.req);
			break;
		case K_BROADCAST:
			MPI_Ibcast(f.in.data(), (int)count, mt, root, c->mpi, &f.req);
			break;
		}
		return false;
	}
	void finish(Op &op) override
	{
		if (c->aborted)
			return;
		Flight &f = *(Flight *)op.flight.get();
		std::vector<char> &res = kind == K_ALLREDUCE || kind == K_BROADCAST ? f.in : f.out;
		if (op_ == ncclAvg) {
			size_t n = out_elems();
			if (staged_as_float(dtype))
				for (size_t i = 0; i < n; i++)
					((float *)res.data())[i] /= (float)c->nranks;
			else if (dtype == ncclFloat64)
				for (size_t i = 0; i < n; i++)
					((double *)res.data())[i] /= c->nranks;
		}
		stage_out(recv, out_elems(), dtype, res);
		c->active = nullptr;
	}
};

/* ---- point-to-point ---- */

enum { TAG_P2P_DESC = 0x7e01, TAG_P2P_DATA = 0x7e02 };

struct P2PDesc {
	int32_t send, dtype, world; /* send: 1 ncclSend, 0 ncclRecv; world: its world rank */
	int32_t rank, peer;         /* on the communicator */
	int64_t count;
	uint64_t seq;               /* the pair's transfers before it */
};

struct P2PFlight {
	int phase = 0;
	P2PDesc mine, theirs;
	std::vector<char> buf; /* staged, in the MPI type */
	MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

static std::string p2p_text(const P2PDesc &d)
{
	char b[200];
	snprintf(b, sizeof b, "rank %d (world rank %d): %s #%llu of %lld x %s %s rank %d", d.rank, d.world,
		 d.send ? "ncclSend" : "ncclRecv", (unsigned long long)d.seq, (long long)d.count,
		 (unsigned)d.dtype < ncclNumTypes ? type_names[d.dtype] : "?", d.send ? "to" : "from", d.peer);
	return b;
}

struct P2PWork : CommWork {
	bool send;
	void *buf;
	ncclDataType_t dtype;
	int peer;

	std::string what() const override
	{
		char b[200];
		snprintf(b, sizeof b, "%s of %zu x %s %s rank %d on communicator #%d (rank %d of %d)",
			 send ? "ncclSend" : "ncclRecv", count, type_names[dtype], send ? "to" : "from", peer,
			 c->id, c->rank, c->nranks);
		return b;
	}
	bool start(Op &op) override
	{
		if (c->aborted)
			return true;
		begin(op);
		auto f = std::make_shared<P2PFlight>();
		P2PDesc &d = f->mine;
		memset(&d, 0, sizeof d);
		d.send = send;
		d.dtype = dtype;
		d.world = world_rank();
		d.rank = c->rank;
		d.peer = peer;
		d.count = (int64_t)count;
		d.seq = c->p2p_seq[peer]++;
		if (send) /* what the buffer holds now, in stream order, is what goes */
			stage_in(buf, count, dtype, f->buf);
		else
			f->buf.resize(count * staged_size(dtype) + 1);
		MPI_Isend(&f->mine, sizeof(P2PDesc), MPI_BYTE, peer, TAG_P2P_DESC, c->mpi, &f->req[0]);
		MPI_Irecv(&f->theirs, sizeof(P2PDesc), MPI_BYTE, peer, TAG_P2P_DESC, c->mpi, &f->req[1]);
		op.flight = f;
		return false;
	}
	bool poll(Op &op) override
	{
		if (c->aborted)
			return true;
		P2PFlight &f = *(P2PFlight *)op.flight.get();
		int done = 0;
		MPI_Testall(2, f.req, &done, MPI_STATUSES_IGNORE);
		if (!done)
			return false;
		if (f.phase == 1)
			return true;
		/* phase 0 done: the peer's call at this point of the pair's order */
		const P2PDesc &m = f.mine, &t = f.theirs;
		if (t.send == m.send || t.dtype != m.dtype || t.count != m.count || t.seq != m.seq ||
		    t.peer != c->rank)
			fatal("NCCL point-to-point mismatch on communicator #%d: the two ranks' calls at the "
			      "same point of their transfers do not pair (a send must meet a recv of the "
			      "same type and count; NCCL would hang or move the wrong bytes): %s; %s",
			      c->id, p2p_text(m.rank < t.rank ? m : t).c_str(),
			      p2p_text(m.rank < t.rank ? t : m).c_str());
		f.phase = 1;
		MPI_Datatype mt = mpi_type(dtype);
		if (send) {
			MPI_Isend(f.buf.data(), (int)count, mt, peer, TAG_P2P_DATA, c->mpi, &f.req[0]);
		} else {
			open_device_memory();
			memset(buf, 0xff, count * nccl_size(dtype)); /* in flight: undefined */
			MPI_Irecv(f.buf.data(), (int)count, mt, peer, TAG_P2P_DATA, c->mpi, &f.req[0]);
		}
		f.req[1] = MPI_REQUEST_NULL;
		return false;
	}
	void finish(Op &op) override
	{
		if (c->aborted)
			return;
		P2PFlight &f = *(P2PFlight *)op.flight.get();
		if (!send)
			stage_out(buf, count, dtype, f.buf);
		c->active = nullptr;
	}
};

static ncclResult_t check_comm(ncclComm_t c, const char *api)
{
	if (!live(c))
		return nfail(ncclInvalidArgument, "%s: communicator %p is not a live communicator", api, (void *)c);
	if (c->aborted)
		return nfail(ncclInvalidUsage, "%s: communicator #%d was aborted", api, c->id);
	if (c->deferred)
		fatal("%s on communicator #%d while its %s returned ncclInProgress and has not "
		      "settled: NCCL requires ncclCommGetAsyncError to report ncclSuccess before any "
		      "other call on a non-blocking communicator", api, c->id, c->deferred_what.c_str());
	if (c->init_polls > 0)
		return nfail(ncclInvalidUsage, "%s: communicator #%d is still initialising or splitting "
			     "(poll ncclCommGetAsyncError until it is no longer ncclInProgress)", api, c->id);
	return ncclSuccess;
}

/* A checked call onto its stream: inside a group at ncclGroupEnd; on a
 * non-blocking communicator perhaps later (ncclInProgress, the top
 * comment). */
static ncclResult_t issue(std::shared_ptr<CommWork> w, cudaStream_t st, const char *api)
{
	ncclComm *c = w->c;
	Stream *s = stream_of(st, api);
	if (!s)
		return ncclInvalidArgument;
	auto enq = [s, w, api]() -> ncclResult_t {
		if (!w->count)
			return ncclSuccess;
		cudaError_t e = submit(s, w, api);
		return e ? nfail(ncclUnhandledCudaError, "%s: %s", api, cudaGetErrorString(e)) : ncclSuccess;
	};
	if (group_depth > 0) {
		group_ops.push_back(GroupOp{enq, c, s, w->what()});
		return ncclSuccess;
	}
	stream_free_check(s, api);
	Pick ip = cfg().nccl_inprogress;
	if (!c->blocking && w->count && (ip == PICK_HIGH || (ip == PICK_RANDOM && rnd(2)))) {
		/* NCCL's helper thread will launch it: not on the stream yet */
		c->deferred = enq;
		c->deferred_stream = s;
		c->deferred_what = w->what();
		c->deferred_polls = 1 + (int)rnd(3);
		s->nccl_pending = c;
		return ncclInProgress;
	}
	return enq();
}

static ncclResult_t collective(Kind kind, const void *send, void *recv, size_t count, ncclDataType_t t,
			       ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t st)
{
	const char *api = kind_names[kind];
	EMU_API_ENTRY(api);
	if (ncclResult_t r = check_comm(c, api))
		return r;
	if ((unsigned)t >= ncclNumTypes)
		return nfail(ncclInvalidArgument, "%s: data type %d is not emulated", api, (int)t);
	if ((unsigned)op >= ncclNumOps)
		return nfail(ncclInvalidArgument, "%s: reduction %d", api, (int)op);
	if (kind == K_BROADCAST && (root < 0 || root >= c->nranks))
		return nfail(ncclInvalidArgument, "%s: root %d of %d ranks", api, root, c->nranks);
	auto w = std::make_shared<CollWork>();
	w->c = c;
	w->kind = kind;
	w->send = send;
	w->recv = recv;
	w->count = count;
	w->dtype = t;
	w->op_ = (int)op;
	w->root = root;
	size_t es = nccl_size(t);
	std::string why;
	if (count && (!device_accessible(send, w->in_elems() * es, &why) ||
		      !device_accessible(recv, w->out_elems() * es, &why)))
		return nfail(ncclInvalidArgument, "%s of %zu x %s on communicator #%d: a buffer is not "
			     "device memory of that size: %s", api, count, type_names[t], c->id, why.c_str());
	if (kind == K_ALLGATHER && send != recv &&
	    (const char *)send > (const char *)recv && (const char *)send < (const char *)recv + w->out_elems() * es &&
	    send != (const char *)recv + (size_t)c->rank * count * es)
		return nfail(ncclInvalidArgument, "%s: an in-place all-gather's send buffer must be this "
			     "rank's slot of the receive buffer", api);
	return issue(w, st, api);
}

static ncclResult_t p2p(bool send, void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
			cudaStream_t st)
{
	const char *api = send ? "ncclSend" : "ncclRecv";
	EMU_API_ENTRY(api);
	if (ncclResult_t r = check_comm(c, api))
		return r;
	if ((unsigned)t >= ncclNumTypes)
		return nfail(ncclInvalidArgument, "%s: data type %d is not emulated", api, (int)t);
	if (peer < 0 || peer >= c->nranks || peer == c->rank)
		return nfail(ncclInvalidArgument, "%s: peer %d on communicator #%d (rank %d of %d)", api, peer,
			     c->id, c->rank, c->nranks);
	auto w = std::make_shared<P2PWork>();
	w->c = c;
	w->send = send;
	w->buf = buf;
	w->count = count;
	w->dtype = t;
	w->peer = peer;
	std::string why;
	if (count && !device_accessible(buf, count * nccl_size(t), &why))
		return nfail(ncclInvalidArgument, "%s: the buffer is not device memory of that size: %s",
			     w->what().c_str(), why.c_str());
	return issue(w, st, api);
}

/* ---- communicators ---- */

static ncclResult_t new_comm(MPI_Comm m, int blocking, ncclComm_t *out)
{
	ncclComm *c = new ncclComm;
	c->id = next_comm_id++;
	c->mpi = m;
	MPI_Comm_rank(m, &c->rank);
	MPI_Comm_size(m, &c->nranks);
	c->init_polls = blocking ? 0 : 1 + (int)rnd(3);
	c->blocking = blocking != 0;
	comms().insert(c);
	*out = c;
	return blocking ? ncclSuccess : ncclInProgress;
}

static ncclResult_t need_mpi(const char *api)
{
	int init = 0;
	MPI_Initialized(&init);
	if (!init)
		return nfail(ncclSystemError, "%s: the emulator's NCCL runs over MPI; MPI is not initialised",
			     api);
	world_rank();
	return ncclSuccess;
}

static int blocking_of(const ncclConfig_t *cf, int inherit)
{
	return cf && cf->blocking != NCCL_CONFIG_UNDEF_INT ? cf->blocking != 0 : inherit;
}

static ncclResult_t check_config(const ncclConfig_t *cf, const char *api)
{
	if (cf && (cf->magic != 0xcafebeef || cf->size != sizeof(ncclConfig_t)))
		return nfail(ncclInvalidArgument, "%s: the config was not set from NCCL_CONFIG_INITIALIZER", api);
	return ncclSuccess;
}

extern "C" {

ncclResult_t ncclGetVersion(int *v)
{
	if (!v)
		return ncclInvalidArgument;
	*v = NCCL_VERSION_CODE;
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	EMU_API_ENTRY("ncclGetUniqueId");
	if (!id)
		return ncclInvalidArgument;
	memset(id, 0, sizeof *id);
	strcpy(id->internal, "dpemu-nccl");
	uint64_t r = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(now_s() * 1e9);
	memcpy(id->internal + 16, &r, 8);
	return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
				    ncclConfig_t *config)
{
	EMU_API_ENTRY("ncclCommInitRank");
	if (!comm)
		return ncclInvalidArgument;
	*comm = nullptr;
	if (ncclResult_t r = need_mpi("ncclCommInitRank"))
		return r;
	if (ncclResult_t r = check_config(config, "ncclCommInitRankConfig"))
		return r;
	if (strcmp(id.internal, "dpemu-nccl"))
		return nfail(ncclInvalidArgument, "ncclCommInitRank: the unique id does not come from "
			     "ncclGetUniqueId");
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return nfail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
	if (init_error())
		return nfail(ncclUnhandledCudaError, "ncclCommInitRank: %s", cudaGetErrorString(init_error()));
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < sizeof id.internal; i++)
		h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
	MPI_Comm m;
	MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x7fffffff), rank, &m);
	int size = 0, mr = 0;
	MPI_Comm_size(m, &size);
	MPI_Comm_rank(m, &mr);
	if (size != nranks || mr != rank)
		return nfail(ncclInvalidUsage, "ncclCommInitRank: rank %d of %d, but %d process(es) "
			     "initialised a communicator with this id (this one as rank %d)", rank, nranks,
			     size, mr);
	return new_comm(m, blocking_of(config, 1), comm);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	EMU_API_ENTRY("ncclCommSplit");
	if (!newcomm)
		return ncclInvalidArgument;
	*newcomm = nullptr;
	if (ncclResult_t r = check_comm(comm, "ncclCommSplit"))
		return r;
	if (ncclResult_t r = check_config(config, "ncclCommSplit"))
		return r;
	MPI_Comm m;
	MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
	bool blocking = blocking_of(config, comm->blocking ? 1 : 0);
	ncclComm_t child = nullptr;
	if (m != MPI_COMM_NULL)
		new_comm(m, blocking, &child);
	if (comm->blocking) {
		*newcomm = child;
		return ncclSuccess;
	}
	/* a split on a non-blocking parent: the parent reports ncclInProgress for
	 * a few polls, and the poll that reports ncclSuccess fills newcomm (the
	 * child then settles on its own polls if it is non-blocking) */
	comm->init_polls = 1 + (int)rnd(3);
	comm->split_slot = newcomm;
	comm->split_child = child;
	return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
	if (!live(comm) || !err)
		return ncclInvalidArgument;
	if (comm->init_polls > 0) {
		comm->init_polls--;
		*err = ncclInProgress;
		return ncclSuccess;
	}
	if (comm->split_slot) {
		*comm->split_slot = comm->split_child;
		comm->split_slot = nullptr;
		comm->split_child = nullptr;
	}
	if (comm->deferred && --comm->deferred_polls > 0) {
		*err = ncclInProgress;
		return ncclSuccess;
	}
	if (comm->deferred) { /* the helper thread launches it now */
		std::function<ncclResult_t()> enq = std::move(comm->deferred);
		comm->deferred = nullptr;
		comm->deferred_stream->nccl_pending = nullptr;
		comm->deferred_stream = nullptr;
		if (ncclResult_t r = enq())
			comm->async = r;
	}
	*err = comm->async;
	return ncclSuccess;
}

static void hang_check(ncclComm_t c, const char *api)
{
	if (c->graph_refs > 0)
		fatal("%s of communicator #%d while %d CUDA graph(s)/graph exec(s) that captured its "
		      "collectives still exist: NCCL 2.28 waits in %s until every such graph is destroyed, "
		      "so this call hangs forever. Destroy the graph exec and the graph first.", api, c->id,
		      c->graph_refs, api);
}

/* Everything issued on the communicator has run, and every launch of a
 * graph that captured it has finished (NCCL waits for both). */
static void flush(ncclComm_t c, const char *api)
{
	run_until(
		[c] {
			if (c->launch_refs > 0)
				return false;
			for (auto &o : S().pending)
				if (o->work->comm() == c)
					return false;
			return true;
		},
		nullptr, api);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess;
	/* aborts of several communicators, and graph destroys, may run at once
	 * on several threads */
	Teardown td;
	EMU_API_ENTRY("ncclCommAbort");
	if (!live(comm))
		return nfail(ncclInvalidArgument, "ncclCommAbort: %p is not a live communicator", (void *)comm);
	/* the abort flag: queued and running collectives end without results
	 * when the device next runs them, not here */
	comm->aborted = true;
	comm->fifo.clear();
	comm->active = nullptr;
	if (comm->deferred) { /* the helper thread's launch is abandoned */
		comm->deferred_stream->nccl_pending = nullptr;
		comm->deferred = nullptr;
	}
	for (auto &o : S().pending)
		if (o->work->comm() == comm)
			o->stalled = false; /* DPEMU_STALL: the stalled kernel sees the flag too */
	/* NCCL waits until every graph that captured it is destroyed and every
	 * launch of one has completed */
	teardown_wait(
		td, [comm] { return comm->launch_refs == 0 && comm->graph_refs == 0; },
		[comm] { return (long)comm->graph_refs; },
		[comm] {
			char buf[1024];
			if (comm->graph_refs > 0)
				snprintf(buf, sizeof buf,
					 "ncclCommAbort of communicator #%d hangs: %d CUDA graph(s)/graph exec(s) "
					 "that captured its collectives still exist, and no thread destroyed one "
					 "for %g s: NCCL 2.28 waits in ncclCommAbort until every such graph is "
					 "destroyed. Destroy them (before the abort, or beside it on another "
					 "thread once the flags are raised).",
					 comm->id, comm->graph_refs, cfg().abort_hang_s);
			else
				snprintf(buf, sizeof buf,
					 "ncclCommAbort of communicator #%d hangs: it waits for %d launch(es) of "
					 "CUDA graphs that captured it, and no device work has completed for %g s; "
					 "pending: %s. NCCL 2.28's abort waits until every graph that captured the "
					 "communicator is freed, and a launched graph is freed only when it "
					 "completes: a launch stuck on a collective of another communicator that "
					 "is not aborted never completes. Abort every communicator such a graph "
					 "captured at once.",
					 comm->id, comm->launch_refs, cfg().abort_hang_s, pending_ops_text().c_str());
			return std::string(buf);
		});
	comms().erase(comm); /* the object stays: queued work points at it */
	return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	EMU_API_ENTRY("ncclCommFinalize");
	if (ncclResult_t r = check_comm(comm, "ncclCommFinalize"))
		return r;
	flush(comm, "ncclCommFinalize");
	comm->finalized = true;
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	EMU_API_ENTRY("ncclCommDestroy");
	if (!comm)
		return ncclSuccess;
	if (!live(comm))
		return nfail(ncclInvalidArgument, "ncclCommDestroy: %p is not a live communicator", (void *)comm);
	hang_check(comm, "ncclCommDestroy");
	flush(comm, "ncclCommDestroy");
	comms().erase(comm);
	comm->aborted = true;
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!live(comm) || !count)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!live(comm) || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *dev)
{
	if (!live(comm) || !dev)
		return ncclInvalidArgument;
	*dev = S().device;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

const char *ncclGetLastError(ncclComm_t)
{
	return last_error.c_str();
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
			   ncclComm_t c, cudaStream_t st)
{
	return collective(K_ALLREDUCE, s, r, n, t, op, 0, c, st);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
			       ncclComm_t c, cudaStream_t st)
{
	return collective(K_REDUCESCATTER, s, r, n, t, op, 0, c, st);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c,
			   cudaStream_t st)
{
	return collective(K_ALLGATHER, s, r, n, t, ncclSum, 0, c, st);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
			   cudaStream_t st)
{
	return collective(K_BROADCAST, s, r, n, t, ncclSum, root, c, st);
}

ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	if (group_depth <= 0)
		return nfail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0)
		return ncclSuccess;
	std::vector<GroupOp> ops;
	ops.swap(group_ops);
	if (ops.empty())
		return ncclSuccess;
	ncclComm *c = ops[0].comm;
	Stream *s = ops[0].stream;
	bool one = true;
	for (auto &g : ops)
		one = one && g.comm == c && g.stream == s;
	for (auto &g : ops)
		if (ncclResult_t r = check_comm(g.comm, "ncclGroupEnd"))
			return r;
	auto enq = [ops]() -> ncclResult_t {
		for (auto &g : ops)
			if (ncclResult_t r = g.enq())
				return r;
		return ncclSuccess;
	};
	for (auto &g : ops)
		stream_free_check(g.stream, "ncclGroupEnd");
	Pick ip = cfg().nccl_inprogress;
	if (one && !c->blocking && (ip == PICK_HIGH || (ip == PICK_RANDOM && rnd(2)))) {
		/* NCCL's helper thread launches the group: not on the stream yet */
		c->deferred = enq;
		c->deferred_stream = s;
		c->deferred_what = "group of " + std::to_string(ops.size()) + " call(s) from " + ops[0].what;
		c->deferred_polls = 1 + (int)rnd(3);
		s->nccl_pending = c;
		return ncclInProgress;
	}
	return enq();
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
{
	return p2p(true, (void *)buf, count, t, peer, c, st);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
{
	return p2p(false, buf, count, t, peer, c, st);
}

} // extern "C"
