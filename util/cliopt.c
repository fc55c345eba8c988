/*
 * cliopt.c - the message for a bad command-line option (util/cliopt.h).
 *
 * What getopt_long leaves behind: a long option's element is always consumed
 * (argv[optind - 1]), with optopt 0 when it is unknown or ambiguous and the
 * option's val when its value is missing or not allowed; a short option's
 * optopt is its character, and optind stays on its element while more
 * characters of a cluster (-vx) follow.
 */
#include <string.h>

#include "cliopt.h"
#include "suggest.h"

#define MAX_NAME 64

/* The name of a "--name[=value]" element into buf; its length. */
static size_t long_name(const char *arg, char *buf)
{
	size_t n = strcspn(arg + 2, "=");
	if (n >= MAX_NAME)
		n = MAX_NAME - 1;
	memcpy(buf, arg + 2, n);
	buf[n] = 0;
	return n;
}

/* The long option `name` abbreviates (getopt_long accepts unique prefixes):
 * an exact match, else the only one it prefixes; NULL when none, and *nmatch
 * says how many it prefixes. */
static const struct option *find_long(const struct option *longopts, const char *name,
				      int *nmatch)
{
	const struct option *found = NULL;
	size_t n = strlen(name);
	*nmatch = 0;
	for (const struct option *o = longopts; o->name; o++) {
		if (strcmp(o->name, name) == 0) {
			*nmatch = 1;
			return o;
		}
		if (n > 0 && strncmp(o->name, name, n) == 0) {
			found = o;
			++*nmatch;
		}
	}
	return *nmatch == 1 ? found : NULL;
}

static const char *closest_long(const struct option *longopts, const char *word)
{
	Suggest s;
	suggest_init(&s, word);
	for (const struct option *o = longopts; o->name; o++)
		suggest_try(&s, o->name);
	return suggest_best(&s);
}

static void unknown(FILE *out, const char *prog, const char *shown, const char *guess)
{
	if (guess)
		fprintf(out, "%s: error: unknown option '%s'; did you mean '--%s'?\n", prog, shown,
			guess);
	else
		fprintf(out, "%s: error: unknown option '%s' (see --help)\n", prog, shown);
}

void cli_bad_option(FILE *out, const char *prog, int c, int argc, char *const *argv,
		    const char *shortopts, const struct option *longopts)
{
	const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
	char name[MAX_NAME];

	if (strncmp(arg, "--", 2) == 0 && arg[2]) {
		long_name(arg, name);
		int nmatch;
		const struct option *o = find_long(longopts, name, &nmatch);
		if (optopt == 0 && nmatch > 1) {
			fprintf(out, "%s: error: option '--%s' is ambiguous:", prog, name);
			const char *sep = " ";
			for (const struct option *p = longopts; p->name; p++)
				if (strncmp(p->name, name, strlen(name)) == 0) {
					fprintf(out, "%s--%s", sep, p->name);
					sep = ", ";
				}
			fputc('\n', out);
			return;
		}
		if (optopt == 0 || !o) {
			char shown[MAX_NAME + 2];
			snprintf(shown, sizeof shown, "--%s", name);
			unknown(out, prog, shown, closest_long(longopts, name));
			return;
		}
		if (strchr(arg, '=') && o->has_arg == no_argument)
			fprintf(out, "%s: error: option '--%s' takes no value\n", prog, o->name);
		else
			fprintf(out, "%s: error: option '--%s' needs a value\n", prog, o->name);
		return;
	}

	/* a short option: its character is optopt */
	const char *spec = optopt > 0 && optopt != ':' ? strchr(shortopts, optopt) : NULL;
	if (spec && (c == ':' || spec[1] == ':')) {
		fprintf(out, "%s: error: option '-%c' needs a value\n", prog, optopt);
		return;
	}
	/* The element it came from: the current one while a cluster goes on.
	 * A word after one '-' (-steps) is likely a long option. */
	const char *elem = arg;
	if (optind < argc && argv[optind][0] == '-' && argv[optind][1] != '-' &&
	    strchr(argv[optind] + 1, optopt))
		elem = argv[optind];
	if (elem[0] == '-' && elem[1] != '-' && strlen(elem) > 2) {
		int nmatch;
		const struct option *o = find_long(longopts, elem + 1, &nmatch);
		const char *guess = o ? o->name : closest_long(longopts, elem + 1);
		if (guess) {
			unknown(out, prog, elem, guess);
			return;
		}
	}
	char shown[3] = {'-', (char)(optopt > 0x20 && optopt < 0x7f ? optopt : '?'), 0};
	unknown(out, prog, shown, NULL);
}
