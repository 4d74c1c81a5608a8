#!/usr/bin/env bash
# Instructions per 0-byte message, stage by stage, for weft (embedded provider, one thread
# driving both ranks: weft-bench msgcost) and for Open MPI (vader, one process per side: the
# C multirate peer, pairwise, 1 pair), counted by callgrind in the measured loop only. Prints
# a markdown table (docs/BENCHMARKS.md, "CPU cost of a message: msgcost"), then the matching
# of the same loop with its receives posted late (`msgcost --late-receives`).
#
#   benches/stages.sh [path/to/weft-bench]
#
# Needs valgrind; the Open MPI column needs openmpi-bin libopenmpi-dev (skipped otherwise).
# Counts are deterministic for a given build: they do not move with the machine's load.
set -euo pipefail
BENCH=${1:-target/release/weft-bench}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# msgcost -w 128 -i 200: the measured run's 200 rounds and the warm-up run's 21 (-i / 10 + 1),
# both inside `rounds`, of 128 messages.
MSGS=$((128 * (200 + 200 / 10 + 1)))

# Inclusive instructions of every function whose name matches $2 in callgrind file $1.
incl() {
    callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
        awk -v pat="$2" '{ sub(/ \[[^]]*\]$/, "") } $0 ~ pat { gsub(",", "", $1); if ($1 + 0 > best) best = $1 + 0 } END { print best + 0 }'
}
per() { awk -v a="$1" -v n="$2" 'BEGIN { printf "%.0f", a / n }'; }

# The loop as users build it: `isend` and `irecv` inlined into it.
valgrind --tool=callgrind --callgrind-out-file="$DIR/built" --toggle-collect='weft_bench::msgcost::rounds*' \
    "$BENCH" msgcost -w 128 -i 200 --runs 1 --progress concurrent >/dev/null 2>&1
built=$(incl "$DIR/built" 'PROGRAM TOTALS')
# The loop as multirate builds it: the requests written into their vectors in place.
valgrind --tool=callgrind --callgrind-out-file="$DIR/into" --toggle-collect='weft_bench::msgcost::rounds*' \
    "$BENCH" msgcost -w 128 -i 200 --runs 1 --progress concurrent --into >/dev/null 2>&1
into=$(incl "$DIR/into" 'PROGRAM TOTALS')
# The stages: the same loop calling `isend` and `irecv` through functions of its own
# (`--outlined`), whose inclusive costs make the request stages.
valgrind --tool=callgrind --callgrind-out-file="$DIR/weft" --toggle-collect='weft_bench::msgcost::rounds*' \
    "$BENCH" msgcost -w 128 -i 200 --runs 1 --progress concurrent --outlined >/dev/null 2>&1
W="$DIR/weft"
total=$(incl "$W" 'PROGRAM TOTALS')
isend=$(incl "$W" 'msgcost.rs:weft_bench::msgcost::isend_call$')
tsend=$(incl "$W" 'transport/src/provider.rs:weft::progress::send::.*post_frame.*$')
irecv=$(incl "$W" 'msgcost.rs:weft_bench::msgcost::irecv_call$')
post=$(incl "$W" 'matching/mod.rs:weft::matching::MatchState::post_into$')
progress=$(incl "$W" 'engine/frames.rs:weft::engine::frames::.*progress_cri$')
handle=$(incl "$W" 'engine/frames.rs:weft::engine::frames::.*handle_frames$')
arrive=$(incl "$W" 'matching/mod.rs:weft::matching::MatchState::arrive(_at)?$')
finish=$(incl "$W" 'engine/frames.rs:weft::engine::frames::.*finish_match$')
wait=$(incl "$W" 'progress/wait.rs:weft::progress::wait::wait(_walked)?$')
take=$(incl "$W" 'request.rs:weft::request::Request<B>::take$')
# A taken request's drop is inlined into the loop; one that still holds an operation goes
# out of line to `release`.
drop_=$(( $(incl "$W" 'request.rs:<weft::request::Request<B> as core::ops::drop::Drop>::drop$') + $(incl "$W" 'request.rs:weft::request::Request<B>::release$') ))

echo "| stage | weft | what it covers |"
echo "|---|---|---|"
echo "| send request | $(per $((isend - tsend)) $MSGS) | \`isend\`: argument checks, CRI, sequence numbers, the request, less the transport |"
echo "| transport, send | $(per "$tsend" $MSGS) | the frame into the peer's inbox, the doorbell |"
echo "| receive request | $(per $((irecv - post)) $MSGS) | \`irecv\`: argument checks, operation, matching lock, the request, less the matching |"
echo "| matching | $(per $((post + arrive)) $MSGS) | posting the receive, pairing the arrived frame |"
echo "| transport, receive | $(per $((progress - handle)) $MSGS) | taking the frame from the inbox |"
# The pass's loop over its matches inlines the completion (`complete_match`): counted in
# the next row then; `finish_match` is what the other callers call.
if [ "$finish" -gt 0 ]; then completion=$(per "$finish" $MSGS); else completion="(in the pass)"; fi
echo "| completion | $completion | the receive's completion cell |"
echo "| progress, other | $(per $((wait - progress + handle - arrive - finish)) $MSGS) | the progress pass around the frames |"
# `take` inlines into the loop, as does a taken request's drop: counted in the rest then.
if [ $((take + drop_)) -gt 0 ]; then release=$(per $((take + drop_)) $MSGS); else release="(in the rest)"; fi
echo "| wait and release | $release | taking the result, dropping the requests |"
echo "| the rest, inlined into the loop | $(per $((total - isend - irecv - wait - take - drop_)) $MSGS) | \`wait_all\` around the progress pass, taking the results, request drops, the loop's buffer and request vectors |"
echo "| **all** | **$(per "$total" $MSGS)** | |"
echo "| **all, \`isend\` and \`irecv\` inlined into the loop (as built)** | **$(per "$built" $MSGS)** | |"
echo "| **all, the requests written in place (\`isend_into\`, \`irecv_into\`: \`msgcost --into\`, as multirate)** | **$(per "$into" $MSGS)** | |"

# The same loop with the receives posted once every frame has arrived (`--late-receives`):
# each frame queued as unexpected, then found by its receive.
valgrind --tool=callgrind --callgrind-out-file="$DIR/late" --toggle-collect='weft_bench::msgcost::rounds*' \
    "$BENCH" msgcost -w 128 -i 200 --runs 1 --progress concurrent --late-receives >/dev/null 2>&1
L="$DIR/late"
echo
echo "Receives posted late (\`msgcost --late-receives\`), per message:"
echo
echo "| stage | weft |"
echo "|---|---|"
echo "| matching, queueing the frame (\`arrive_at\`) | $(per "$(incl "$L" 'matching/mod.rs:weft::matching::MatchState::arrive(_at)?$')" $MSGS) |"
echo "| matching, the receive finding it (\`post_into\`) | $(per "$(incl "$L" 'matching/mod.rs:weft::matching::MatchState::post_into$')" $MSGS) |"
echo "| **all** | **$(per "$(incl "$L" 'PROGRAM TOTALS')" $MSGS)** |"

if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
    mpicc.openmpi -O2 -o "$DIR/multirate-mpi" benches/peers/multirate.c -lpthread
    # `ompi LEVEL`: the instructions of MPI_Isend, MPI_Irecv and the matching of an arrived
    # fragment, per message, with the peer asking for LEVEL (`needed`: MPI_THREAD_SINGLE
    # here; `multiple`: MPI_THREAD_MULTIPLE, the thread safety every weft rank has).
    ompi() {
        rm -f "$DIR"/ompi.*
        (cd "$DIR" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 \
            mpirun.openmpi --oversubscribe --bind-to none -np 2 valgrind --tool=callgrind \
            --callgrind-out-file="$DIR/ompi.%p" --toggle-collect=run_sender --toggle-collect=run_receiver \
            ./multirate-mpi pairwise process 1 0 128 200 0 "$1" >/dev/null 2>&1)
        # 200 timed and 10 warm-up iterations of 128 messages.
        local n=26880 s=0 r=0 m=0
        for f in "$DIR"/ompi.*; do
            s=$((s + $(incl "$f" 'PMPI_Isend$')))
            r=$((r + $(incl "$f" 'PMPI_Irecv$')))
            m=$((m + $(incl "$f" 'mca_pml_ob1_recv_frag_callback_match$')))
        done
        echo "$(per $s $n) $(per $r $n) $(per $m $n) $(per $((s + r + m)) $n)"
    }
    read -r s r m all <<<"$(ompi needed)"
    read -r ms mr mm mall <<<"$(ompi multiple)"
    echo
    echo "Open MPI 4.1.4 (vader, ob1), per message, the same way (\`benches/peers/multirate.c\`, 1 pair, one process per side), as its process mode runs (\`MPI_THREAD_SINGLE\`) and asked for \`MPI_THREAD_MULTIPLE\`:"
    echo
    echo "| stage | Open MPI | Open MPI, \`MPI_THREAD_MULTIPLE\` |"
    echo "|---|---|---|"
    echo "| \`MPI_Isend\` (request, match header, the fragment into the peer's FIFO) | $s | $ms |"
    echo "| \`MPI_Irecv\` (request, posting) | $r | $mr |"
    echo "| matching an arrived fragment and completing the receive (\`mca_pml_ob1_recv_frag_callback_match\`) | $m | $mm |"
    echo "| **these together** | **$all** | **$mall** |"
fi
