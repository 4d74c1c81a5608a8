//! A receiver completes many receives through one sync object ([Patinyasakdikul 2019, App. B],
//! Listing 5): several threads take completions from it at once with `query_bulk`.
//!
//! `cargo run --release -p weft-examples --example sync_object`
use std::sync::atomic::{AtomicUsize, Ordering};

use weft::{Runtime, Source, Tag};

fn main() -> Result<(), weft::Error> {
    const N: usize = 1000;
    let ranks = Runtime::builder().build_local(2)?;
    let comm = ranks[1].world();
    let sync = ranks[1].sync_object::<usize>();
    let mut reqs = Vec::with_capacity(N);
    for i in 0..N {
        let mut r = comm.irecv(Vec::<u64>::with_capacity(1), Source::Rank(0), Tag::Is(i as i32))?;
        sync.attach(&mut r, i).expect("fresh request");
        reqs.push(r);
    }
    let sum = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..N {
                ranks[0].world().send(vec![i as u64], 1, i as i32).expect("send");
            }
        });
        for _ in 0..3 {
            s.spawn(|| {
                let mut got = Vec::new();
                while sync.size() > 0 || sync.probe() > 0 {
                    got.clear();
                    if sync.query_bulk(&mut got, 64) == 0 {
                        ranks[1].progress();
                    }
                    for c in &got {
                        assert!(c.outcome.is_ok());
                        sum.fetch_add(c.data, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(sum.into_inner(), N * (N - 1) / 2);
    for (i, r) in reqs.iter_mut().enumerate() {
        let (v, _) = r.take().expect("complete")?;
        assert_eq!(v, vec![i as u64]);
    }
    println!("{N} receives completed through one sync object, queried by 3 threads");
    Ok(())
}
