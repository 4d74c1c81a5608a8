//! Criterion benchmarks of the sync object (`MPIX_Sync`, [Patinyasakdikul 2019, §4.6.1]).
//!
//! * `sync_object/round_trip`: attach + complete + query on one object, one thread, with the
//!   cell recycled by `reset` (the request-pool path): the fixed cost of the API.
//! * `query_10k_pending`: finding "nothing complete" among 10,000 pending operations, by
//!   `SyncObject::query` (O(1), one load) and by testing every request as `MPI_Testsome`
//!   does (O(n), [Patinyasakdikul 2019, Fig. 4.6]). Same group, so the ratio is visible.
//! * `query_bulk_100_ready`: taking 100 ready events in one `query_bulk` call, against 100
//!   `query` calls.
//!
//! Run: `cargo bench -p weft-benches --bench sync_object -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use weft_sync::{Attach, CompletionCell, Status, SyncObject};

/// A request that borrows its cell (the runtime's request pool owns the cells).
struct Borrowed<'a>(&'a CompletionCell);

// SAFETY: the cell outlives the borrow, and each benchmark completes it at most once per
// cycle (between resets).
unsafe impl Attach for Borrowed<'_> {
    fn completion_cell(&self) -> &CompletionCell {
        self.0
    }
}

/// A request that shares its cell with the "transport".
struct Op(Arc<CompletionCell>);

// SAFETY: the benchmark keeps a clone of the `Arc` until the cell has completed or the object
// is gone; each cell is completed at most once.
unsafe impl Attach for Op {
    fn completion_cell(&self) -> &CompletionCell {
        &self.0
    }
}

const STATUS: Status = Status { source: 1, tag: 7, bytes: 64 };

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("sync_object");
    g.throughput(Throughput::Elements(1));
    g.bench_function("round_trip", |b| {
        let sync = SyncObject::<u64>::new();
        let mut cell = CompletionCell::new();
        let mut i = 0u64;
        b.iter(|| {
            sync.attach(&mut Borrowed(&cell), i).unwrap();
            cell.complete(Ok(STATUS));
            let got = sync.query();
            debug_assert_eq!(got.as_ref().map(|c| c.data), Some(i));
            black_box(got);
            cell.reset();
            i += 1;
        });
    });
    g.finish();
}

fn query_pending(c: &mut Criterion) {
    const N: usize = 10_000;
    let mut g = c.benchmark_group("query_10k_pending");
    let sync = SyncObject::<usize>::new();
    let cells: Vec<Arc<CompletionCell>> = (0..N).map(|_| Arc::new(CompletionCell::new())).collect();
    for (i, cell) in cells.iter().enumerate() {
        sync.attach(&mut Op(cell.clone()), i).unwrap();
    }
    assert_eq!((sync.size(), sync.probe()), (N, 0));

    // MPIX_Sync_query: one load of the ready counter.
    g.bench_function("sync_query", |b| b.iter(|| black_box(black_box(&sync).query())));
    // MPI_Testsome: test every request.
    g.bench_function("test_every_cell", |b| {
        b.iter(|| {
            let cells = black_box(&cells);
            let mut done = 0usize;
            for cell in cells {
                done += usize::from(cell.is_complete());
            }
            black_box(done)
        })
    });
    g.finish();
    // Let the attachments go (each holds the object alive) before the cells are dropped.
    for cell in &cells {
        cell.complete(Ok(STATUS));
    }
}

fn query_bulk_ready(c: &mut Criterion) {
    const N: usize = 100;
    let mut g = c.benchmark_group("query_bulk_100_ready");
    g.throughput(Throughput::Elements(N as u64));
    let ready = || {
        let sync = SyncObject::<usize>::new();
        for i in 0..N {
            let mut op = Op(Arc::new(CompletionCell::new()));
            op.0.complete(Ok(STATUS));
            sync.attach(&mut op, i).unwrap(); // complete-then-attach: queued at once
        }
        debug_assert_eq!(sync.probe(), N);
        (sync, Vec::with_capacity(N))
    };
    g.bench_function("query_bulk", |b| {
        b.iter_batched(
            ready,
            |(sync, mut out)| {
                let n = sync.query_bulk(&mut out, N);
                debug_assert_eq!(n, N);
                (sync, out)
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("query_x100", |b| {
        b.iter_batched(
            ready,
            |(sync, mut out)| {
                while let Some(c) = sync.query() {
                    out.push(c);
                }
                debug_assert_eq!(out.len(), N);
                (sync, out)
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, round_trip, query_pending, query_bulk_ready);
criterion_main!(benches);
