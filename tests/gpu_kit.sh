#!/usr/bin/env bash
# tests/gpu_kit.sh - the GPU kit (mk/gpu-kit.mk, tools/gpu-kit, docs/CUDA.md
# "The GPU kit") builds, is self-contained, and its run.sh passes a
# rehearsal, here, without a GPU:
#
#  1. `make gpu-kit EMU=1` builds the kit around the CUDA emulator's
#     libdpcuda.so (the real kit is the same but for that library, built by
#     nvcc: GPU_KIT_REAL=1 builds and checks it too, minutes of nvcc), and it
#     says its size, at most 48 MiB (its payload packed with xz -0, not
#     the travelling kit's -6: a few seconds of CPU instead of a minute,
#     for a larger kit, which the 48 MiB bound then holds to more strictly,
#     and the same format for run.sh to unpack);
#  2. every ELF file of its payload resolves each library it needs inside
#     the kit (by its $ORIGIN DT_RPATH) or to the C runtime (libc, libm,
#     libpthread, libdl, librt, ld-linux, libstdc++, libgcc_s), libcuda.so.1,
#     and in the real kit CUDA 13's libcublasLt.so.13 and libnccl.so.2; with
#     the host's ldd, and with the chroot's own loader (below), where nothing
#     else exists;
#  3. the rehearsal: a chroot holding only libc6, libstdc++6, libgcc-s1,
#     bash and coreutils (and the libraries those two need to start:
#     libtinfo6, libacl1, libattr1, libselinux1, libpcre2-8-0, libgmp10),
#     unpacked with dpkg -x from their .debs (apt-get download, cached in
#     $DP_CHROOT_DEBS), with /proc, /sys, a /dev of its own and /tmp; the
#     kit copied in; `run.sh OUTDIR` run to its end. It must exit 0, with
#     every part reported and SKIP only for what needs the hardware or a GPU
#     tool (compute-sanitizer, ncu, nsys, PyTorch): exactly those twelve
#     checks.
#     No chroot (not root, or chroot/mount refused) or no .debs: one loud
#     SKIP.
# Runtime: ~15 s to pack the kit (xz -0), ~4-8 min for the rehearsal (the
# emulator runs run.sh's smallest shapes).
set -u
. "$(dirname "$0")/lib.sh"
cd "$ROOT" || exit 1
T=$(tmpdir)
RT=$T/root
mounted=()
cleanup() {
	local m
	for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null; done
	# nothing of the host may be mounted under $T when it is removed
	if grep -q " $T/" /proc/mounts; then
		echo "  (left $T: something is still mounted under it)"
	else
		rm -rf --one-file-system "$T"
	fi
}
trap cleanup EXIT
if [ "${SAN:-0}" = 1 ]; then
	skip "the GPU kit (SAN=1: the kit ships the ordinary build)"
	finish gpu_kit
	exit $?
fi

# ---- 1. the kit builds ----
# Cases (tests/lib.sh): kit-builds, real-kit (GPU_KIT_REAL=1), ldd,
# rehearsal; the emulator's kit is built once, by the first that needs it.
KIT=$T/kit
build_kit() {
if make -s -C "$ROOT" gpu-kit EMU=1 KIT_XZ=-0 KIT_DIR="$KIT" KIT_STAGE="$T/stage" >"$T/build.log" 2>&1; then
	ok "make gpu-kit EMU=1: $(cat "$KIT/SIZE")"
else
	fail "make gpu-kit EMU=1"; tail -n 10 "$T/build.log" | sed 's/^/      /'
	finish gpu_kit
	exit 1
fi
}
if case_on kit-builds; then
once kit build_kit
size=$(du -sb "$KIT" | cut -f1)
if [ "$size" -le $((48 * 1048576)) ] && grep -q "of 48 MiB" "$KIT/SIZE"; then
	ok "the kit is $size bytes, within 48 MiB (run.sh, busybox, payload.tar.xz, MANIFEST)"
else
	fail "the kit is $size bytes (more than 48 MiB, or it does not say its size)"
fi
# DP_KIT_PARTS (a rerun of some parts) refuses a part that does not exist
# before it unpacks or writes anything
DP_KIT_PARTS="2 10" bash "$KIT/run.sh" "$T/parts-out" >"$T/parts.log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "DP_KIT_PARTS: no part '10'" "$T/parts.log" && [ ! -e "$T/parts-out" ]; then
	ok "DP_KIT_PARTS=\"2 10\": $(head -n 1 "$T/parts.log"), exit 2, nothing written"
else
	fail "DP_KIT_PARTS=\"2 10\": exit $rc"; cat "$T/parts.log"
fi
fi
kits=("$KIT")
if [ "${GPU_KIT_REAL:-0}" = 1 ] && case_on real-kit; then
	if make -s -C "$ROOT" gpu-kit KIT_DIR="$T/kit-gpu" KIT_STAGE="$T/stage-gpu" >"$T/build-gpu.log" 2>&1; then
		ok "make gpu-kit (nvcc, sm_90a and sm_80): $(cat "$T/kit-gpu/SIZE")"
		kits+=("$T/kit-gpu")
	else
		fail "make gpu-kit"; tail -n 10 "$T/build-gpu.log" | sed 's/^/      /'
	fi
fi

# ---- 2. every ELF file resolves inside the kit or to the C runtime ----
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -A n -t x1 | tr -d ' ')" = 7f454c46 ]; }
allowed='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so\.1)'
# (the payload is checked as build.sh staged it, the tree it packed into
# payload.tar.xz (KIT_STAGE): the same files, without unpacking ~100 MB of
# xz again; the rehearsal's run.sh unpacks the payload itself, with the
# kit's busybox, in the chroot)
case_on ldd &&
for k in "${kits[@]}"; do
	once kit build_kit
	u=$T/stage
	[ "$k" = "$KIT" ] || u=$T/stage-gpu
	cuda=""
	[ "$(cat "$u/MODE")" = gpu ] && cuda='|^(libcublasLt\.so\.13|libnccl\.so\.2) '
	n=0 bad=0 norpath=0
	while IFS= read -r f; do
		is_elf "$f" || continue
		n=$((n + 1))
		objdump -p "$f" | grep -q 'RPATH.*\$ORIGIN' || { norpath=$((norpath + 1)); echo "      no \$ORIGIN RPATH: ${f#$u/}"; }
		while read -r lib arrow path _; do
			[ "$arrow" = "=>" ] || continue
			case $path in "$u"/*) continue ;; esac
			if ! echo "$lib " | grep -Eq "$allowed$cuda"; then
				bad=$((bad + 1))
				echo "      ${f#$u/}: $lib => $path"
			fi
		done < <(ldd "$f" 2>/dev/null)
	done < <(find "$u" -type f)
	if [ $bad = 0 ] && [ $norpath = 0 ] && [ $n -gt 100 ]; then
		ok "ldd: the $n ELF files of $(basename "$k") resolve inside the kit (\$ORIGIN DT_RPATH) or to the C runtime${cuda:+, libcuda, and CUDA 13: libcublasLt, libnccl}"
	else
		fail "ldd: $bad libraries of $(basename "$k") resolve outside the kit, $norpath files have no \$ORIGIN RPATH ($n ELF files)"
	fi
done

# ---- 3. the rehearsal in a chroot of bash and coreutils ----
rehearse() {
	case_on rehearsal || return 0
	once kit build_kit
	if [ "$(id -u)" != 0 ]; then
		skip "the chroot rehearsal (not root: chroot and mount need it)"; return
	fi
	local debs=${DP_CHROOT_DEBS:-/var/cache/dp-gpu-kit-chroot} p d missing=()
	local pkgs="libc6 libstdc++6 libgcc-s1 bash coreutils libtinfo6 libacl1 libattr1 libselinux1 libpcre2-8-0 libgmp10"
	mkdir -p "$debs"
	for p in $pkgs; do
		ls "$debs/${p}_"*.deb >/dev/null 2>&1 && continue
		(cd "$debs" && apt-get download -qq "$p" >/dev/null 2>&1) ||
			cp /var/cache/apt/archives/"${p}_"*.deb "$debs/" 2>/dev/null ||
			missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		skip "the chroot rehearsal: no .deb of ${missing[*]} (apt-get download failed; put them in $debs)"; return
	fi
	mkdir -p "$RT"
	for p in $pkgs; do
		d=$(ls "$debs/${p}_"*.deb | tail -n 1)
		dpkg -x "$d" "$RT" || { fail "dpkg -x $d"; return; }
	done
	mkdir -p "$RT"/{proc,sys,dev,tmp,out,etc,root}
	chmod 1777 "$RT/tmp"
	echo "root:x:0:0:root:/root:/bin/bash" >"$RT/etc/passwd"
	echo "root:x:0:" >"$RT/etc/group"
	printf '127.0.0.1 localhost %s\n' "$(uname -n)" >"$RT/etc/hosts"
	# the loader's paths, as a merged-/usr system has them
	[ -e "$RT/lib64" ] || ln -s usr/lib64 "$RT/lib64" 2>/dev/null
	if ! mount -t proc proc "$RT/proc"; then
		skip "the chroot rehearsal (mount refused here)"; return
	fi
	mounted+=("$RT/proc")
	mount -t sysfs sysfs "$RT/sys" && mounted+=("$RT/sys")
	mount -t tmpfs -o size=64m,mode=755 tmpfs "$RT/dev" && mounted+=("$RT/dev")
	for n in "null c 1 3" "zero c 1 5" "random c 1 8" "urandom c 1 9"; do
		set -- $n
		mknod -m 666 "$RT/dev/$1" "$2" "$3" "$4"
	done
	ln -s /proc/self/fd "$RT/dev/fd"
	mkdir -p "$RT/dev/shm"
	mount -t tmpfs -o size=1g tmpfs "$RT/dev/shm" && mounted+=("$RT/dev/shm")
	if ! chroot "$RT" /bin/bash -c 'echo ok' >/dev/null 2>&1; then
		skip "the chroot rehearsal (chroot refused, or bash does not start in it)"; return
	fi
	# what the chroot holds: no awk, sed, grep, tar, python, MPI or BLAS
	local extra
	extra=$(cd "$RT" && ls usr/bin/awk usr/bin/sed bin/grep usr/bin/grep bin/tar usr/bin/python3 usr/bin/mpirun 2>/dev/null)
	[ -z "$extra" ] || fail "the chroot holds $extra"
	cp -a "$KIT" "$RT/kit"
	# the payload's ELF files with the chroot's own loader: nothing but the kit
	# (the staged tree that build.sh packed: the ldd case says why)
	cp -a "$T/stage" "$RT/check"
	local nf=0 bad=0 f
	while IFS= read -r f; do
		is_elf "$f" || continue
		nf=$((nf + 1))
		if chroot "$RT" /lib64/ld-linux-x86-64.so.2 --list "/check/${f#$RT/check/}" 2>&1 | grep -q "not found"; then
			bad=$((bad + 1))
			chroot "$RT" /lib64/ld-linux-x86-64.so.2 --list "/check/${f#$RT/check/}" 2>&1 | grep "not found" |
				head -n 2 | sed "s|^|      ${f#$RT/check/}: |"
		fi
	done < <(find "$RT/check" -type f)
	rm -rf "$RT/check"
	if [ $bad = 0 ] && [ $nf -gt 100 ]; then
		ok "in the chroot, the loader resolves every library of the $nf ELF files"
	else
		fail "in the chroot, $bad of $nf ELF files have a library not found"
	fi
	local t0 rc took
	t0=$(date +%s)
	timeout 2400 chroot "$RT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C \
		/bin/bash /kit/run.sh /out >"$T/rehearsal.log" 2>&1
	rc=$?
	took=$(($(date +%s) - t0))
	cp "$RT/out/report.md" "$T/report.md" 2>/dev/null
	local np nf2 ns skips
	np=$(grep -c '^- PASS' "$T/report.md" 2>/dev/null)
	nf2=$(grep -c '^- FAIL' "$T/report.md" 2>/dev/null)
	ns=$(grep -c '^- SKIP' "$T/report.md" 2>/dev/null)
	skips=$(grep '^- SKIP' "$T/report.md" 2>/dev/null | grep -cvE 'compute-sanitizer|ncu|nsys|PyTorch|torch.compile')
	# PASS: part 1 one, part 2 six, part 4 ten (the emulator's: gpt2-tiny
	# f32 and llama bf16 in its five layouts), part 5 five (micro-batch 2,
	# again under DP_MULTI_TENSOR=off (the multi-tensor AdamW's A/B), again
	# with --gemm-tune into a file and once more from it, and the
	# larger DP_KIT_BIG_MB row at 4), part 6 two (the
	# CPU's trace, the device's), part 7 five (the emulator's four
	# comparisons and the determinism check), part 9 two (the calibration,
	# the validation's table)
	if [ $rc = 0 ] && [ "$nf2" = 0 ] && [ "$ns" = 12 ] && [ "$skips" = 0 ] && [ "$np" = 31 ] &&
		[ "$(grep -c '^## ' "$T/report.md")" = 9 ]; then
		ok "run.sh in the chroot: $(tail -n 1 "$T/rehearsal.log") (${took}s): $np PASS, SKIP only compute-sanitizer (4), ncu (4), nsys (1), PyTorch (3)"
	else
		fail "run.sh in the chroot: exit $rc after ${took}s, $np PASS, $nf2 FAIL, $ns SKIP ($skips not the GPU tools')"
		grep -E '^- (FAIL|SKIP)' "$T/report.md" 2>/dev/null | head -n 12 | cut -c1-220 | sed 's/^/      /'
		tail -n 5 "$T/rehearsal.log" | sed 's/^/      /'
	fi
	[ -f "$RT/out/logs.tgz" ] && [ -f "$RT/out/trace-gpt2.json" ] ||
		fail "run.sh left no logs.tgz or trace-gpt2.json in OUTDIR"
	if [ "${GPU_KIT_KEEP:-}" ]; then cp -r "$RT/out" "$GPU_KIT_KEEP" && echo "  (report and logs kept in $GPU_KIT_KEEP)"; fi
	sed 's/^/    /' "$T/report.md" 2>/dev/null | grep -E '^    - (PASS|FAIL|SKIP)' | cut -c1-200
}
rehearse
finish gpu_kit
