#!/usr/bin/env bash
# tools/gpu-kit/build.sh - assembles the GPU kit (mk/gpu-kit.mk runs it;
# docs/CUDA.md, "The GPU kit"): everything the first run on a bare CUDA
# machine needs, in one folder that travels to it and runs there with
# `run.sh OUTDIR`.
#
#   KIT=build/gpu-kit STAGE=build/gpu-kit.stage MODE=gpu|emu CUDA_SO=... \
#   DPC=... DPEXEC=... TEXT2SHARD=... [XZ_LEVEL=-6] bash tools/gpu-kit/build.sh
#
# XZ_LEVEL is the payload's xz preset: -6 by default (the kit that travels);
# tests/gpu_kit.sh's rehearsal packs with -0 (the emulator's payload, 101 MB
# unpacked, at a load of ~30: -0 8.1 CPU-s and 25.3 MB, -1 13.5 CPU-s and
# 20.5 MB; -6 about a minute: the same format to unpack).
#
# The kit (KIT, at most 48 MiB):
#   run.sh          the run (tools/gpu-kit/run.sh)
#   busybox         a static busybox (Debian's busybox-static): run.sh's
#                   tar, xz, awk, sed and grep on a machine that may have
#                   none of them (the rehearsal chroot has bash and
#                   coreutils alone)
#   payload.tar.xz  the tree below, which run.sh unpacks outside OUTDIR
#   MANIFEST        every file of the payload with its size, and the sizes
# The payload (STAGE, unpacked):
#   bin/            dpc, dpexec, libdpcuda.so beside dpexec (the real one
#                   for sm_90a and sm_80 with -lineinfo, or the emulator's
#                   with MODE=emu), mpirun and orted (Open MPI's orterun)
#   lib/            every shared library those need that a bare CUDA machine
#                   lacks (OpenBLAS, oneDNN, SLEEF, cJSON, zlib, libgomp,
#                   libgfortran, Open MPI and its PMIx, hwloc, libevent ...),
#                   lib/openmpi the Open MPI components whose libraries are
#                   all here (not the InfiniBand, UCX, libfabric, PSM or
#                   OpenSHMEM ones), lib/pmix PMIx's
#   share/          Open MPI's and PMIx's help texts
#   models/, data/  models/*.dp; byte-level token shards of Debian's license
#                   texts (text2shard)
#   bench/gpu_gpt.py  the PyTorch anchor
#   MODE            gpu or emu
# Every ELF file finds its libraries through a DT_RPATH relative to
# $ORIGIN (patchelf), never through the system: bin/ '$ORIGIN/../lib',
# lib/ '$ORIGIN', the components '$ORIGIN/..'. What it may take from the
# machine: the C runtime (libc, libm, libpthread, libdl, librt, ld-linux,
# libstdc++, libgcc_s), the driver's libcuda.so.1, and (MODE=gpu) CUDA 13's
# libcublasLt.so.13 and libnccl.so.2, which are not bundled (517 and 208 MB
# here; the machine has CUDA 13: run.sh finds them and reports their
# versions). tests/gpu_kit.sh checks all of this with ldd.
set -euo pipefail
: "${KIT:?}" "${STAGE:?}" "${MODE:?}" "${CUDA_SO:?}" "${DPC:?}" "${DPEXEC:?}" "${TEXT2SHARD:?}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIMIT_MIB=${KIT_LIMIT_MIB:-48}
PATCHELF=${PATCHELF:-patchelf}
MPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi/lib
MPI_COMPONENTS=$MPI_LIB/openmpi3
PMIX_ROOT=/usr/lib/x86_64-linux-gnu/pmix2

die() { echo "gpu-kit: error: $*" >&2; exit 1; }
command -v "$PATCHELF" >/dev/null || die "patchelf is needed (apt-get install patchelf)"
for f in "$DPC" "$DPEXEC" "$TEXT2SHARD" "$CUDA_SO"; do [ -f "$f" ] || die "$f is not built"; done
[ -x /usr/bin/orterun ] && [ -d "$MPI_COMPONENTS" ] || die "Open MPI 4 (openmpi-bin) is needed"

# a static busybox: the installed one if static, else Debian's package
BUSYBOX=${BUSYBOX:-}
if [ -z "$BUSYBOX" ]; then
	for b in /bin/busybox /usr/bin/busybox; do
		if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then BUSYBOX=$b; break; fi
	done
fi
if [ -z "$BUSYBOX" ]; then
	deb=$(ls /var/cache/apt/archives/busybox-static_*_amd64.deb 2>/dev/null | tail -n 1 || true)
	[ -n "$deb" ] || die "a static busybox is needed (apt-get install busybox-static)"
	bbdir=$(mktemp -d) # not under build/: the Makefile includes every *.d there
	trap 'rm -rf "$bbdir"' EXIT
	dpkg -x "$deb" "$bbdir"
	BUSYBOX=$bbdir/bin/busybox
fi

# What the machine provides: the C runtime, the driver, CUDA 13's libraries.
is_system() {
	case $1 in
	linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | \
		librt.so.* | libstdc++.so.* | libgcc_s.so.* | libcuda.so.*) return 0 ;;
	libcublasLt.so.13 | libnccl.so.2) [ "$MODE" = gpu ] ;;
	*) return 1 ;;
	esac
}

rm -rf "$STAGE" "$KIT"
mkdir -p "$STAGE"/{bin,lib/openmpi,lib/pmix,share/openmpi,share/pmix,models,data,bench} "$KIT"
cp "$DPC" "$DPEXEC" "$STAGE/bin/"
cp "$CUDA_SO" "$STAGE/bin/libdpcuda.so"
cp /usr/bin/orterun "$STAGE/bin/mpirun"
cp /usr/bin/orted "$STAGE/bin/orted"
cp /usr/share/openmpi/*.txt "$STAGE/share/openmpi/"
cp "$PMIX_ROOT"/share/pmix/*.txt "$STAGE/share/pmix/" 2>/dev/null || true
cp "$PMIX_ROOT"/lib/pmix/*.so "$STAGE/lib/pmix/"

# bundle NAME PATH: a library under its soname (the file, not the link)
bundle() {
	[ -f "$STAGE/lib/$1" ] || cp -L "$2" "$STAGE/lib/$1"
}
# needs FILE: the sonames FILE names (DT_NEEDED)
needs() {
	objdump -p "$1" | sed -n 's/^ *NEEDED *//p'
}
# close over FILES...: bundle every library they need, transitively, found
# where this machine's loader finds it
close_over() {
	local todo=("$@") f n path
	while [ ${#todo[@]} -gt 0 ]; do
		f=${todo[0]}
		todo=("${todo[@]:1}")
		for n in $(needs "$f"); do
			is_system "$n" && continue
			[ -f "$STAGE/lib/$n" ] && continue
			path=$(ldd "$f" | sed -n "s|^[[:space:]]*$n => \(/[^ ]*\).*|\1|p" | head -n 1)
			[ -z "$path" ] && path=$(ls "$MPI_LIB/$n" "$PMIX_ROOT/lib/$n" 2>/dev/null | head -n 1)
			[ -n "$path" ] || die "$f needs $n, which this machine does not have"
			bundle "$n" "$path"
			todo+=("$STAGE/lib/$n")
		done
	done
}
close_over "$STAGE"/bin/* "$STAGE"/lib/pmix/*.so
# Open MPI's components: those whose every library is now in lib/ or the
# C runtime (the transports that need InfiniBand, UCX, libfabric, PSM,
# netlink or OpenSHMEM stay out: the kit runs ranks of one node over shared
# memory, mpirun launches them with fork; run.sh selects what to use)
# satisfied FILE: every library FILE needs is the machine's or in the kit
satisfied() {
	local n
	for n in $(needs "$1"); do
		is_system "$n" || [ -f "$STAGE/lib/$n" ] || return 1
	done
}
skipped=()
for c in "$MPI_COMPONENTS"/mca_*.so; do
	# Open MPI's own helper libraries (libmca_common_sm ...) come along
	# when theirs are satisfied
	for n in $(needs "$c"); do
		case $n in libmca_common_*) ;; *) continue ;; esac
		path=$(ldd "$c" | sed -n "s|^[[:space:]]*$n => \(/[^ ]*\).*|\1|p" | head -n 1)
		if [ -n "$path" ] && [ ! -f "$STAGE/lib/$n" ] && satisfied "$path"; then
			bundle "$n" "$path"
		fi
	done
	if satisfied "$c"; then cp "$c" "$STAGE/lib/openmpi/"; else skipped+=("$(basename "$c" .so)"); fi
done
# DT_RPATH (not RUNPATH): also for the libraries a library loads
for f in "$STAGE"/bin/*; do
	if [ "$(basename "$f")" = libdpcuda.so ] && [ "$MODE" = gpu ]; then
		"$PATCHELF" --force-rpath --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64' "$f"
	else
		"$PATCHELF" --force-rpath --set-rpath '$ORIGIN/../lib' "$f"
	fi
done
for f in "$STAGE"/lib/*.so*; do "$PATCHELF" --force-rpath --set-rpath '$ORIGIN' "$f"; done
for f in "$STAGE"/lib/openmpi/*.so "$STAGE"/lib/pmix/*.so; do
	"$PATCHELF" --force-rpath --set-rpath '$ORIGIN/..' "$f"
done

# models, data, the anchor
cp "$ROOT"/models/*.dp "$STAGE/models/"
"$TEXT2SHARD" -o "$STAGE/data/text.bin" --val "$STAGE/data/val.bin" --val-frac 0.1 \
	/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 \
	/usr/share/common-licenses/LGPL-3 /usr/share/common-licenses/LGPL-2.1 \
	/usr/share/common-licenses/Apache-2.0 /usr/share/common-licenses/MPL-2.0 \
	/usr/share/common-licenses/GFDL-1.3 /usr/share/common-licenses/Artistic >"$STAGE/data/shard.log"
cp "$ROOT/bench/gpu_gpt.py" "$STAGE/bench/"
echo "$MODE" >"$STAGE/MODE"

# the kit: run.sh, busybox, the payload, the manifest
cp "$ROOT/tools/gpu-kit/run.sh" "$KIT/run.sh"
chmod +x "$KIT/run.sh"
cp "$BUSYBOX" "$KIT/busybox"
tar -C "$STAGE" -cf - . | xz -T1 "${XZ_LEVEL:--6}" >"$KIT/payload.tar.xz"
stage_b=$(du -sb "$STAGE" | cut -f1)
{
	echo "dp GPU kit ($MODE): made $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
	echo "payload: $stage_b bytes unpacked, $(stat -c %s "$KIT/payload.tar.xz") bytes as payload.tar.xz"
	echo "Open MPI components left out (their libraries are not in the kit): ${skipped[*]}"
	echo
	(cd "$STAGE" && find . -type f -printf '%s\t%p\n' | sort -k2)
} >"$KIT/MANIFEST"
kit_b=$(du -sb "$KIT" | cut -f1)
mib=$(( (kit_b + 1048575) / 1048576 ))
echo "$kit_b bytes ($mib MiB, of $LIMIT_MIB MiB): $KIT ($MODE; payload $stage_b bytes unpacked)" | tee "$KIT/SIZE"
[ "$kit_b" -le $((LIMIT_MIB * 1048576)) ] || die "the kit is $kit_b bytes, over $LIMIT_MIB MiB"
