//! Criterion: uncontended acquire + release of each `weft::lock` protocol against
//! `parking_lot::Mutex` and `std::sync::Mutex` (one thread, node reused).
use std::hint::black_box;
use std::pin::pin;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use weft::lock::{Clh, DynLock, Hmcs, LockKind, Mcs, Mutex, Priority, RawLock, Tas, Ticket};

fn raw<L: RawLock>(c: &mut Criterion, name: &str, lock: L) {
    let node = pin!(L::Node::default());
    let node = node.as_ref();
    c.bench_function(&format!("uncontended/{name}"), |b| {
        b.iter(|| {
            black_box(&lock).lock(node);
            // SAFETY: acquired just above with `node`.
            unsafe { lock.unlock(node) };
        })
    });
}

fn uncontended(c: &mut Criterion) {
    raw(c, "tas", Tas::new());
    raw(c, "ticket", Ticket::new());
    raw(c, "mcs", Mcs::new());
    raw(c, "clh", Clh::new());
    raw(c, "hmcs", Hmcs::new());
    raw(c, "p-hmcs-mcs", Priority::<Hmcs, Mcs>::default());
    raw(c, "dyn-mcs", DynLock::new("mcs".parse::<LockKind>().unwrap()));
    let pl = parking_lot::Mutex::new(0u64);
    c.bench_function("uncontended/parking_lot", |b| b.iter(|| *black_box(&pl).lock() += 1));
    let std = std::sync::Mutex::new(0u64);
    c.bench_function("uncontended/std", |b| b.iter(|| *black_box(&std).lock().unwrap() += 1));
    let m: Mutex<Mcs, u64> = Mutex::new(0);
    c.bench_function("uncontended/mutex-mcs-with_lock", |b| b.iter(|| black_box(&m).with_lock(|v| *v += 1)));
    let mut node = pin!(weft::lock::McsNode::new());
    c.bench_function("uncontended/mutex-mcs-lock_with", |b| b.iter(|| *black_box(&m).lock_with(node.as_mut()) += 1));
    let t: Mutex<Ticket, u64> = Mutex::new(0);
    c.bench_function("uncontended/mutex-ticket-lock", |b| b.iter(|| *black_box(&t).lock() += 1));
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = uncontended
}
criterion_main!(benches);
