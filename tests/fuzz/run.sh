#!/usr/bin/env bash
# Fuzz the parsers that take input from outside the process, each for a
# bounded time, with libFuzzer under ASan and UBSan: the wire's frames, the
# catalogue's manifests, step indexes and object names, the object stores'
# XML, storage URLs and their options, and the config file. Prints TAP: one
# case per target; a crash, leak or sanitizer report fails it and leaves the
# input that did it under the work directory (printed).
#   run.sh SOURCE_ROOT BUILD_DIR SECONDS_PER_TARGET
set -uo pipefail
src=$1 build=$2 secs=$3
command -v clang >/dev/null || { echo "1..0 # SKIP clang (with libFuzzer) is not installed"; exit 0; }
gen=$build/proto/ckpt.pb-c.c
[ -f "$gen" ] || { echo "1..0 # SKIP no generated $gen (build the project first)"; exit 0; }
work=$(mktemp -d /tmp/ckpt-fuzz-XXXXXX)
keep=0
inc=(-I"$build" -I"$build/proto" -I"$src/proto" -I"$src/common" -I/usr/include/json-c)
for d in "$src"/daemon/*/; do inc+=(-I"$d"); done
cflags=(-g -O1 -D_GNU_SOURCE -std=gnu11 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
	-Wno-unused-command-line-argument)
objs=()
n=0
for f in "$src"/daemon/*/*.c "$src"/proto/wire.c "$src"/common/cudadrv.c "$gen"; do
	o=$work/obj$((n++)).o
	clang "${cflags[@]}" "${inc[@]}" -c "$f" -o "$o" 2>"$work/cc.log" &
	objs+=("$o")
	if (( n % 2 == 0 )); then wait; fi
done
wait
for o in "${objs[@]}"; do
	[ -f "$o" ] || { echo "1..1"; echo "not ok 1 - compiling the daemon for fuzzing: $(tail -3 "$work/cc.log" | tr '\n' ' ')"; exit 1; }
done
libs=(-lprotobuf-c -luv -lisal -linih -lsystemd -lcrypto -lcurl -lexpat -ljson-c -lpthread -ldl -lm)
targets=(frame manifest xml url config)
echo "1..${#targets[@]}"
i=0 bad=0
for t in "${targets[@]}"; do
	i=$((i + 1))
	exe=$work/fuzz_$t
	if ! clang "${cflags[@]}" -fsanitize=fuzzer "${inc[@]}" "$src/tests/fuzz/fuzz_$t.c" "${objs[@]}" "${libs[@]}" \
		-o "$exe" 2>"$work/link_$t.log"; then
		echo "not ok $i - fuzz_$t: does not build: $(tail -3 "$work/link_$t.log" | tr '\n' ' ')"
		bad=1; keep=1
		continue
	fi
	corpus=$work/corpus_$t
	mkdir -p "$corpus"
	[ -d "$src/tests/fuzz/corpus/$t" ] && cp "$src/tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null
	if (cd "$work" && ASAN_OPTIONS=detect_leaks=1 "$exe" -max_total_time="$secs" -rss_limit_mb=2048 \
		-max_len=65536 -print_final_stats=1 "$corpus" >"$work/run_$t.log" 2>&1); then
		runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/run_$t.log" | grep -o '[0-9]*$')
		echo "ok $i - fuzz_$t: ${runs:-?} inputs in ${secs} s, no crash, leak or sanitizer report"
	else
		echo "not ok $i - fuzz_$t: $(grep -m1 -E 'ERROR|SUMMARY|runtime error|deadly signal' "$work/run_$t.log")"
		echo "# input and log kept in $work (run_$t.log, crash-*)"
		bad=1; keep=1
	fi
done
[ $keep -eq 0 ] && rm -rf "$work"
exit $bad
