#!/usr/bin/env bash
# `make test-asan`: kiln's C harness and Rust FFI tests (which load the real
# libonnxruntime and run models through kiln) under valgrind's memcheck.
# Fails on an invalid read/write/free, a use of uninitialised memory or a
# definite leak whose stack has a kiln frame (valgrind/check_logs.py);
# ORT/glibc noise is suppressed (valgrind/kiln.supp) or ignored.
#
#   valgrind/test-asan.sh [cargo test name...]   default: c_harness ffi ffi_context ffi_share ffi_env_config ffi_lifetime
set -uo pipefail
cd "$(dirname "$0")/.."
TESTS=("$@")
[ ${#TESTS[@]} -eq 0 ] && TESTS=(c_harness ffi ffi_context ffi_share ffi_env_config ffi_lifetime)
LOGS=target/valgrind
rm -rf "$LOGS" && mkdir -p "$LOGS"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
# Every test binary runs under valgrind (cargo's runner); children too (the C
# programs), except the compiler that builds them.
RUNNER="valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --show-leak-kinds=definite \
--errors-for-leak-kinds=definite --num-callers=40 --keep-debuginfo=yes --suppressions=$PWD/valgrind/kiln.supp \
--trace-children=yes --trace-children-skip=*/cc,*/gcc,*/cc1,*/as,*/ld,*/collect2,*/ld.bfd,*/sh,*/bash \
--log-file=$PWD/$LOGS/vg.%p.log"
cargo build --release
start=$SECONDS
status=0
for t in "${TESTS[@]}"; do
    echo "test-asan: $t under valgrind"
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$RUNNER" \
        cargo test --release --test "$t" -- --test-threads=1 >"$LOGS/$t.out" 2>&1 || {
        echo "test-asan: $t failed under valgrind (see $LOGS/$t.out)"; tail -30 "$LOGS/$t.out"; status=1; }
    grep -E "^test result" "$LOGS/$t.out" | sed "s/^/  $t: /"
done
python3 valgrind/check_logs.py "$LOGS" || status=1
echo "test-asan: $((SECONDS - start))s"
exit $status
