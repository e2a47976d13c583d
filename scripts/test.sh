#!/usr/bin/env bash
# The whole test suite: a normal build and an ASan+UBSan build, each running every
# Criterion test through ctest. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
jobs=$(nproc)

echo "== build and test (optimised, with debug info)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test -j"$jobs" --output-on-failure

echo "== build and test (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
# Criterion's test workers exit 0 even when LeakSanitizer reports at exit, so every
# sanitizer report goes to a log file, and any log file fails the run.
logs="$PWD/build-asan/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
# tests/lsan.supp: leaks of the test framework itself (Criterion's runner), never Kiln's.
LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
ASAN_OPTIONS="detect_leaks=1:log_path=$logs/asan" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan" \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure
if [ -n "$(ls -A "$logs")" ]; then
  echo "sanitizer reports:" >&2
  cat "$logs"/* >&2
  exit 1
fi
echo "ASan+UBSan: no reports"
