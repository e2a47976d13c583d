#!/usr/bin/env bash
# bench/chain.sh — how kiln's build time grows with the size of a model (issue 36: a chain
# of 10,000 small Linear layers builds in <= 60 s, 40,000 in <= 4x that). Writes a chain of
# N Linear(16, 16) layers with relu between them, a loss and a train section, and times
# `kiln emit` (Kiln's own passes and code generation) and `kiln build` (those plus the C
# compile and link) for each N.
#
#   bench/chain.sh                          N = 1000 2000 5000 10000 40000
#   SIZES="1000 2000" bench/chain.sh        other sizes
#   KILN=build/kiln bench/chain.sh          another kiln binary (default build/kiln)
#   bench/chain.sh --write N FILE           only write the model file for N layers
#
# Prints one line per N (wall seconds, `/usr/bin/time`-style max RSS of the build) and the
# per-pass times of `kiln build --time-passes` to out/bench-chain/N.passes. Every build is
# cold: its object cache is a fresh directory (a second run would otherwise read every
# piece from the cache).
set -euo pipefail

write_chain() { # N FILE
    {
        echo "# a chain of $1 Linear(16, 16) layers (bench/chain.sh)"
        echo "model chain"
        echo "layers = [Linear(16, 16) for $1]"
        echo "forward(x: f32[B, 16]) -> y {"
        echo "    for m in layers { x = relu(m(x)) }"
        echo "    y = x"
        echo "}"
        echo "loss(y) = mean(y * y)"
        echo "train {"
        echo "    optimizer = AdamW(lr = 1e-3)"
        echo "    batch     = 8"
        echo "}"
    } >"$2"
}

if [[ ${1:-} == --write ]]; then
    write_chain "$2" "$3"
    exit 0
fi
cd "$(dirname "$0")/.."

kiln=${KILN:-build/kiln}
sizes=${SIZES:-1000 2000 5000 10000 40000}
work=out/bench-chain
mkdir -p "$work"
echo "# bench/chain.sh, $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
printf '%8s %10s %10s %12s\n' layers "emit (s)" "build (s)" "build RSS (MB)"
for n in $sizes; do
    f=$work/chain$n.kiln
    write_chain "$n" "$f"
    t0=$(date +%s.%N)
    "$kiln" emit "$f" -o "$work/emit$n" >/dev/null 2>&1
    t1=$(date +%s.%N)
    rm -rf "$work/cache"
    XDG_CACHE_HOME="$PWD/$work/cache" /usr/bin/time -f '%M' -o "$work/rss$n" "$kiln" build "$f" -o "$work/prog$n" --time-passes >"$work/$n.passes" 2>&1
    t2=$(date +%s.%N)
    printf '%8d %10.2f %10.2f %12.0f\n' "$n" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$(echo "$(tail -1 "$work/rss$n") / 1024" | bc)"
done
