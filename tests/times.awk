# tests/times.awk - the CPU seconds in lines of bash's `times` ("XmY.YYYs
# XmY.YYYs": user and system, the shell's line and then its children's):
# their sum over the lines given. tests/run.sh gives a suite's children's
# line; tests/lib.sh's case_clock both lines of the suite's shell.
{ for (i = 1; i <= 2; i++) { m = $i; sub(/m.*/, "", m); s = $i; sub(/.*m/, "", s); sub(/s$/, "", s); t += m * 60 + s } }
END { printf "%.3f\n", t }
