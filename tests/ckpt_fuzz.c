/*
 * ckpt_fuzz.c - the checkpoint reader (state.json, safetensors headers,
 * the sharded form's segment tables, checksums, values) against damaged
 * checkpoints, in-process.
 *
 *   ckpt_fuzz STEP.bin [SECONDS [SEED]]      (one rank: a singleton MPI run)
 *
 * Builds the executor of STEP.bin on the CPU backend (a 1-rank step file),
 * writes pseudo-random values (finite; second moments positive) into every
 * tensor a checkpoint holds, saves a full and a sharded checkpoint with
 * ckpt_save and loads each back (it must give the same bytes). Then, for
 * SECONDS (default 10), takes one of the two, mutates one of its files
 * (state.json or a safetensors file: bit flips, bytes set to 0, 0xff or a
 * random value, NaN / inf floats, ranges zeroed, duplicated or deleted,
 * truncation, values of state.json replaced by other JSON), and calls
 * ckpt_load on the copy. A mutation is either left as it is, which must be
 * refused or load exactly the saved state (the step and every byte of
 * every tensor the load writes: anything else is a silent acceptance), or,
 * one time in three for a safetensors file, "forged": its size and
 * checksums in state.json recomputed, as a tool rewriting the file would,
 * which reaches the header, segment-table and value checks behind the
 * checksums; a forged copy may load other values, but only finite ones.
 * Every load returns 0 or -1 with a message and never crashes (run it
 * under ASan/UBSan: SAN=1). The same seed gives the same mutations.
 * Prints "ckpt_fuzz: N execs in S s (seed K): R refused, A accepted
 * unchanged, F forged loads (finite), 0 failures"; exit status 1 on any
 * failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mpi.h>

#include "../util/crc32c.h"
#include "ckpt_int.h"
#include "comm.h"
#include "fuzz_rand.h"

static int nfail;

#define FAIL(...)                            \
	do {                                 \
		if (nfail++ < 20) {          \
			printf("  FAIL ");   \
			printf(__VA_ARGS__); \
			printf("\n");        \
		}                            \
	} while (0)

typedef struct {
	char *p;
	size_t n;
} Buf;

static Buf slurp(const char *path)
{
	Buf b = {0};
	FILE *f = fopen(path, "rb");
	if (!f)
		return b;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b.p = malloc((size_t)n + 1);
	b.n = b.p && fread(b.p, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
	fclose(f);
	return b;
}

static int spill(const char *path, const char *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	int ok = f && fwrite(p, 1, n, f) == n;
	return (f && fclose(f) == 0 && ok) ? 0 : -1;
}

/* One saved checkpoint: its directory and its files' bytes. */
typedef struct {
	char dir[4400];
	int nfile;
	char name[8][64]; /* name[0] is state.json */
	Buf orig[8];
} Seed;

static int load_seed(Seed *sd, const char *dir)
{
	snprintf(sd->dir, sizeof sd->dir, "%s", dir);
	char p[4600];
	snprintf(p, sizeof p, "%s/state.json", dir);
	Buf st = slurp(p);
	cJSON *js = st.p ? cJSON_ParseWithLength(st.p, st.n) : NULL;
	const cJSON *fl = cJSON_GetObjectItemCaseSensitive(js, "files");
	if (!cJSON_IsArray(fl) || cJSON_GetArraySize(fl) > 7) {
		cJSON_Delete(js);
		return -1;
	}
	snprintf(sd->name[0], 64, "state.json");
	sd->orig[0] = st;
	sd->nfile = 1;
	for (const cJSON *f = fl->child; f; f = f->next, sd->nfile++) {
		snprintf(sd->name[sd->nfile], 64, "%s",
			 cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
		snprintf(p, sizeof p, "%s/%s", dir, sd->name[sd->nfile]);
		sd->orig[sd->nfile] = slurp(p);
	}
	cJSON_Delete(js);
	return 0;
}

static const char *const json_tokens[] = {
	"0", "-1", "1e300", "-0", "1.5", "NaN", "\"12\"", "null", "true", "[]", "{}", "\"\"",
	"9007199254740993", "18446744073709551615", "4294967296", "\"step-000001\"", "\"x\"",
	"\"00000000\"", "\"ffffffff\"", "1048576", "2", "[1, 1, 1, 1]", "\"full\"", "\"sharded\"",
};

/* One mutation of b (in place; it may grow, up to cap bytes, or shrink). */
static void mutate(Buf *b, size_t cap, int json, uint64_t *s)
{
	size_t at = below(s, b->n ? b->n : 1);
	switch (below(s, json ? 8 : 7)) {
	case 0: /* flip a bit */
		if (b->n)
			b->p[at] ^= (char)(1 << below(s, 8));
		break;
	case 1: /* a byte set to something */ {
		static const unsigned char v[] = {0, 0xff, 0x7f, 0x80, '"', '9', ' ', '\n'};
		if (b->n)
			b->p[at] = (char)(below(s, 2) ? v[below(s, sizeof v)] : below(s, 256));
		break;
	}
	case 2: /* a float set to NaN, inf or -inf at an aligned place */ {
		static const uint32_t v[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0xffffffffu};
		size_t k = at & ~(size_t)3;
		if (k + 4 <= b->n)
			memcpy(b->p + k, &v[below(s, 4)], 4);
		break;
	}
	case 3: /* a range zeroed (blanked in JSON) */ {
		size_t n = 1 + below(s, 64);
		if (at + n <= b->n)
			memset(b->p + at, json ? ' ' : 0, n);
		break;
	}
	case 4: /* a range deleted */ {
		size_t n = 1 + below(s, 16);
		if (at + n <= b->n) {
			memmove(b->p + at, b->p + at + n, b->n - at - n);
			b->n -= n;
		}
		break;
	}
	case 5: /* a range duplicated */ {
		size_t n = 1 + below(s, 16);
		if (at + n <= b->n && b->n + n <= cap) {
			memmove(b->p + at + n, b->p + at, b->n - at);
			b->n += n;
		}
		break;
	}
	case 6: /* truncated */
		b->n = at;
		break;
	default: /* state.json: a value replaced by another JSON value */ {
		/* the next ':' after at, and its value up to ',', '}' or ']' */
		char *c = memchr(b->p + at, ':', b->n - at);
		if (!c)
			break;
		size_t v0 = (size_t)(c - b->p) + 1, v1 = v0;
		int depth = 0;
		while (v1 < b->n && (depth > 0 || (b->p[v1] != ',' && b->p[v1] != '}' && b->p[v1] != ']'))) {
			depth += b->p[v1] == '[' || b->p[v1] == '{';
			depth -= b->p[v1] == ']' || b->p[v1] == '}';
			v1++;
		}
		const char *t = json_tokens[below(s, sizeof json_tokens / sizeof *json_tokens)];
		size_t tn = strlen(t);
		if (b->n - (v1 - v0) + tn + 1 > cap)
			break;
		memmove(b->p + v0 + 1 + tn, b->p + v1, b->n - v1);
		b->p[v0] = ' ';
		memcpy(b->p + v0 + 1, t, tn);
		b->n = b->n - (v1 - v0) + 1 + tn;
		break;
	}
	}
}

/* state.json's text with file `name`'s size and checksums those of data. */
static char *forge_state(const Buf *state, const char *name, const Buf *data)
{
	cJSON *js = cJSON_ParseWithLength(state->p, state->n);
	const cJSON *fl = cJSON_GetObjectItemCaseSensitive(js, "files");
	for (const cJSON *f = cJSON_IsArray(fl) ? fl->child : NULL; f; f = f->next) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
		if (!cJSON_IsString(nm) || strcmp(nm->valuestring, name))
			continue;
		size_t nb = (data->n + ST_SUM_BLOCK - 1) / ST_SUM_BLOCK;
		char *hex = malloc(nb * 8 + 1);
		for (size_t k = 0; k < nb; k++) {
			size_t len = data->n - k * ST_SUM_BLOCK < ST_SUM_BLOCK ? data->n - k * ST_SUM_BLOCK
									  : ST_SUM_BLOCK;
			snprintf(hex + 8 * k, 9, "%08x", crc32c(0, data->p + k * ST_SUM_BLOCK, len));
		}
		hex[8 * nb] = '\0';
		cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)f, "bytes", cJSON_CreateNumber((double)data->n));
		cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)f, "crc32c", cJSON_CreateString(hex));
		free(hex);
	}
	char *text = js ? cJSON_Print(js) : NULL;
	cJSON_Delete(js);
	return text;
}

/* The tensors a load writes (the roots of every fill segment), as bytes. */
typedef struct {
	int n;
	int32_t id[256];
	size_t bytes[256];
	char *data[256];
} Snap;

static int snap_take(Ckpt *c, Snap *sn, RtErr *e)
{
	for (int cc = 0; cc < c->ncomp; cc++)
		for (int j = 0; j < c->nfill[cc]; j++) {
			int32_t id = c->fill[cc][j].root;
			int k = 0;
			while (k < sn->n && sn->id[k] != id)
				k++;
			if (k < sn->n)
				continue;
			if (sn->n == 256)
				return RT_FAIL(e, "more than 256 tensors");
			const DpTensor *t = &c->s->tensors[id];
			sn->id[k] = id;
			sn->bytes[k] = (size_t)exec_numel(t) * dp_dtype_size(t->dtype);
			sn->data[k] = malloc(sn->bytes[k] ? sn->bytes[k] : 1);
			if (!sn->data[k] || exec_tensor_read(c->x, id, sn->data[k], e))
				return -1;
			sn->n++;
		}
	return 0;
}

/* restore: write sn back into the tensors. Else: 0 when they hold sn,
 * 1 when not (*finite_only: whether every f32 value is finite), -1 error. */
static int snap_same(Ckpt *c, const Snap *sn, int restore, int *finite_only, RtErr *e)
{
	int same = 1;
	*finite_only = 1;
	for (int k = 0; k < sn->n; k++) {
		if (restore) {
			if (exec_tensor_write(c->x, sn->id[k], sn->data[k], e))
				return -1;
			continue;
		}
		char *now = malloc(sn->bytes[k] ? sn->bytes[k] : 1);
		if (!now || exec_tensor_read(c->x, sn->id[k], now, e)) {
			free(now);
			return -1;
		}
		same &= memcmp(now, sn->data[k], sn->bytes[k]) == 0;
		if (c->s->tensors[sn->id[k]].dtype == DP_F32)
			for (size_t i = 0; i + 4 <= sn->bytes[k]; i += 4) {
				float f;
				memcpy(&f, now + i, 4);
				*finite_only &= isfinite(f) != 0;
			}
		free(now);
	}
	return same ? 0 : 1;
}

static int init_hook(void *ctx, int name_id, int id, float *dst, RtErr *e)
{
	const DpStep *s = ctx;
	const DpTensor *t = &s->tensors[id];
	(void)e;
	init_fill(t->init, t->init_a, t->init_b, s->cfg.seed, dpstep_str(s, s->tensors[name_id].name),
		  t->init_base, exec_numel(t), dst);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: ckpt_fuzz STEP.bin [SECONDS [SEED]]\n");
		return 2;
	}
	double seconds = argc > 2 ? atof(argv[2]) : 10;
	uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1, s = seed;
	int provided;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	RtErr e = {.rank = 0};
	char err[1024];
	DpStep step;
	World w;
	Comm *comm = NULL;
	Exec x;
	Ckpt *c = NULL;
	if (world_init(&w, 60, &e)) {
		fprintf(stderr, "ckpt_fuzz: %s\n", e.msg);
		return 2;
	}
	if (dpstep_read_file(argv[1], &step, err, sizeof err)) {
		fprintf(stderr, "ckpt_fuzz: %s\n", err);
		return 2;
	}
	BackendOpts bo = {0};
	if (comm_mpi_init(&comm, step.cfg.mesh, exec_comm_masks(&step), NULL, 0, &e) ||
	    exec_init(&x, &step, comm, backend_cpu(), &bo, &e)) {
		fprintf(stderr, "ckpt_fuzz: %s\n", e.msg);
		return 2;
	}
	x.init_tensor = init_hook;
	x.hook_ctx = &step;
	if (exec_run(&x, DP_PROG_INIT, 1, &e) || ckpt_new(&c, &x, &w, argv[1], &e)) {
		fprintf(stderr, "ckpt_fuzz: %s\n", e.msg);
		return 2;
	}
	x.init_tensor = NULL;
	/* pseudo-random state: finite, second moments positive */
	for (int cc = 0; cc < c->ncomp; cc++) {
		Hosts h;
		if (ckpt_hosts_read(c, c->fill[cc], c->nfill[cc], &h, &e))
			return 2;
		for (int j = 0; j < c->nfill[cc]; j++)
			for (int64_t i = 0; i < c->fill[cc][j].n; i++) {
				float v = (float)((double)(next_rand(&s) >> 11) / 9007199254740992.0) - 0.25f;
				ckpt_host_of(&h, c->fill[cc][j].root)[c->fill[cc][j].at + i] = cc == 2 ? v * v : v;
			}
		for (int r = 0; r < h.n; r++)
			if (exec_tensor_write(&x, h.id[r], h.data[r], &e))
				return 2;
		ckpt_hosts_free(&h);
	}
	for (int i = 0; i < c->nrecast; i++)
		exec_run_kernel(&x, DP_PROG_INIT, c->recast[i], &e);
	Snap sn = {0};
	if (snap_take(c, &sn, &e))
		return 2;

	char base[4096];
	snprintf(base, sizeof base, "%s/ckpt_fuzz.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(base))
		return 2;
	Seed seeds[2];
	const char *forms[2] = {"full", "sharded"};
	for (int f = 0; f < 2; f++) {
		char dir[4200], path[4400];
		int64_t bytes;
		CkptRun run = {.step = 3, .loss = 1.5, .train_samples = 0};
		snprintf(dir, sizeof dir, "%s/%s", base, forms[f]);
		snprintf(path, sizeof path, "%s/step-000003", dir);
		if (mkdir(dir, 0777) ||
		    ckpt_save(c, dir, f ? CKPT_SHARDED : CKPT_FULL, &run, 0, NULL, &bytes, &e) ||
		    load_seed(&seeds[f], path)) {
			fprintf(stderr, "ckpt_fuzz: saving the %s checkpoint: %s\n", forms[f], e.msg);
			return 2;
		}
		CkptRun got;
		char *notes = NULL;
		int fo;
		snap_same(c, &sn, 1, &fo, &e);
		if (ckpt_load(c, path, &got, &notes, &e) || got.step != 3 || snap_same(c, &sn, 0, &fo, &e))
			FAIL("the unmutated %s checkpoint does not load back as saved: %s", forms[f], e.msg);
		free(notes);
	}

	long execs = 0, refused = 0, same = 0, forged_loads = 0;
	size_t cap = 0;
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < seeds[f].nfile; i++)
			cap = seeds[f].orig[i].n + 4096 > cap ? seeds[f].orig[i].n + 4096 : cap;
	Buf b = {malloc(cap), 0};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 >= seconds)
			break;
		Seed *sd = &seeds[below(&s, 2)];
		int fi = (int)below(&s, (size_t)sd->nfile), json = fi == 0;
		int forge = !json && below(&s, 3) == 0;
		memcpy(b.p, sd->orig[fi].p, sd->orig[fi].n);
		b.n = sd->orig[fi].n;
		int nm = 1 + (int)below(&s, 3);
		for (int k = 0; k < nm; k++)
			mutate(&b, cap, json, &s);
		if (b.n == sd->orig[fi].n && !memcmp(b.p, sd->orig[fi].p, b.n))
			continue;
		char path[4600];
		snprintf(path, sizeof path, "%s/%s", sd->dir, sd->name[fi]);
		char *forged = forge ? forge_state(&sd->orig[0], sd->name[fi], &b) : NULL;
		int wrc = spill(path, b.p, b.n);
		if (forged) {
			snprintf(path, sizeof path, "%s/state.json", sd->dir);
			wrc |= spill(path, forged, strlen(forged));
		}
		if (wrc) {
			fprintf(stderr, "ckpt_fuzz: cannot write %s\n", path);
			return 2;
		}
		int fo;
		snap_same(c, &sn, 1, &fo, &e);
		CkptRun got = {0};
		char *notes = NULL;
		RtErr le = {.rank = 0};
		int rc = ckpt_load(c, sd->dir, &got, &notes, &le);
		free(notes);
		execs++;
		if (rc) {
			refused++;
			if (!le.msg[0])
				FAIL("exec %ld: refused without a message", execs);
		} else {
			int diff = snap_same(c, &sn, 0, &fo, &e);
			if (forged) {
				forged_loads++;
				if (!fo)
					FAIL("exec %ld (%s, forged): a non-finite value loaded", execs, sd->name[fi]);
			} else if (diff || got.step != 3) {
				FAIL("exec %ld (%s of the %s checkpoint): loaded a different state silently "
				     "(step %llu)", execs, sd->name[fi], sd == &seeds[0] ? "full" : "sharded",
				     (unsigned long long)got.step);
			} else {
				same++;
			}
		}
		/* put the files back */
		snprintf(path, sizeof path, "%s/%s", sd->dir, sd->name[fi]);
		spill(path, sd->orig[fi].p, sd->orig[fi].n);
		if (forged) {
			snprintf(path, sizeof path, "%s/state.json", sd->dir);
			spill(path, sd->orig[0].p, sd->orig[0].n);
			free(forged);
		}
	}
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
	if (system(cmd) != 0)
		fprintf(stderr, "ckpt_fuzz: could not remove %s\n", base);
	printf("ckpt_fuzz: %ld execs in %.0f s (seed %llu): %ld refused, %ld accepted unchanged, %ld "
	       "forged loads (finite), %d failures\n", execs, seconds, (unsigned long long)seed,
	       refused, same, forged_loads, nfail);
	free(b.p);
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < seeds[f].nfile; i++)
			free(seeds[f].orig[i].p);
	for (int k = 0; k < sn.n; k++)
		free(sn.data[k]);
	ckpt_free(c);
	exec_free(&x);
	comm->ops->free(comm);
	dpstep_free(&step);
	MPI_Finalize();
	return nfail ? 1 : 0;
}
