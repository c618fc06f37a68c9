#!/usr/bin/env bash
# Runs kiln's fuzz targets, each for FUZZ_SECONDS, one at a time (one core).
# A crash, timeout or OOM input is copied to fuzz/regressions/<target>/ (which
# `make test` replays) and fuzzing goes on until the time is used.
#
#   fuzz/run.sh [target...]       default: every target
#   FUZZ_SECONDS=600 FUZZ_SANITIZER=address fuzz/run.sh node_import
#
# No nightly toolchain is needed: cargo-fuzz builds with the stable compiler
# and RUSTC_BOOTSTRAP=1. FUZZ_SANITIZER: none (default, fastest) or address.
set -uo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
SANITIZER=${FUZZ_SANITIZER:-none}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(context_binary ep_context_attrs node_import)
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p logs
status=0
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus-new/$t" "regressions/$t" "artifacts/$t"
    # Build first, so FUZZ_SECONDS is time spent fuzzing.
    cargo fuzz build --sanitizer "$SANITIZER" -O "$t" >"logs/$t.build.log" 2>&1 ||
        { echo "fuzz: cannot build $t, see fuzz/logs/$t.build.log"; status=1; continue; }
    end=$((SECONDS + SECONDS_PER_TARGET))
    while [ $SECONDS -lt $end ]; do
        left=$((end - SECONDS))
        log="logs/$t.$(date +%s).log"
        echo "fuzz: $t for ${left}s (sanitizer $SANITIZER), log fuzz/$log"
        # New inputs go to corpus-new/ (not committed); corpus/ is the seed set.
        # The binary is run directly: `cargo fuzz run` rebuilds in debug mode
        # after a crash just to print the input.
        "target/x86_64-unknown-linux-gnu/release/$t" "corpus-new/$t" "corpus/$t" \
            -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="artifacts/$t/" >"$log" 2>&1
        rc=$?
        grep -E "^(stat::|Done)" "$log" | sed "s/^/  $t: /"
        new=0
        for a in artifacts/"$t"/*; do
            [ -f "$a" ] || continue
            cp "$a" "regressions/$t/$(basename "$a")" && rm "$a" && new=1
            echo "fuzz: $t: new regression input fuzz/regressions/$t/$(basename "$a")"
        done
        if [ $rc -ne 0 ]; then
            status=1
            [ $new -eq 1 ] || { echo "fuzz: $t failed (rc $rc) without an artifact; see fuzz/$log"; break; }
        fi
    done
done
exit $status
