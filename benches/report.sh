#!/usr/bin/env bash
# The benchmarks of docs/BENCHMARKS.md, run with the commands the report shows: writes the
# plots (docs/plots/*.svg) and prints the report's tables as markdown on stdout.
#
# Run time on the 2-core VM: about 25 minutes of benchmarks (the longest: all-to-all with
# Open MPI, multirate with Open MPI beside, lock-regimes, pingpong), plus the release builds
# (about 8 minutes from a clean target directory, criterion's included). Run it on a quiet machine: every number
# is a rate or a time, and other work on the cores changes it.
#
#   benches/report.sh               the report's numbers (paste the output into BENCHMARKS.md)
#   benches/report.sh --quick       every benchmark with the fewest iterations, in about
#                                   two minutes: checks the script and the plots, not numbers
#                                   (its plots go to a temporary directory, not docs/plots)
#   benches/report.sh --out DIR     plots into DIR instead of docs/plots
#
# What the machine lacks is skipped with a line saying why, not failed: the libfabric
# benchmarks without an `ofi` build (Debian libfabric-dev, libclang-dev, pkg-config),
# the ping-pong without fi_pingpong (libfabric-bin), the Open MPI columns without
# mpicc/mpirun (openmpi-bin, libopenmpi-dev), instruction counts without valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

QUICK=0
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --out)
            OUT=${2:?--out needs a directory}
            shift
            ;;
        -h | --help)
            sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "report.sh: unknown option $1 (--quick, --out DIR)" >&2
            exit 2
            ;;
    esac
    shift
done
if [ -z "$OUT" ]; then
    # A quick run's plots are not the report's: they must not replace it.
    if [ "$QUICK" = 1 ]; then OUT=$(mktemp -d); else OUT=docs/plots; fi
fi
mkdir -p "$OUT"

export FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo
export CARGO_TERM_COLOR=never
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BENCH=$TARGET/release/weft-bench

# `q FULL QUICK`: the report's arguments, or the fewest that still run every code path.
q() {
    if [ "$QUICK" = 1 ]; then echo "$2"; else echo "$1"; fi
}

skip() {
    printf '_Skipped: %s_\n\n' "$*"
}

# `show TITLE COMMAND...`: prints the section title and the command as the report shows it
# (`weft-bench` for the binary).
show() {
    local title=$1
    shift
    printf '### %s\n\n```sh\n%s\n```\n\n' "$title" "$(echo "$*" | sed "s|$BENCH|weft-bench|")"
}

# Criterion's result lines (benchmark name, time, throughput), indented as a code block.
criterion_lines() {
    awk '/^[A-Za-z0-9_-]+\/[^ ]+/ || (/time:|thrpt:/ && !/%/) { printf "    %s\n", $0 }'
}

# `bench TITLE COMMAND...`: shows it, then runs it.
bench() {
    show "$@"
    shift
    "$@"
}

echo "# weft benchmark report"
echo
echo "Machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr), rustc $(rustc --version | cut -d' ' -f2)."
echo "Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)."
if [ "$QUICK" = 1 ]; then
    echo
    echo "**--quick: fewest iterations; these numbers are not measurements.**"
fi
echo
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" -v n="$(nproc)" 'BEGIN { exit !(l > n / 4) }'; then
    echo "report.sh: the machine is busy (load average $load on $(nproc) CPUs): the numbers will say more about the other work than about weft" >&2
fi

# Builds: the plain one always; the libfabric one (weft-bench with `ofi`, and weftrun,
# which the multi-process benchmarks launch) where libfabric is installed.
echo "report.sh: building (release)" >&2
cargo build --release -p weft-benches >&2
OFI=0
if pkg-config --exists libfabric 2>/dev/null; then
    if cargo build --release --workspace --bins --features weft-benches/ofi,weft-launcher/ofi >&2; then
        OFI=1
    else
        echo "report.sh: the ofi build failed; the libfabric benchmarks are skipped" >&2
    fi
fi
NO_OFI="weft-bench was built without the ofi feature (libfabric not found by pkg-config; Debian libfabric-dev, libclang-dev, pkg-config)"
HAVE_MPI=0
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then HAVE_MPI=1; fi
# `--peer openmpi` where Open MPI is installed.
PEER=""
if [ "$HAVE_MPI" = 1 ]; then PEER="--peer openmpi"; fi
HAVE_FI_PINGPONG=0
if command -v fi_pingpong >/dev/null; then HAVE_FI_PINGPONG=1; fi

echo "## Message rate: multirate"
echo
bench "Thread mode against process mode, embedded provider, Open MPI beside" \
    "$BENCH" multirate -t 1,2,4,8 --mode thread,process $(q "-i 1000 --runs 3" "-i 20 --runs 1") $PEER \
    --markdown --plot "$OUT/multirate.svg"
if [ -n "$PEER" ]; then
    bench "The price of thread safety: Open MPI's one-thread-a-rank rows also with MPI_THREAD_MULTIPLE" \
        "$BENCH" multirate -t 1 --mode thread,process $(q "-i 2000 --runs 9" "-i 20 --runs 1") $PEER --peer-multiple --markdown
    if [ "$OFI" = 1 ]; then
        bench "The same on shm" \
            "$BENCH" multirate --provider shm -t 1,2 --mode thread,process $(q "-i 2000 --runs 9" "-i 10 --runs 1") $PEER \
            --peer-multiple --markdown
    fi
fi
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
    bench "Thread mode against process mode, embedded provider, MPICH beside" \
        "$BENCH" multirate -t 1,2,4 --mode thread,process $(q "-i 1000 --runs 3" "-i 20 --runs 1") --peer mpich --markdown
else
    skip "multirate against MPICH: mpicc.mpich or mpirun.mpich not found (Debian mpich libmpich-dev)"
fi
bench "Hybrid mode" \
    "$BENCH" multirate -t 4,8 --mode thread,hybrid-2,process $(q "-i 1000 --runs 3" "-i 20 --runs 1") --markdown
bench "Progress modes" \
    "$BENCH" multirate -t 1,2,4,8 --mode thread,process --progress global,owner,concurrent $(q "-i 1000 --runs 3" "-i 10 --runs 1") \
    --markdown --plot "$OUT/multirate-progress.svg"
bench "Communicator per pair (-c), no Tag::Any (--no-any-tag)" \
    "$BENCH" multirate -t 2,4,8 --mode thread,process -c $(q "-i 1000 --runs 5" "-i 20 --runs 1") --markdown
"$BENCH" multirate -t 2,4,8 --mode thread,process --no-any-tag $(q "-i 1000 --runs 5" "-i 20 --runs 1") --markdown
if [ "$OFI" = 1 ]; then
    bench "Thread mode against process mode, shm (one process per rank), Open MPI beside" \
        "$BENCH" multirate --provider shm -t 1,2,4 --mode thread,process $(q "-i 1000 --runs 3" "-i 10 --runs 1") $PEER \
        --markdown --plot "$OUT/multirate-shm.svg"
    bench "The same through libfabric alone" \
        "$BENCH" multirate --provider ofi-shm -t 1,2,4 --mode thread,process $(q "-i 200 --runs 3" "-i 10 --runs 1") \
        --markdown
else
    skip "multirate on shm: $NO_OFI"
fi

echo "## CPU cost of a message: msgcost"
echo
bench "Time per message, both sides, one thread" \
    "$BENCH" msgcost $(q "-i 20000 --runs 5" "-i 200 --runs 1") --markdown
if command -v valgrind >/dev/null; then
    MSGS=$(q 256000 25600)
    bench "Instructions per message (callgrind, $MSGS messages)" \
        valgrind --tool=callgrind --callgrind-out-file=/tmp/weft-msgcost.callgrind "$BENCH" msgcost --progress concurrent -w 128 \
        $(q "-i 2000" "-i 200") --runs 1 --csv >/dev/null 2>/tmp/weft-msgcost.valgrind
    total=$(awk '/^summary:/ { print $2 }' /tmp/weft-msgcost.callgrind)
    echo "Instructions: $total in all, $((total / MSGS)) per message (the whole process: start-up, warm-up run and both sides)."
    echo
    show "Stage by stage, against Open MPI (callgrind)" benches/stages.sh "$BENCH"
    benches/stages.sh "$BENCH"
    echo
else
    skip "instructions per message: valgrind not found (Debian valgrind)"
fi

echo "## Latency: pingpong"
echo
if [ "$OFI" = 0 ]; then
    skip "pingpong: $NO_OFI"
elif [ "$HAVE_FI_PINGPONG" = 0 ]; then
    skip "pingpong: fi_pingpong not found (Debian libfabric-bin)"
else
    bench "One-way latency against fi_pingpong, shm and tcp" \
        "$BENCH" pingpong --provider shm,tcp -s 8,1024 $(q "-i 20000 --runs 3" "-i 200 --runs 1") \
        --markdown --plot "$OUT/pingpong.svg"
    bench "The same through libfabric alone" \
        "$BENCH" pingpong --provider shm -s 8,1024 $(q "-i 20000 --runs 3" "-i 200 --runs 1") --no-same-host-lane --markdown
fi

echo "## All-to-all"
echo
if [ "$OFI" = 0 ]; then
    skip "alltoall: $NO_OFI"
else
    MPI=""
    if [ "$HAVE_MPI" = 1 ]; then
        MPI=--openmpi
    else
        skip "the Open MPI columns: mpicc or mpirun not found (Debian openmpi-bin libopenmpi-dev)"
    fi
    bench "Round time against Open MPI, shm" \
        "$BENCH" alltoall --provider shm -n 2,4,8 -s 1024,16384,65536 $(q "-r 500 --runs 3" "-r 2 --warmup 1 --runs 1") \
        $MPI --markdown --plot "$OUT/alltoall.svg"
    bench "Round time against Open MPI, tcp" \
        "$BENCH" alltoall --provider tcp -n 2,4,8 -s 1024,16384,65536 $(q "-r 500 --runs 3" "-r 2 --warmup 1 --runs 1") \
        $MPI --markdown
fi

echo "## Locks"
echo
bench "Contended throughput against std and parking_lot" \
    "$BENCH" locks -t 1,2,4,8,16 $(q "--millis 200 --runs 3" "--millis 5 --runs 1") --markdown --plot "$OUT/locks.svg"
CRITERION=$(q "--quick" "--quick --warm-up-time 0.05 --measurement-time 0.1")
show "Uncontended acquire and release (criterion)" cargo bench -p weft-benches --bench locks -- $CRITERION
cargo bench -q -p weft-benches --bench locks -- $CRITERION 2>/dev/null | criterion_lines
echo
bench "The progress-path lock inside the runtime: latency and throughput regimes" \
    "$BENCH" lock-regimes -t 1,2,4,8 $(q "-i 300 --runs 3" "-i 5 --runs 1") --markdown --plot "$OUT/lock-regimes.svg"

echo "## Executor, packing, sync objects"
echo
bench "Spawn and yield against tokio" \
    "$BENCH" spawn -w 1,2 $(q "--runs 5" "--tasks 10000 --rounds 2000 --runs 1") --markdown
bench "Parallel packing" \
    "$BENCH" pack -d vector,indexed,contiguous -s 1048576,16777216 -t 1,2 $(q "--runs 21" "--runs 1") \
    --markdown --plot "$OUT/pack.svg"
bench "Sync object against a test loop" \
    "$BENCH" sync-pingpong $(q "--runs 5" "-i 200 --runs 1") --markdown
CRITERION=$(q "--warm-up-time 1 --measurement-time 3" "--warm-up-time 0.05 --measurement-time 0.1")
show "Sync object micro-benchmarks (criterion)" cargo bench -p weft-benches --bench sync_object -- $CRITERION
cargo bench -q -p weft-benches --bench sync_object -- $CRITERION 2>/dev/null | criterion_lines
echo
bench "Idle runtime" \
    "$BENCH" idle --ranks 2 --provider embedded $(q "--seconds 3" "--seconds 0.2") --markdown
if [ "$OFI" = 1 ]; then
    # `cargo bench` above rebuilt weft-bench without the feature.
    cargo build --release --workspace --bins --features weft-benches/ofi,weft-launcher/ofi >&2
    "$BENCH" idle --ranks 2 --provider shm $(q "--seconds 3" "--seconds 0.2") --markdown
    "$BENCH" idle --ranks 2 --provider tcp $(q "--seconds 3" "--seconds 0.2") --markdown
fi
bench "Neighbor message rate: borrowed against counted communicator references" \
    "$BENCH" neighbor -t 1,2,4,8 --comm world,dup $(q "-i 2000 --runs 5" "-i 20 --runs 1") --markdown --plot "$OUT/neighbor.svg"
bench "Communicator creation from many threads: eager against base context ids" \
    "$BENCH" ctxid -t 1,2,4,8 $(q "--creations 2000" "--creations 50") --markdown
show "Embedded inbox against crossbeam's ArrayQueue" cargo test -p weft-transport --release --lib ring::tests::stream -- --ignored --nocapture
cargo test -q -p weft-transport --release --lib ring::tests::stream -- --ignored --nocapture 2>/dev/null | awk '/ns\/item/ { printf "    %s\n", $0 }'
echo

echo "Plots: $(cd "$OUT" && ls -- *.svg | tr '\n' ' ')"

if [ "$OFI" = 1 ]; then
    echo "## Start-up"
    echo
    LAUNCHERS=weftrun
    if cargo build --release --workspace --bins --features weft-benches/pmix,weft-launcher/ofi >&2; then LAUNCHERS=weftrun,mpirun; fi
    bench "Start-up at 2-64 ranks" \
        "$BENCH" startup -n $(q "2,4,8,16,32,64" "2,4") --launcher "$LAUNCHERS" $(q "--runs 3" "--runs 1") $PEER \
        --markdown --plot "$OUT/startup.svg"
    echo "## Collectives"
    echo
    bench "Latency against Open MPI, shm" \
        "$BENCH" coll --provider shm -n 2,4,8 -s 8,1048576 -c allreduce,bcast $(q "-i 2000 --warmup 200 --runs 3" "-i 5 --warmup 1 --runs 1") \
        --openmpi "$([ "$HAVE_MPI" = 1 ] && echo yes || echo no)" --markdown --plot "$OUT/coll.svg"
else
    skip "startup and coll: $NO_OFI"
fi
echo "## Requests for task runtimes"
echo
bench "Continuations" \
    "$BENCH" continuations -t 1,2,4 -n 1,100,10000 $(q "" "--messages 200") --markdown --plot "$OUT/continuations.svg"
bench "Continuations, the sender paced below what every mode completes" \
    "$BENCH" continuations --mode inline,sync -t 1,2,4 -n 10000 --rate 1000000 $(q "" "--messages 200") --markdown
bench "Partitioned sends" \
    "$BENCH" partitioned --provider "$([ "$OFI" = 1 ] && echo embedded,shm || echo embedded)" -t 1,2,4,8 -s $(q "65536,1048576,16777216" "65536") $(q "" "--rounds 1") --markdown --plot "$OUT/partitioned.svg"
echo "## Distributed locks"
echo
bench "The seed's benchmarks, in-process ranks on a simulated machine" \
    "$BENCH" dlock --bench lb,ecsb,sob,wcsb,warb --ranks 4,16,64,256 --levels 4,4 --level-cost-ns 1000,2000 $(q "--ops 200" "--ops 5") --markdown --plot "$OUT/dlock.svg"
"$BENCH" dlock --bench lb --lock d-mcs,rma-mcs,fompi-spin --ranks 16,64,256 --levels 4,4 --level-cost-ns 1000,2000 $(q "--ops 300" "--ops 5") --markdown
"$BENCH" dlock --bench ecsb,sob --lock rma-rw,fompi-rw --writers 0.002 --ranks 16,64,256 --levels 4,4 --level-cost-ns 1000,2000 $(q "--ops 300" "--ops 5") --markdown
"$BENCH" dlock --bench lb --ranks $(q 1024 64) --levels 16,8 --level-cost-ns 1000,2000 --ops 5 --markdown
if [ "$OFI" = 1 ]; then
    bench "The seed's benchmarks, ranks as processes on shm" \
        "$BENCH" dlock --provider shm --launch weftrun --bench lb,ecsb --ranks $(q "2,4,8,16" "2") $(q "" "--ops 5") --markdown --plot "$OUT/dlock-procs.svg"
else
    skip "dlock across processes: $NO_OFI"
fi
bench "The distributed hash table" \
    "$BENCH" dht --ranks 4,8 --writers 0.002,0.2 --access one,spread $(q "--ops 20000" "--ops 20") --markdown
