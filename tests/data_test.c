/*
 * data_test.c - unit tests of the runtime's data side: counter-based init,
 * the sampler, data sources (IDX, .npy, synthetic, llm.c token shards) and
 * safetensors.
 *
 * `make tests` builds it (build/tests/data_test; tests/unit.sh runs it), or
 * alone, from the repository root:
 *   gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Iruntime -Iformat -Iutil \
 *       tests/data_test.c runtime/init.c runtime/data*.c runtime/safetensors.c \
 *       runtime/err.c format/stepfile*.c util/datafile.c util/outfile.c \
 *       -lcjson -lz -lm -o build/data_test
 *   build/data_test
 * (add -fsanitize=address,undefined for the SAN build). Files are written
 * under a fresh mkdtemp directory in $TMPDIR (default /tmp) and removed.
 * The Fashion-MNIST test runs when /usr/share/datasets/fashion-mnist is there.
 * DATA_TEST_VERBOSE=1 prints every expected error message.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../util/crc32c.h"
#include "rt.h"

#define FMNIST "/usr/share/datasets/fashion-mnist/"

static int passed, failed;

#define CHECK(cond, ...)                                                \
	do {                                                            \
		if (cond) {                                             \
			passed++;                                       \
		} else {                                                \
			failed++;                                       \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                   \
			fputc('\n', stderr);                            \
		}                                                       \
	} while (0)

static char tmpdir[256];

static const char *tpath(const char *name)
{
	static char buf[8][512];
	static int next;
	char *p = buf[next++ % 8];
	snprintf(p, 512, "%s/%s", tmpdir, name);
	return p;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len) {
		perror(path);
		abort();
	}
	fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = malloc(*len ? *len : 1);
	if (fread(b, 1, *len, f) != *len)
		abort();
	fclose(f);
	return b;
}

/* ---- a hand-made step with data sources ---- */

typedef struct {
	DpStep s;
	char strings[4096];
	DpTensor tensors[16];
	DpSource sources[16];
} TestStep;

static uint32_t add_string(TestStep *ts, const char *str)
{
	uint32_t off = ts->s.nstrings;
	size_t len = strlen(str) + 1;
	if (off + len > sizeof ts->strings)
		abort();
	memcpy(ts->strings + off, str, len);
	ts->s.nstrings += (uint32_t)len;
	return off;
}

static void step_init(TestStep *ts, uint32_t micro_batch, uint32_t grad_accum, uint64_t seed)
{
	memset(ts, 0, sizeof *ts);
	ts->s.strings = ts->strings;
	ts->s.tensors = ts->tensors;
	ts->s.sources = ts->sources;
	ts->s.cfg.micro_batch = micro_batch;
	ts->s.cfg.grad_accum = grad_accum;
	ts->s.cfg.eval_batch = micro_batch;
	ts->s.cfg.seed = seed;
	add_string(ts, "");
}

/* A source feeding its own DP_T_DATA tensor; returns the source index. */
static int add_source(TestStep *ts, DpSourceKind kind, DpSplit split, int role, const char *path,
		      DpDtype dtype, int64_t sample_elems, int64_t synth_n, int classes,
		      uint32_t line)
{
	DpTensor *t = &ts->tensors[ts->s.ntensors];
	DpSource *r = &ts->sources[ts->s.nsources];
	t->name = add_string(ts, role ? "y" : "x");
	t->dtype = dtype;
	t->kind = DP_T_DATA;
	r->path = add_string(ts, path ? path : "");
	r->kind = kind;
	r->split = split;
	r->role = role;
	r->tensor = (int32_t)ts->s.ntensors++;
	r->sample_elems = sample_elems;
	r->synth_n = synth_n;
	r->synth_classes = classes;
	r->src_line = line;
	return (int)ts->s.nsources++;
}

static RtErr new_err(void)
{
	RtErr e;
	memset(&e, 0, sizeof e);
	e.rank = -1;
	return e;
}

/* data_open of one split; 0 or -1 with the message in e. */
static int open_split(TestStep *ts, DpSplit split, DataSet **d, RtErr *e)
{
	return data_open(&ts->s, split, "models/test.dp", 0, d, e);
}

/* Expect data_open to fail with a message containing `want` (NULL: any). */
static void expect_open_error(TestStep *ts, DpSplit split, const char *want, const char *what)
{
	RtErr e = new_err();
	DataSet *d = NULL;
	int rc = open_split(ts, split, &d, &e);
	CHECK(rc == -1 && d == NULL, "%s: data_open should fail", what);
	if (getenv("DATA_TEST_VERBOSE"))
		printf("  %s: %s\n", what, e.msg);
	if (rc == -1 && want)
		CHECK(strstr(e.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, want);
	if (rc == 0)
		data_free(d);
}

/* ---- writers of test files ---- */

static void npy_bytes(const char *descr, const char *fortran, const int64_t *shape, int ndim,
		      const void *data, size_t data_len, unsigned char **out, size_t *len)
{
	char dict[512], tup[256] = "";
	size_t tl = 0;
	for (int k = 0; k < ndim; k++)
		tl += snprintf(tup + tl, sizeof tup - tl, "%lld%s", (long long)shape[k],
			       ndim == 1 || k + 1 < ndim ? ", " : "");
	if (ndim == 1)
		tup[tl - 1] = 0; /* "(5,)" */
	int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }",
			  descr, fortran, tup);
	size_t hl = (size_t)dl + 1;
	while ((10 + hl) % 64)
		hl++;
	*len = 10 + hl + data_len;
	*out = malloc(*len);
	memcpy(*out, "\x93NUMPY\x01\x00", 8);
	(*out)[8] = (unsigned char)(hl & 0xff);
	(*out)[9] = (unsigned char)(hl >> 8);
	memcpy(*out + 10, dict, (size_t)dl);
	memset(*out + 10 + dl, ' ', hl - (size_t)dl - 1);
	(*out)[10 + hl - 1] = '\n';
	memcpy(*out + 10 + hl, data, data_len);
}

static void write_npy(const char *path, const char *descr, const int64_t *shape, int ndim,
		      const void *data, size_t data_len)
{
	unsigned char *b;
	size_t len;
	npy_bytes(descr, "False", shape, ndim, data, data_len, &b, &len);
	write_bytes(path, b, len);
	free(b);
}

static void idx_bytes(int ndim, const uint32_t *dims, const unsigned char *data, size_t data_len,
		      unsigned char **out, size_t *len)
{
	*len = 4 + 4 * (size_t)ndim + data_len;
	*out = malloc(*len);
	unsigned char *p = *out;
	p[0] = 0, p[1] = 0, p[2] = 8, p[3] = (unsigned char)ndim;
	for (int k = 0; k < ndim; k++) {
		p[4 + 4 * k] = (unsigned char)(dims[k] >> 24);
		p[5 + 4 * k] = (unsigned char)(dims[k] >> 16);
		p[6 + 4 * k] = (unsigned char)(dims[k] >> 8);
		p[7 + 4 * k] = (unsigned char)dims[k];
	}
	memcpy(p + 4 + 4 * ndim, data, data_len);
}

/* ---- init ---- */

static void test_init(void)
{
	enum { N = 200000 };
	float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);

	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, 1234, "fc1.w", 0, N, a);
	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, 1234, "fc1.w", 0, N, b);
	CHECK(memcmp(a, b, N * sizeof *a) == 0, "init is not reproducible");

	/* Shards: any [base, base+count) equals the slice of the full tensor. */
	int64_t cuts[][2] = {{0, 1}, {1, 7}, {300, 200}, {N - 5, 5}, {12345, 54321}};
	for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
		init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, 1234, "fc1.w", cuts[c][0], cuts[c][1], b);
		CHECK(memcmp(a + cuts[c][0], b, (size_t)cuts[c][1] * sizeof *a) == 0,
		      "shard [%lld, +%lld) differs from the full tensor", (long long)cuts[c][0],
		      (long long)cuts[c][1]);
	}
	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, 1234, "fc2.w", 0, 100, b);
	CHECK(memcmp(a, b, 100 * sizeof *a) != 0, "different names give the same numbers");
	init_fill(DP_INIT_NORMAL, 0.0f, 1.0f, 1235, "fc1.w", 0, 100, b);
	CHECK(memcmp(a, b, 100 * sizeof *a) != 0, "different seeds give the same numbers");

	/* Moments: standard error of the mean is 1/sqrt(N) ~ 0.0022. */
	double s1 = 0, s2 = 0, s3 = 0;
	int finite = 1;
	for (int i = 0; i < N; i++) {
		double v = a[i];
		finite &= isfinite(v);
		s1 += v, s2 += v * v, s3 += v * v * v;
	}
	CHECK(finite, "a normal value is not finite");
	double mean = s1 / N, var = s2 / N - mean * mean;
	CHECK(fabs(mean) < 0.015, "normal mean %g", mean);
	CHECK(fabs(var - 1.0) < 0.02, "normal variance %g", var);
	CHECK(fabs(s3 / N) < 0.05, "normal skew %g", s3 / N);

	init_fill(DP_INIT_NORMAL, 2.0f, 0.5f, 7, "head.w", 0, N, a);
	s1 = s2 = 0;
	for (int i = 0; i < N; i++)
		s1 += a[i], s2 += (double)a[i] * a[i];
	mean = s1 / N, var = s2 / N - mean * mean;
	CHECK(fabs(mean - 2.0) < 0.01 && fabs(sqrt(var) - 0.5) < 0.01, "normal(2, 0.5): mean %g std %g",
	      mean, sqrt(var));

	init_fill(DP_INIT_UNIFORM, -1.0f, 3.0f, 7, "u", 0, N, a);
	float lo = 1e9f, hi = -1e9f;
	s1 = s2 = 0;
	for (int i = 0; i < N; i++) {
		lo = fminf(lo, a[i]), hi = fmaxf(hi, a[i]);
		s1 += a[i], s2 += (double)a[i] * a[i];
	}
	mean = s1 / N, var = s2 / N - mean * mean;
	CHECK(lo >= -1.0f && hi <= 3.0f && lo < -0.99f && hi > 2.99f, "uniform range [%g, %g]", lo, hi);
	CHECK(fabs(mean - 1.0) < 0.02 && fabs(var - 16.0 / 12) < 0.03, "uniform mean %g var %g", mean,
	      var);

	init_fill(DP_INIT_ZEROS, 5.0f, 5.0f, 7, "z", 3, 100, a);
	init_fill(DP_INIT_ONES, 5.0f, 5.0f, 7, "o", 3, 100, b);
	int ok = 1;
	for (int i = 0; i < 100; i++)
		ok &= a[i] == 0.0f && b[i] == 1.0f;
	CHECK(ok, "zeros/ones");

	/* Pinned values: docs/DATA.md and tests/torch_ref.py use the same formulas. */
	CHECK(init_mix64(0) == 0 && init_mix64(1) == 0x5692161d100b05e5ull,
	      "mix64(1) = %016llx", (unsigned long long)init_mix64(1));
	CHECK(init_hash_name("") == 0xcbf29ce484222325ull && init_hash_name("a") == 0xaf63dc4c8601ec8cull,
	      "FNV-1a of \"a\" = %016llx", (unsigned long long)init_hash_name("a"));
	free(a);
	free(b);
}

/* ---- sampler ---- */

static void test_sampler(void)
{
	/* n divisible by the batch: every index exactly once per epoch. */
	int64_t n = 100, gb = 10;
	int seen[100], first[100];
	for (uint64_t epoch = 0; epoch < 3; epoch++) {
		memset(seen, 0, sizeof seen);
		for (uint64_t st = epoch * 10; st < epoch * 10 + 10; st++)
			for (int64_t j = 0; j < gb; j++) {
				int64_t idx = data_sample_index(42, n, gb, st, j);
				if (idx >= 0 && idx < n)
					seen[idx]++;
				if (st == epoch * 10 && epoch == 0)
					first[j] = (int)idx;
			}
		int once = 1;
		for (int i = 0; i < n; i++)
			once &= seen[i] == 1;
		CHECK(once, "epoch %llu does not visit every index once", (unsigned long long)epoch);
	}
	int same = 1, same_seed = 1;
	for (int64_t j = 0; j < gb; j++) {
		same &= data_sample_index(42, n, gb, 10, j) == first[j];
		same_seed &= data_sample_index(43, n, gb, 0, j) == first[j];
	}
	CHECK(!same, "epoch 1 repeats epoch 0's order");
	CHECK(!same_seed, "seed 43 repeats seed 42's order");
	int identity = 1;
	for (int64_t j = 0; j < gb; j++)
		identity &= first[j] == j;
	CHECK(!identity, "epoch 0 is not shuffled");

	/* drop_last: n = 103, batch 10: 10 steps per epoch, distinct indices. */
	memset(seen, 0, sizeof seen);
	int distinct = 1;
	int seen103[103] = {0};
	for (uint64_t st = 0; st < 10; st++)
		for (int64_t j = 0; j < gb; j++) {
			int64_t idx = data_sample_index(42, 103, gb, st, j);
			distinct &= idx >= 0 && idx < 103 && !seen103[idx];
			if (idx >= 0 && idx < 103)
				seen103[idx] = 1;
		}
	CHECK(distinct, "drop_last epoch repeats an index");

	/* Pinned: the Python port in tests/torch_ref.py must print the same. */
	int64_t pin[5];
	for (int j = 0; j < 5; j++)
		pin[j] = data_sample_index(1234, 60000, 128, 0, j);
	printf("sampler pin (seed 1234, n 60000, batch 128, step 0): %lld %lld %lld %lld %lld\n",
	       (long long)pin[0], (long long)pin[1], (long long)pin[2], (long long)pin[3],
	       (long long)pin[4]);
}

/* Label i = i (an i32 .npy) and features row i = i*10 + k: a fill shows which
 * sample it took. The union of every rank's micro-batches must be the global
 * batch of data_sample_index, position by position. */
static void test_fill_train(void)
{
	enum { N = 50, D = 3, GB = 16 };
	int32_t lab[N];
	float feat[N * D];
	for (int i = 0; i < N; i++) {
		lab[i] = i;
		for (int k = 0; k < D; k++)
			feat[i * D + k] = (float)(i * 10 + k);
	}
	int64_t shl[1] = {N}, shf[2] = {N, D};
	write_npy(tpath("lab.npy"), "<i4", shl, 1, lab, sizeof lab);
	write_npy(tpath("feat.npy"), "<f4", shf, 2, feat, sizeof feat);

	int sizes[] = {1, 2, 4};
	for (int si = 0; si < 3; si++) {
		int dp = sizes[si];
		int ga = 2, mb = GB / (dp * ga);
		TestStep ts;
		step_init(&ts, (uint32_t)mb, (uint32_t)ga, 99);
		int sx = add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, 0, tpath("feat.npy"), DP_F32, D, 0, 0, 3);
		int sy = add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, 1, tpath("lab.npy"), DP_I32, 1, 0, 0, 4);
		DataSet *d;
		RtErr e = new_err();
		if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0) {
			CHECK(0, "open npy train split: %s", e.msg);
			return;
		}
		CHECK(data_count(d) == N, "count %lld", (long long)data_count(d));
		CHECK(data_check_batch(d, GB, &e) == 0, "check_batch: %s", e.msg);
		CHECK(data_check_batch(d, N + 1, &e) == -1 && strstr(e.msg, "fewer than the global batch"),
		      "check_batch with too big a batch: %s", e.msg);
		int ok = 1, rows_ok = 1;
		/* steps 0..7 cross epochs (3 steps per epoch); step 2 then 0 again
		 * exercises the cache going back to an earlier epoch. */
		uint64_t steps[] = {0, 1, 2, 3, 4, 5, 6, 7, 2, 0};
		for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
			int got[GB];
			for (int j = 0; j < GB; j++)
				got[j] = -1;
			for (int r = 0; r < dp; r++)
				for (int m = 0; m < ga; m++) {
					int32_t y[GB];
					float x[GB * D];
					data_fill_train(d, &ts.s, sy, steps[k], m, r, dp, y);
					data_fill_train(d, &ts.s, sx, steps[k], m, r, dp, x);
					for (int t = 0; t < mb; t++) {
						got[r + dp * (m * mb + t)] = y[t];
						for (int q = 0; q < D; q++)
							rows_ok &= x[t * D + q] == (float)(y[t] * 10 + q);
					}
				}
			for (int j = 0; j < GB; j++)
				ok &= got[j] == data_sample_index(99, N, GB, steps[k], j);
		}
		CHECK(ok, "dp_size %d: rank slices do not make the global batch", dp);
		CHECK(rows_ok, "dp_size %d: features and labels come from different samples", dp);
		data_free(d);
	}
}

static void test_eval(void)
{
	enum { N = 50, EB = 4, DP = 3 };
	TestStep ts;
	step_init(&ts, EB, 1, 1);
	int sx = add_source(&ts, DP_SRC_NPY, DP_SPLIT_EVAL, 0, tpath("feat.npy"), DP_F32, 3, 0, 0, 5);
	int sy = add_source(&ts, DP_SRC_NPY, DP_SPLIT_EVAL, 1, tpath("lab.npy"), DP_I32, 1, 0, 0, 6);
	DataSet *d;
	RtErr e = new_err();
	if (open_split(&ts, DP_SPLIT_EVAL, &d, &e) != 0) {
		CHECK(0, "open eval split: %s", e.msg);
		return;
	}
	int64_t nb = data_eval_batches(d, &ts.s, DP);
	CHECK(nb == 5, "eval batches %lld, want ceil(50 / 12) = 5", (long long)nb);
	int seen[N] = {0}, pads = 0, ok = 1;
	for (int64_t b = 0; b < nb; b++)
		for (int r = 0; r < DP; r++) {
			int32_t y[EB];
			float x[EB * 3];
			data_fill_eval(d, &ts.s, sy, b, r, DP, y);
			data_fill_eval(d, &ts.s, sx, b, r, DP, x);
			for (int t = 0; t < EB; t++) {
				int64_t want = (b * DP + r) * EB + t;
				if (want < N) {
					ok &= y[t] == want && x[t * 3 + 2] == (float)(want * 10 + 2);
					seen[y[t] >= 0 && y[t] < N ? y[t] : 0]++;
				} else {
					ok &= y[t] == -1 && x[t * 3] == 0 && x[t * 3 + 1] == 0 && x[t * 3 + 2] == 0;
					pads++;
				}
			}
		}
	int once = 1;
	for (int i = 0; i < N; i++)
		once &= seen[i] == 1;
	CHECK(ok && once && pads == 10, "eval order/padding wrong (pads %d)", pads);
	data_free(d);
}

/* ---- sources ---- */

static void test_fashion_mnist(void)
{
	if (access(FMNIST "train-images-idx3-ubyte.gz", R_OK) != 0) {
		printf("data_test: SKIP Fashion-MNIST (not in " FMNIST ")\n");
		return;
	}
	TestStep ts;
	step_init(&ts, 64, 1, 1234);
	int sx = add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, FMNIST "train-images-idx3-ubyte.gz",
			    DP_F32, 784, 0, 0, 8);
	int sy = add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 1, FMNIST "train-labels-idx1-ubyte.gz",
			    DP_I32, 1, 0, 0, 9);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_EVAL, 0, FMNIST "t10k-images-idx3-ubyte.gz", DP_F32, 784, 0, 0, 12);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_EVAL, 1, FMNIST "t10k-labels-idx1-ubyte.gz", DP_I32, 1, 0, 0, 13);
	DataSet *d, *ev;
	RtErr e = new_err();
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0) {
		CHECK(0, "Fashion-MNIST: %s", e.msg);
		return;
	}
	CHECK(data_count(d) == 60000, "Fashion-MNIST train has %lld samples", (long long)data_count(d));
	if (open_split(&ts, DP_SPLIT_EVAL, &ev, &e) == 0) {
		int32_t first[64];
		CHECK(data_count(ev) == 10000, "Fashion-MNIST test has %lld samples",
		      (long long)data_count(ev));
		/* Eval reads in order: the first test labels are 9 2 1 1 6 (boot, pullover, ...). */
		data_fill_eval(ev, &ts.s, 3, 0, 0, 1, first);
		CHECK(first[0] == 9 && first[1] == 2 && first[2] == 1 && first[3] == 1 && first[4] == 6,
		      "Fashion-MNIST first test labels %d %d %d %d %d", first[0], first[1], first[2],
		      first[3], first[4]);
		data_free(ev);
	} else {
		CHECK(0, "Fashion-MNIST eval: %s", e.msg);
	}
	/* Labels via the sampler over one epoch: 0..9, 6000 of each. */
	int hist[10] = {0}, bad = 0;
	float lo = 1, hi = 0;
	static float x[64 * 784];
	int32_t y[64];
	for (uint64_t st = 0; st < 60000 / 64; st++) {
		data_fill_train(d, &ts.s, sy, st, 0, 0, 1, y);
		for (int t = 0; t < 64; t++) {
			if (y[t] < 0 || y[t] > 9)
				bad++;
			else
				hist[y[t]]++;
		}
		if (st < 4) {
			data_fill_train(d, &ts.s, sx, st, 0, 0, 1, x);
			for (int k = 0; k < 64 * 784; k++)
				lo = fminf(lo, x[k]), hi = fmaxf(hi, x[k]);
		}
	}
	int even = !bad;
	for (int c = 0; c < 10; c++)
		even &= hist[c] > 5900 && hist[c] <= 6000;
	CHECK(even, "Fashion-MNIST label histogram off (bad %d, hist[0] %d)", bad, hist[0]);
	CHECK(lo == 0.0f && hi == 1.0f, "pixels in [%g, %g], want [0, 1]", lo, hi);
	data_free(d);

	step_init(&ts, 64, 1, 1234);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, FMNIST "train-images-idx3-ubyte.gz", DP_F32, 700, 0, 0, 8);
	expect_open_error(&ts, DP_SPLIT_TRAIN,
			  "has samples of 784 elements but the .dp file declares 700 (models/test.dp:8)",
			  "IDX sample size mismatch");
	step_init(&ts, 64, 1, 1234);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, FMNIST "train-images-idx3-ubyte.gz", DP_I32, 784, 0, 0, 8);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "declares i32", "IDX images as i32");
	step_init(&ts, 64, 1, 1234);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, FMNIST "train-images-idx3-ubyte.gz", DP_F32, 784, 0, 0, 8);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 1, FMNIST "t10k-labels-idx1-ubyte.gz", DP_I32, 1, 0, 0, 9);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "differ in sample count", "train images with test labels");
}

static void test_idx_files(void)
{
	enum { N = 6 };
	unsigned char pix[N * 2 * 3], *b;
	size_t len;
	uint32_t dims[3] = {N, 2, 3}, ldims[1] = {N};
	for (size_t i = 0; i < sizeof pix; i++)
		pix[i] = (unsigned char)(i * 37);
	idx_bytes(3, dims, pix, sizeof pix, &b, &len);
	write_bytes(tpath("img.idx"), b, len);
	/* the same file gzipped */
	gzFile gz = gzopen(tpath("img.idx.gz"), "wb");
	gzwrite(gz, b, (unsigned)len);
	gzclose(gz);
	unsigned char labs[N] = {3, 1, 4, 1, 5, 9};
	unsigned char *lb;
	size_t llen;
	idx_bytes(1, ldims, labs, N, &lb, &llen);
	write_bytes(tpath("lab.idx"), lb, llen);

	for (int z = 0; z < 2; z++) {
		TestStep ts;
		step_init(&ts, 2, 1, 5);
		add_source(&ts, DP_SRC_IDX, DP_SPLIT_EVAL, 0, tpath(z ? "img.idx.gz" : "img.idx"), DP_F32, 6, 0, 0, 1);
		add_source(&ts, DP_SRC_IDX, DP_SPLIT_EVAL, 1, tpath("lab.idx"), DP_I32, 1, 0, 0, 2);
		DataSet *d;
		RtErr e = new_err();
		if (open_split(&ts, DP_SPLIT_EVAL, &d, &e) != 0) {
			CHECK(0, "small IDX: %s", e.msg);
			continue;
		}
		float x[2 * 6];
		int32_t y[2];
		data_fill_eval(d, &ts.s, 0, 1, 0, 1, x); /* samples 2, 3 */
		data_fill_eval(d, &ts.s, 1, 1, 0, 1, y);
		int ok = y[0] == 4 && y[1] == 1;
		for (int k = 0; k < 12; k++)
			ok &= x[k] == (float)(unsigned char)((12 + k) * 37) / 255.0f;
		CHECK(ok, "small IDX (%s) values", z ? "gzip" : "plain");
		data_free(d);
	}

	/* Every truncation of the image file is an error. */
	int all = 1;
	for (size_t cut = 0; cut < len; cut++) {
		write_bytes(tpath("cut.idx"), b, cut);
		TestStep ts;
		step_init(&ts, 2, 1, 5);
		add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, tpath("cut.idx"), DP_F32, 6, 0, 0, 1);
		RtErr e = new_err();
		DataSet *d;
		if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) == 0) {
			all = 0;
			data_free(d);
		} else if (cut > 0 && !strstr(e.msg, "truncated")) {
			all = 0;
			fprintf(stderr, "cut %zu: %s\n", cut, e.msg);
		}
	}
	CHECK(all, "a truncated IDX file loads");

	TestStep ts;
	b[2] = 0x0d; /* float elements */
	write_bytes(tpath("bad.idx"), b, len);
	step_init(&ts, 2, 1, 5);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, tpath("bad.idx"), DP_F32, 6, 0, 0, 1);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "element type 0x0d", "IDX float type");
	b[2] = 8;
	b[0] = 0x1f; /* a gzip-looking but wrong magic */
	write_bytes(tpath("bad.idx"), b, len);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "not an IDX file", "IDX wrong magic");

	step_init(&ts, 2, 1, 5);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 0, tpath("missing.idx"), DP_F32, 6, 0, 0, 1);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "No such file or directory", "missing IDX file");
	step_init(&ts, 2, 1, 5);
	add_source(&ts, DP_SRC_IDX, DP_SPLIT_TRAIN, 1, tpath("lab.idx"), DP_F32, 1, 0, 0, 1);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "holds labels", "IDX labels as f32");
	free(b);
	free(lb);
}

static int open_one_npy(const char *path, int role, DpDtype dtype, int64_t elems, RtErr *e,
			DataSet **d)
{
	TestStep ts;
	step_init(&ts, 1, 1, 5);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, role, path, dtype, elems, 0, 0, 7);
	return open_split(&ts, DP_SPLIT_TRAIN, d, e);
}

static void expect_npy_error(const char *path, int role, DpDtype dtype, int64_t elems,
			     const char *want, const char *what)
{
	TestStep ts;
	step_init(&ts, 1, 1, 5);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, role, path, dtype, elems, 0, 0, 7);
	expect_open_error(&ts, DP_SPLIT_TRAIN, want, what);
}

static void test_npy(void)
{
	int64_t sh[3] = {4, 2, 3}, sh1[1] = {4};
	float f[24];
	int32_t i4[4] = {0, 7, 2, 9};
	int64_t i8[4] = {5, 0, 2147483647, 3};
	for (int k = 0; k < 24; k++)
		f[k] = 0.5f * (float)k - 3.0f;
	write_npy(tpath("f4.npy"), "<f4", sh, 3, f, sizeof f);
	write_npy(tpath("i4.npy"), "<i4", sh1, 1, i4, sizeof i4);
	write_npy(tpath("i8.npy"), "<i8", sh1, 1, i8, sizeof i8);

	DataSet *d;
	RtErr e = new_err();
	TestStep ts;
	step_init(&ts, 4, 1, 5);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_EVAL, 0, tpath("f4.npy"), DP_F32, 6, 0, 0, 1);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_EVAL, 1, tpath("i4.npy"), DP_I32, 1, 0, 0, 2);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_EVAL, 1, tpath("i8.npy"), DP_I32, 1, 0, 0, 3);
	if (open_split(&ts, DP_SPLIT_EVAL, &d, &e) == 0) {
		float x[24];
		int32_t a[4], b[4];
		data_fill_eval(d, &ts.s, 0, 0, 0, 1, x);
		data_fill_eval(d, &ts.s, 1, 0, 0, 1, a);
		data_fill_eval(d, &ts.s, 2, 0, 0, 1, b);
		CHECK(memcmp(x, f, sizeof f) == 0, "npy f4 round trip");
		CHECK(memcmp(a, i4, sizeof a) == 0, "npy i4 round trip");
		CHECK(b[0] == 5 && b[1] == 0 && b[2] == 2147483647 && b[3] == 3, "npy i8 round trip");
		data_free(d);
	} else {
		CHECK(0, "npy round trip: %s", e.msg);
	}
	/* i32 features (token ids) from an '<i8' file are fine too. */
	CHECK(open_one_npy(tpath("i8.npy"), 0, DP_I32, 1, &e, &d) == 0, "i8 features: %s", e.msg);
	if (d)
		data_free(d);

	unsigned char *b;
	size_t len;
	expect_npy_error(tpath("f4.npy"), 0, DP_F32, 5, "has samples of 6 elements but the .dp file declares 5 (models/test.dp:7)",
			 "npy shape mismatch");
	expect_npy_error(tpath("f4.npy"), 0, DP_I32, 6, "holds floats", "npy f4 as i32");
	expect_npy_error(tpath("i4.npy"), 0, DP_F32, 1, "holds integers", "npy i4 as f32");
	npy_bytes(">f4", "False", sh, 3, f, sizeof f, &b, &len);
	write_bytes(tpath("be.npy"), b, len);
	free(b);
	expect_npy_error(tpath("be.npy"), 0, DP_F32, 6, "dtype '>f4'", "npy big-endian");
	npy_bytes("<f8", "False", sh, 3, f, sizeof f, &b, &len);
	write_bytes(tpath("f8.npy"), b, len);
	free(b);
	expect_npy_error(tpath("f8.npy"), 0, DP_F32, 6, "dtype '<f8'", "npy float64");
	npy_bytes("<f4", "True", sh, 3, f, sizeof f, &b, &len);
	write_bytes(tpath("fo.npy"), b, len);
	free(b);
	expect_npy_error(tpath("fo.npy"), 0, DP_F32, 6, "Fortran order", "npy fortran order");
	int64_t big[1] = {4};
	int64_t i8big[4] = {1, 2, 1ll << 33, 4};
	write_npy(tpath("i8big.npy"), "<i8", big, 1, i8big, sizeof i8big);
	expect_npy_error(tpath("i8big.npy"), 1, DP_I32, 1, "does not fit", "npy i8 out of range");
	int32_t neg[4] = {1, -2, 3, 4};
	write_npy(tpath("neg.npy"), "<i4", big, 1, neg, sizeof neg);
	expect_npy_error(tpath("neg.npy"), 1, DP_I32, 1, "negative", "npy negative label");
	CHECK(open_one_npy(tpath("neg.npy"), 0, DP_I32, 1, &e, &d) == 0, "negative i32 features: %s", e.msg);
	if (d)
		data_free(d);
	int64_t sh0[1] = {0};
	write_npy(tpath("empty.npy"), "<f4", sh0, 1, f, 0);
	expect_npy_error(tpath("empty.npy"), 0, DP_F32, 1, "no samples", "npy without samples");

	/* Garbage headers (hand-written) and every truncation: errors, no crash. */
	const char *dicts[] = {
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 'x'), }",
		"{'descr': '<f4', 'fortran_order': False }",
		"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4, 6), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), 'extra': 1}",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 6), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), } trailing",
		"['descr', '<f4']",
		"{'descr': '<f4\\x00', 'fortran_order': False, 'shape': (4, 6), }",
		"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,6)}",
		"",
		"{",
		"{'descr",
		"{'shape': (4, 6,,), 'descr': '<f4', 'fortran_order': False}",
	};
	for (size_t k = 0; k < sizeof dicts / sizeof dicts[0]; k++) {
		size_t hl = strlen(dicts[k]);
		unsigned char *h = malloc(10 + hl + 96);
		memcpy(h, "\x93NUMPY\x01\x00", 8);
		h[8] = (unsigned char)hl, h[9] = 0;
		memcpy(h + 10, dicts[k], hl);
		memset(h + 10 + hl, 0, 96);
		write_bytes(tpath("garbage.npy"), h, 10 + hl + 96);
		free(h);
		char what[64];
		snprintf(what, sizeof what, "npy garbage header %zu", k);
		expect_npy_error(tpath("garbage.npy"), 0, DP_F32, 6, hl ? NULL : "header length", what);
	}
	unsigned char *good = read_bytes(tpath("f4.npy"), &len);
	int all = 1;
	for (size_t cut = 0; cut < len; cut++) {
		write_bytes(tpath("cut.npy"), good, cut);
		if (open_one_npy(tpath("cut.npy"), 0, DP_F32, 6, &e, &d) == 0) {
			all = 0;
			data_free(d);
		}
	}
	CHECK(all, "a truncated .npy loads");
	good[3] = 'X';
	write_bytes(tpath("magic.npy"), good, len);
	expect_npy_error(tpath("magic.npy"), 0, DP_F32, 6, "not a .npy file", "npy bad magic");
	good[3] = 'M';
	/* Random byte flips in the header: anything but a crash. */
	srand(7);
	for (int it = 0; it < 2000; it++) {
		unsigned char *m = malloc(len);
		memcpy(m, good, len);
		for (int f2 = 0; f2 < 3; f2++)
			m[6 + rand() % 74] = (unsigned char)rand();
		write_bytes(tpath("flip.npy"), m, len);
		free(m);
		if (open_one_npy(tpath("flip.npy"), 0, DP_F32, 6, &e, &d) == 0)
			data_free(d);
	}
	free(good);
	passed++; /* survived */
}

static void test_synthetic(void)
{
	enum { N = 500, D = 20, C = 5 };
	TestStep ts;
	step_init(&ts, 10, 1, 5);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 0, NULL, DP_F32, D, N, C, 1);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 1, NULL, DP_I32, 1, N, C, 2);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_EVAL, 0, NULL, DP_F32, D, 100, C, 3);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_EVAL, 1, NULL, DP_I32, 1, 100, C, 4);
	DataSet *d, *ev;
	RtErr e = new_err();
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0 || open_split(&ts, DP_SPLIT_EVAL, &ev, &e) != 0) {
		CHECK(0, "synthetic: %s", e.msg);
		return;
	}
	CHECK(data_count(d) == N && data_count(ev) == 100, "synthetic counts");
	float x[10 * D], xe[10 * D], ref[10 * D], w[C * D];
	int32_t y[10];
	data_fill_eval(d, &ts.s, 0, 3, 0, 1, x); /* train samples 30..39, in order */
	data_fill_eval(d, &ts.s, 1, 3, 0, 1, y);
	data_fill_eval(ev, &ts.s, 2, 3, 0, 1, xe);
	init_fill(DP_INIT_NORMAL, 0, 1, 0x5eed, "synthetic.x", 30 * D, 10 * D, ref);
	CHECK(memcmp(x, ref, sizeof x) == 0, "synthetic features are not the documented stream");
	CHECK(memcmp(x, xe, sizeof x) != 0, "eval features repeat the train features");
	init_fill(DP_INIT_NORMAL, 0, 1, 0x5eed, "synthetic.w", 0, C * D, w);
	int ok = 1;
	for (int t = 0; t < 10; t++) {
		double best = -1e300;
		int arg = -1;
		for (int c = 0; c < C; c++) {
			double s = 0;
			for (int k = 0; k < D; k++)
				s += (double)w[c * D + k] * x[t * D + k];
			if (s > best)
				best = s, arg = c;
		}
		ok &= y[t] == arg;
	}
	CHECK(ok, "synthetic labels are not argmax W x");
	int hist[C] = {0};
	for (int64_t b = 0; b < N / 10; b++) {
		data_fill_eval(d, &ts.s, 1, b, 0, 1, y);
		for (int t = 0; t < 10; t++)
			hist[y[t] >= 0 && y[t] < C ? y[t] : 0]++;
	}
	int spread = 1;
	for (int c = 0; c < C; c++)
		spread &= hist[c] > N / C / 4;
	CHECK(spread, "synthetic classes are degenerate (%d %d %d %d %d)", hist[0], hist[1], hist[2],
	      hist[3], hist[4]);
	data_free(d);
	data_free(ev);

	step_init(&ts, 10, 1, 5);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 1, NULL, DP_I32, 1, N, C, 2);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "need synthetic features", "synthetic labels alone");
	step_init(&ts, 10, 1, 5);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 0, NULL, DP_F32, D, N, C, 1);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 1, NULL, DP_I32, 1, N + 1, C, 2);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "differ in sample count", "synthetic counts differ");
	step_init(&ts, 10, 1, 5);
	add_source(&ts, DP_SRC_SYNTHETIC, DP_SPLIT_TRAIN, 0, NULL, DP_I32, D, N, C, 1);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "synthetic features are f32", "synthetic i32 features");
}

/* ---- llm.c token shards ---- */

/* A token source (role 1 as the front end sets for i32) with its shift. */
static int add_tokens(TestStep *ts, DpSplit split, const char *pattern, int64_t T, int shift,
		      uint32_t line)
{
	int i = add_source(ts, DP_SRC_TOKENS, split, 1, pattern, DP_I32, T, 0, 0, line);
	ts->sources[i].shift = (uint8_t)shift;
	return i;
}

/* A shard of n tokens tok[0..n) with the given header fields; extra bytes are
 * appended (negative: that many bytes cut off the end). */
static void write_shard(const char *path, const uint16_t *tok, int32_t n, int32_t magic,
			int32_t version, int32_t hdr_n, int extra)
{
	size_t len = 1024 + 2 * (size_t)n + (extra > 0 ? (size_t)extra : 0);
	unsigned char *b = calloc(1, len);
	int32_t h[3] = {magic, version, hdr_n};
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 4; k++)
			b[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
	for (int32_t i = 0; i < n; i++) {
		b[1024 + 2 * i] = (unsigned char)(tok[i] & 0xff);
		b[1024 + 2 * i + 1] = (unsigned char)(tok[i] >> 8);
	}
	write_bytes(path, b, extra < 0 ? len + (size_t)extra : len);
	free(b);
}

/* Token i of test shard s: distinct across shards, some above 32767 so a
 * signed widening would show. */
static uint16_t tok_value(int s, int i)
{
	return (uint16_t)(s * 20000 + i * 3 + 1); /* shard 2: 40001 .. */
}

static void test_tokens(void)
{
	enum { T = 5, N0 = 23, N1 = 17, N2 = T + 1 };
	/* samples: (23-1)/5 = 4, (17-1)/5 = 3, (6-1)/5 = 1: 8 in all */
	static const int ns[3] = {N0, N1, N2}, per[3] = {4, 3, 1};
	uint16_t tok[3][N0];
	/* written out of order: glob sorts by name */
	const char *names[3] = {"tok_0.bin", "tok_1.bin", "tok_2.bin"};
	for (int sh = 2; sh >= 0; sh--) {
		for (int i = 0; i < ns[sh]; i++)
			tok[sh][i] = tok_value(sh, i);
		write_shard(tpath(names[sh]), tok[sh], ns[sh], 20240520, 1, ns[sh], 0);
	}
	/* expected sample k: (shard, first token) */
	int ks[8], kf[8], nk = 0;
	for (int sh = 0; sh < 3; sh++)
		for (int j = 0; j < per[sh]; j++)
			ks[nk] = sh, kf[nk++] = j * T;

	TestStep ts;
	step_init(&ts, 2, 1, 77);
	int sx = add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_*.bin"), T, 0, 3);
	int sy = add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_*.bin"), T, 1, 4);
	int ex = add_tokens(&ts, DP_SPLIT_EVAL, tpath("tok_*.bin"), T, 0, 7);
	int ey = add_tokens(&ts, DP_SPLIT_EVAL, tpath("tok_*.bin"), T, 1, 8);
	DataSet *d, *ev;
	RtErr e = new_err();
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0) {
		CHECK(0, "token train split: %s", e.msg);
		return;
	}
	if (open_split(&ts, DP_SPLIT_EVAL, &ev, &e) != 0) {
		CHECK(0, "token eval split: %s", e.msg);
		data_free(d);
		return;
	}
	CHECK(data_count(d) == 8 && data_count(ev) == 8, "token samples %lld / %lld, want 8",
	      (long long)data_count(d), (long long)data_count(ev));

	/* Eval reads in order: every window, shard by shard, x and y shifted by one;
	 * 8 samples in batches of 2 on 3 ranks: 2 batches, 4 padded samples. */
	int64_t nb = data_eval_batches(ev, &ts.s, 3);
	CHECK(nb == 2, "token eval batches %lld, want 2", (long long)nb);
	int ok = 1, pads = 0, seen = 0;
	for (int64_t b = 0; b < nb; b++)
		for (int r = 0; r < 3; r++) {
			int32_t x[2 * T], y[2 * T];
			data_fill_eval(ev, &ts.s, ex, b, r, 3, x);
			data_fill_eval(ev, &ts.s, ey, b, r, 3, y);
			for (int t = 0; t < 2; t++) {
				int64_t k = (b * 3 + r) * 2 + t;
				for (int j = 0; j < T; j++) {
					if (k < 8) {
						ok &= x[t * T + j] == tok[ks[k]][kf[k] + j];
						ok &= y[t * T + j] == tok[ks[k]][kf[k] + j + 1];
					} else {
						ok &= x[t * T + j] == 0 && y[t * T + j] == -1;
					}
				}
				seen += k < 8;
				pads += k >= 8;
			}
		}
	CHECK(ok && seen == 8 && pads == 4, "token eval windows/padding wrong (seen %d, pads %d)",
	      seen, pads);

	/* Train: the sampler's global batch, x and y the same windows. */
	int gb = 4, dp = 2;
	ts.s.cfg.micro_batch = 1;
	ts.s.cfg.grad_accum = 2;
	ok = 1;
	for (uint64_t st = 0; st < 5; st++) /* 2 steps per epoch: crosses epochs */
		for (int r = 0; r < dp; r++)
			for (int m = 0; m < 2; m++) {
				int32_t x[T], y[T];
				data_fill_train(d, &ts.s, sx, st, m, r, dp, x);
				data_fill_train(d, &ts.s, sy, st, m, r, dp, y);
				int64_t k = data_sample_index(77, 8, gb, st, r + dp * m);
				for (int j = 0; j < T; j++)
					ok &= x[j] == tok[ks[k]][kf[k] + j] && y[j] == tok[ks[k]][kf[k] + j + 1];
			}
	CHECK(ok, "token train windows do not follow the sampler");
	data_free(d);
	data_free(ev);

	/* One named file (no glob characters) and the exact T+1 minimum. */
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_2.bin"), T, 0, 3);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_2.bin"), T, 1, 4);
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) == 0) {
		int32_t x[T], y[T];
		CHECK(data_count(d) == 1, "a T+1-token shard has %lld samples", (long long)data_count(d));
		data_fill_train(d, &ts.s, 0, 0, 0, 0, 1, x);
		data_fill_train(d, &ts.s, 1, 0, 0, 0, 1, y);
		CHECK(x[0] == tok[2][0] && x[4] == tok[2][4] && y[0] == tok[2][1] && y[4] == tok[2][5] &&
		      x[0] > 32767, "a T+1-token shard's window: x %d..%d y %d..%d", x[0], x[4], y[0], y[4]);
		data_free(d);
	} else {
		CHECK(0, "one shard by name: %s", e.msg);
	}

	/* Errors: each names the file (or the pattern) and the .dp line. */
	struct {
		const char *file;
		int32_t n, magic, version, hdr_n;
		int extra;
		const char *want;
	} bad[] = {
		{"bad_magic.bin", 20, 20240521, 1, 20, 0, "bad header: magic 20240521"},
		{"bad_version.bin", 20, 20240520, 2, 20, 0, "version 2"},
		{"bad_trunc.bin", 20, 20240520, 1, 20, -1, "wrong size (truncated)"},
		{"bad_extra.bin", 20, 20240520, 1, 20, 2, "the file has 1066 bytes"},
		{"bad_count.bin", 20, 20240520, 1, 21, 0, "says 21 tokens (1066 bytes)"},
		{"bad_neg.bin", 20, 20240520, 1, -5, 0, "says -5 tokens"},
		{"bad_short.bin", T, 20240520, 1, T, 0, "holds 5 tokens, fewer than one window of 5 + 1"},
		{"bad_empty.bin", 0, 20240520, 1, 0, 0, "holds 0 tokens"},
		{"bad_hdr.bin", 0, 20240520, 1, 0, -600, "shorter than the 1024-byte header"},
	};
	uint16_t some[32] = {0};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		write_shard(tpath(bad[i].file), some, bad[i].n, bad[i].magic, bad[i].version,
			    bad[i].hdr_n, bad[i].extra);
		step_init(&ts, 1, 1, 1);
		add_tokens(&ts, DP_SPLIT_TRAIN, tpath(bad[i].file), T, 0, 12);
		char want[256];
		snprintf(want, sizeof want, "%s", bad[i].want);
		expect_open_error(&ts, DP_SPLIT_TRAIN, want, bad[i].file);
		expect_open_error(&ts, DP_SPLIT_TRAIN, tpath(bad[i].file), bad[i].file);
		expect_open_error(&ts, DP_SPLIT_TRAIN, "(models/test.dp:12)", bad[i].file);
	}
	/* A bad shard among good ones, matched by a glob: named, everything freed. */
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("*_*.bin"), T, 0, 3);
	expect_open_error(&ts, DP_SPLIT_TRAIN, tpath("bad_count.bin"), "bad shard in a glob");
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("nothing_*.bin"), T, 0, 3);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "nothing_*.bin matches no file", "glob without a match");
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("nothing.bin"), T, 0, 3);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "nothing.bin: no such file", "missing shard");
	step_init(&ts, 1, 1, 1);
	add_source(&ts, DP_SRC_TOKENS, DP_SPLIT_TRAIN, 0, tpath("tok_0.bin"), DP_F32, T, 0, 0, 3);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "must be declared i32, not f32", "f32 tokens");
	/* x and y from shards of different lengths: the sample-count check. */
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_0.bin"), T, 0, 3);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("tok_1.bin"), T, 1, 4);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "differ in sample count", "x and y from different shards");
	mkdir(tpath("dir_0.bin"), 0755);
	step_init(&ts, 1, 1, 1);
	add_tokens(&ts, DP_SPLIT_TRAIN, tpath("dir_*.bin"), T, 0, 3);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "not a regular file", "a directory as a shard");
	rmdir(tpath("dir_0.bin"));
}

/* ---- checks against the model: label range, token ids, shards that shrink ---- */

/* A model tensor of the given shape and an instruction reading data tensor
 * `id`: XENT (logits [rows, classes], id the labels) or EMBEDDING (table
 * [classes, 4], id the ids). */
static void add_reader(TestStep *ts, DpInstr *prog, int32_t id, int64_t classes, int embedding)
{
	DpTensor *t = &ts->tensors[ts->s.ntensors];
	t->name = add_string(ts, embedding ? "wte" : "logits");
	t->dtype = DP_F32;
	t->kind = embedding ? DP_T_PARAM : DP_T_ACT;
	t->ndim = 2;
	t->dims[0] = embedding ? classes : 4;
	t->dims[1] = embedding ? 4 : classes;
	for (int a = 0; a < DP_MAX_AXES; a++)
		t->place_dim[a] = -1;
	int32_t tid = (int32_t)ts->s.ntensors++;
	DpInstr *in = &prog[ts->s.nprog[DP_PROG_STEP]++];
	memset(in, 0, sizeof *in);
	in->op = embedding ? DP_OP_EMBEDDING : DP_OP_XENT;
	for (int k = 0; k < DP_MAX_IN; k++)
		in->in[k] = -1;
	in->in[0] = embedding ? id : tid;
	in->in[1] = embedding ? tid : id;
	in->out = -1;
	ts->s.prog[DP_PROG_STEP] = prog;
}

static void test_model_checks(void)
{
	DpInstr prog[4];
	RtErr e = new_err();
	DataSet *d;

	/* a label of 7 among 5 classes: an error at load naming file and sample */
	int32_t y[6] = {0, 1, 2, 7, 4, 0};
	int64_t shape[1] = {6};
	float x[6][2] = {{0}};
	int64_t xshape[2] = {6, 2};
	write_npy(tpath("lab_y.npy"), "<i4", shape, 1, y, sizeof y);
	write_npy(tpath("lab_x.npy"), "<f4", xshape, 2, x, sizeof x);
	TestStep ts;
	step_init(&ts, 2, 1, 1);
	add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, 0, tpath("lab_x.npy"), DP_F32, 2, 0, 0, 4);
	int sy = add_source(&ts, DP_SRC_NPY, DP_SPLIT_TRAIN, 1, tpath("lab_y.npy"), DP_I32, 1, 0, 0, 5);
	add_reader(&ts, prog, ts.sources[sy].tensor, 5, 0);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "lab_y.npy: label 7 of sample 3 is outside the 5 classes "
			  "of the model (models/test.dp:5)", "a label out of range");
	/* with 8 classes the same file loads */
	ts.tensors[ts.s.ntensors - 1].dims[1] = 8;
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) == 0) {
		passed++;
		data_free(d);
	} else {
		CHECK(0, "labels below the classes: %s", e.msg);
	}

	/* token shards: an id outside the vocabulary is refused at load (the
	 * scan of every shard, runtime/data_scan.c); one written after the shard
	 * was opened, and a shard cut short after it was opened, are errors from
	 * data_error, zeros in the batch, no signal */
	enum { T = 4, N = 41 };
	uint16_t tok[N];
	for (int i = 0; i < N; i++)
		tok[i] = (uint16_t)(i % 9);
	tok[17] = 300;
	write_shard(tpath("vocab.bin"), tok, N, 20240520, 1, N, 0);
	step_init(&ts, 2, 1, 5);
	int sx = add_tokens(&ts, DP_SPLIT_TRAIN, tpath("vocab.bin"), T, 0, 3);
	add_reader(&ts, prog, ts.sources[sx].tensor, 256, 1);
	expect_open_error(&ts, DP_SPLIT_TRAIN, "vocab.bin: token 300 at index 17 is outside the model's "
			  "vocabulary of 256 (models/test.dp:3)", "a token outside the vocabulary, at load");
	tok[17] = 3;
	write_shard(tpath("vocab.bin"), tok, N, 20240520, 1, N, 0);
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0) {
		CHECK(0, "token shard: %s", e.msg);
		return;
	}
	int fd = open(tpath("vocab.bin"), O_WRONLY); /* changed after the load */
	uint16_t bad_id = 300;
	if (fd < 0 || pwrite(fd, &bad_id, 2, 1024 + 2 * 17) != 2 || close(fd) != 0)
		abort();
	int32_t out[2 * T];
	int bad = 0;
	for (uint64_t step = 0; step < 5 && !bad; step++) {
		data_fill_train(d, &ts.s, sx, step, 0, 0, 1, out);
		bad = data_error(d, &e) != 0;
	}
	CHECK(bad && strstr(e.msg, "token 300 at index 17 is outside the model's vocabulary of 256"),
	      "a token outside the vocabulary: %s", bad ? e.msg : "not found");
	data_free(d);

	for (int i = 0; i < N; i++)
		tok[i] = (uint16_t)(i % 9);
	write_shard(tpath("shrinks.bin"), tok, N, 20240520, 1, N, 0);
	step_init(&ts, 2, 1, 5);
	sx = add_tokens(&ts, DP_SPLIT_TRAIN, tpath("shrinks.bin"), T, 0, 3);
	if (open_split(&ts, DP_SPLIT_TRAIN, &d, &e) != 0) {
		CHECK(0, "token shard: %s", e.msg);
		return;
	}
	if (truncate(tpath("shrinks.bin"), 1024 + 2 * 10) != 0)
		abort();
	bad = 0;
	for (uint64_t step = 0; step < 5 && !bad; step++) {
		data_fill_train(d, &ts.s, sx, step, 0, 0, 1, out);
		bad = data_error(d, &e) != 0;
	}
	CHECK(bad && strstr(e.msg, "shrinks.bin") && strstr(e.msg, "shorter than when the run started"),
	      "a shard cut short while training: %s", bad ? e.msg : "not noticed");
	data_free(d);
}

/* ---- safetensors ---- */

static int count_temps(const char *dir, const char *base)
{
	DIR *dd = opendir(dir);
	struct dirent *de;
	char tmp[256];
	int n = 0;
	snprintf(tmp, sizeof tmp, "%s" OUT_TMP_SUFFIX, base); /* util/outfile.h's temp name */
	if (!dd)
		return 0;
	while ((de = readdir(dd)))
		n += strcmp(de->d_name, tmp) == 0;
	closedir(dd);
	return n;
}

static void expect_st_error(const unsigned char *b, size_t len, const char *want, const char *what)
{
	StTensor *t;
	int n;
	RtErr e = new_err();
	write_bytes(tpath("bad.safetensors"), b, len);
	int rc = st_read(tpath("bad.safetensors"), &t, &n, &e);
	CHECK(rc == -1 && t == NULL && n == 0, "%s: st_read should fail", what);
	if (getenv("DATA_TEST_VERBOSE"))
		printf("  %s: %s\n", what, e.msg);
	if (rc == -1 && want)
		CHECK(strstr(e.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, want);
	if (rc == -1)
		CHECK(strstr(e.msg, "bad.safetensors") != NULL, "%s: message '%s' does not name the file",
		      what, e.msg);
	if (rc == 0)
		st_free(t, n);
}

/* A file with a hand-written header and `data_len` bytes of data. */
static void st_manual(const char *json, size_t data_len, unsigned char **out, size_t *len)
{
	size_t hl = strlen(json);
	*len = 8 + hl + data_len;
	*out = calloc(1, *len);
	for (int k = 0; k < 8; k++)
		(*out)[k] = (unsigned char)((uint64_t)hl >> (8 * k));
	memcpy(*out + 8, json, hl);
}

/* The checksums of a streamed file: one CRC-32C per 1 MiB block as the
 * bytes went (any chunking), and a reader given them refuses a damaged
 * block, but only a read that touches it. */
static void test_st_sums(void)
{
	enum { NF = 900000 }; /* 3.4 MiB of data: blocks 0..3 */
	float *v = malloc(NF * sizeof *v);
	for (int i = 0; i < NF; i++)
		v[i] = (float)i * 0.5f;
	StDecl d[1] = {{.name = "v", .dtype = ST_F32, .ndim = 1, .dims = {NF}}};
	StWriter w;
	RtErr e = new_err();
	const char *path = tpath("sums.safetensors");
	int rc = st_begin(&w, path, d, 1, &e);
	for (int64_t at = 0, k = 1; rc == 0 && at < NF; at += k, k = k * 7 % 400009 + 1)
		rc = st_put(&w, v + at, (at + k < NF ? k : NF - at) * 4, &e); /* odd chunks */
	CHECK(rc == 0 && st_end(&w, &e) == 0, "streamed write: %s", e.msg);
	FILE *f = fopen(path, "rb");
	unsigned char *all = malloc(8 << 20);
	size_t len = f ? fread(all, 1, 8 << 20, f) : 0;
	if (f)
		fclose(f);
	int ok = w.sums.n == (int64_t)((len + ST_SUM_BLOCK - 1) / ST_SUM_BLOCK) && w.sums.n == 4;
	for (int64_t k = 0; ok && k < w.sums.n; k++) {
		size_t n = len - (size_t)k * ST_SUM_BLOCK < ST_SUM_BLOCK ? len - (size_t)k * ST_SUM_BLOCK
									 : ST_SUM_BLOCK;
		ok = w.sums.crc[k] == crc32c(0, all + k * ST_SUM_BLOCK, n);
	}
	CHECK(ok, "the writer's block checksums are the file's (%lld blocks of %zu bytes)",
	      (long long)w.sums.n, len);
	/* a flipped bit in block 2: reads there refused, reads in block 0 fine */
	all[2 * ST_SUM_BLOCK + 5] ^= 4;
	f = fopen(path, "wb");
	if (!f || fwrite(all, 1, len, f) != len || fclose(f) != 0)
		abort();
	StFile sf;
	float got[4];
	CHECK(st_open(&sf, path, &e) == 0 && st_verify_with(&sf, w.sums.crc, w.sums.n, &e) == 0,
	      "open and verify the header: %s", e.msg);
	CHECK(st_pread(&sf, 0, 4 * 1000, got, sizeof got, &e) == 0 && got[0] == 500.0f,
	      "a read in a sound block: %s", e.msg);
	e = new_err();
	rc = st_pread(&sf, 0, 2 * ST_SUM_BLOCK, got, sizeof got, &e);
	CHECK(rc != 0 && strstr(e.msg, "sums.safetensors is damaged: bytes [2097152, 3145728) do not match "
				 "their checksum"), "a read in the damaged block: %s", rc ? e.msg : "accepted");
	e = new_err();
	float across[64]; /* from 128 bytes before block 2 into it */
	CHECK(st_pread(&sf, 0, 2 * ST_SUM_BLOCK - 128 - sf.data_start, across, sizeof across, &e) != 0,
	      "a read across into the damaged block is refused");
	CHECK(st_pread(&sf, 0, ST_SUM_BLOCK - 128 - sf.data_start, across, sizeof across, &e) == 0 &&
	      across[0] == (float)((ST_SUM_BLOCK - 128 - sf.data_start) / 4) * 0.5f,
	      "a read across sound blocks: %s", e.msg);
	st_close(&sf);
	CHECK(st_open(&sf, path, &e) == 0 && st_verify_with(&sf, w.sums.crc, w.sums.n - 1, &e) != 0,
	      "a list of checksums that does not cover the file is refused");
	st_close(&sf);
	st_sums_free(&w.sums);
	free(all);
	free(v);
	unlink(path);
}

static void test_safetensors(void)
{
	float w[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7}, b[3] = {0.25f, 0.5f, 0.75f}, s[1] = {42};
	StTensor in[3] = {
		{.name = "fc1.w", .ndim = 2, .dims = {2, 3}, .data = w},
		{.name = "fc1.b", .ndim = 1, .dims = {3}, .data = b},
		{.name = "scale", .ndim = 0, .data = s},
	};
	RtErr e = new_err();
	const char *path = tpath("ck.safetensors");
	CHECK(st_write(path, in, 3, &e) == 0, "st_write: %s", e.msg);
	StTensor *out;
	int n;
	if (st_read(path, &out, &n, &e) == 0) {
		int ok = n == 3;
		for (int i = 0; ok && i < 3; i++) {
			const StTensor *o = NULL;
			for (int j = 0; j < n; j++)
				if (strcmp(out[j].name, in[i].name) == 0)
					o = &out[j];
			ok = o && o->ndim == in[i].ndim;
			int64_t cnt = 1;
			for (int k = 0; ok && k < o->ndim; k++)
				ok = o->dims[k] == in[i].dims[k], cnt *= o->dims[k];
			ok = ok && memcmp(o->data, in[i].data, (size_t)cnt * 4) == 0;
		}
		CHECK(ok, "safetensors round trip");
		st_free(out, n);
	} else {
		CHECK(0, "st_read: %s", e.msg);
	}
	CHECK(count_temps(tmpdir, "ck.safetensors") == 0, "st_write left a temp file");
	size_t len;
	unsigned char *good = read_bytes(path, &len);
	uint64_t hl = 0;
	for (int k = 0; k < 8; k++)
		hl |= (uint64_t)good[k] << (8 * k);
	CHECK((8 + hl) % 8 == 0 && 8 + hl + 40 == len, "header padding/length (%llu, %zu)",
	      (unsigned long long)hl, len);
	struct stat stt;
	CHECK(stat(path, &stt) == 0 && (stt.st_mode & 0777) == 0644, "checkpoint mode %o",
	      stt.st_mode & 0777);

	/* Every truncation is an error. */
	int all = 1;
	for (size_t cut = 0; cut < len; cut++) {
		write_bytes(tpath("cut.safetensors"), good, cut);
		if (st_read(tpath("cut.safetensors"), &out, &n, &e) == 0) {
			all = 0;
			st_free(out, n);
		}
	}
	CHECK(all, "a truncated safetensors file loads");
	/* Random flips in the header: no crash. */
	srand(11);
	for (int it = 0; it < 3000; it++) {
		unsigned char *m = malloc(len);
		memcpy(m, good, len);
		for (int f2 = 0; f2 < 2; f2++)
			m[rand() % (8 + (int)hl)] = (unsigned char)(rand() % 2 ? rand() : "{}[]\",:0 "[rand() % 9]);
		write_bytes(tpath("flip.safetensors"), m, len);
		free(m);
		if (st_read(tpath("flip.safetensors"), &out, &n, &e) == 0)
			st_free(out, n);
	}
	passed++;
	free(good);

	unsigned char *m;
	size_t ml;
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8, &m, &ml);
	expect_st_error(m, ml, "not valid JSON", "unterminated JSON");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4, &m, &ml);
	expect_st_error(m, ml, "tensor a has dtype BF16", "BF16 tensor");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 12]}}", 12, &m, &ml);
	expect_st_error(m, ml, "shape needs 8", "offsets vs shape");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
		  "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12, &m, &ml);
	expect_st_error(m, ml, "overlap", "overlapping tensors");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, &m, &ml);
	expect_st_error(m, ml, "outside", "offsets past the end");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, &m, &ml);
	expect_st_error(m, ml, "bad shape", "negative dim");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 8]}}", 8, &m, &ml);
	expect_st_error(m, ml, "bad shape", "fractional dim");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,2], \"data_offsets\": [0, 8]}}", 8, &m, &ml);
	expect_st_error(m, ml, "dimensions", "too many dims");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
		  "\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 16, &m, &ml);
	expect_st_error(m, ml, "twice", "duplicate tensor");
	free(m);
	st_manual("[1, 2]  ", 0, &m, &ml);
	expect_st_error(m, ml, "not a JSON object", "array header");
	free(m);
	st_manual("{\"a\": 5}", 0, &m, &ml);
	expect_st_error(m, ml, "not an object", "number entry");
	free(m);
	st_manual("{}   xx", 0, &m, &ml);
	expect_st_error(m, ml, "after the JSON", "trailing garbage");
	free(m);
	st_manual("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, &m, &ml);
	m[7] = 0x7f; /* header length 2^63-ish */
	expect_st_error(m, ml, "header length", "huge header length");
	free(m);
	expect_st_error((const unsigned char *)"abc", 3, "too short", "3-byte file");
	{
		StTensor *t;
		CHECK(st_read(tpath("nonexistent.safetensors"), &t, &n, &e) == -1 &&
		      strstr(e.msg, "No such file"), "missing file: %s", e.msg);
	}
	/* An empty set of tensors is a valid file. */
	CHECK(st_write(tpath("empty.safetensors"), in, 0, &e) == 0 &&
	      st_read(tpath("empty.safetensors"), &out, &n, &e) == 0 && n == 0, "empty file: %s", e.msg);
	st_free(out, n);
	StTensor dup[2] = {in[0], in[0]};
	CHECK(st_write(tpath("dup.safetensors"), dup, 2, &e) == -1 && strstr(e.msg, "two tensors"),
	      "duplicate names written: %s", e.msg);

	/* Failures leave nothing behind. */
	CHECK(st_write(tpath("nodir/x.safetensors"), in, 3, &e) == -1, "write into a missing dir");
	mkdir(tpath("isdir.safetensors"), 0755);
	CHECK(st_write(tpath("isdir.safetensors"), in, 3, &e) == -1 && strstr(e.msg, "a directory"),
	      "writing onto a directory should be refused: %s", e.msg);
	CHECK(count_temps(tmpdir, "isdir.safetensors") == 0, "a refused write left a temp file");
	rmdir(tpath("isdir.safetensors"));

	/* A write error midway (file-size limit): no target, no temp. */
	static float big[100000];
	StTensor bt = {.name = "big", .ndim = 1, .dims = {100000}, .data = big};
	struct rlimit old, lim;
	getrlimit(RLIMIT_FSIZE, &old);
	lim = old;
	lim.rlim_cur = 4096;
	signal(SIGXFSZ, SIG_IGN);
	if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
		int rc = st_write(tpath("limited.safetensors"), &bt, 1, &e);
		setrlimit(RLIMIT_FSIZE, &old);
		CHECK(rc == -1, "write past the file-size limit succeeded");
		CHECK(access(tpath("limited.safetensors"), F_OK) != 0 &&
		      count_temps(tmpdir, "limited.safetensors") == 0, "failed write left a file");
	}
	signal(SIGXFSZ, SIG_DFL);

	/* A read-only directory (meaningless as root, who writes anyway). */
	if (geteuid() != 0) {
		mkdir(tpath("ro"), 0555);
		CHECK(st_write(tpath("ro/x.safetensors"), in, 3, &e) == -1 &&
		      strstr(e.msg, "Permission denied"), "write into a read-only dir: %s", e.msg);
		CHECK(count_temps(tpath("ro"), "x.safetensors") == 0, "read-only dir got a temp file");
		rmdir(tpath("ro"));
	} else {
		printf("data_test: running as root, the read-only directory case is skipped\n");
	}
}

static void remove_tree(const char *dir)
{
	DIR *dd = opendir(dir);
	struct dirent *de;
	char p[1024];
	if (!dd)
		return;
	while ((de = readdir(dd))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		if (unlink(p) != 0)
			remove_tree(p);
	}
	closedir(dd);
	rmdir(dir);
}

int main(void)
{
	const char *t = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/data_test.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 2;
	}
	test_init();
	test_sampler();
	test_fill_train();
	test_eval();
	test_idx_files();
	test_npy();
	test_synthetic();
	test_tokens();
	test_model_checks();
	test_safetensors();
	test_st_sums();
	test_fashion_mnist();
	remove_tree(tmpdir);
	printf("data_test: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
