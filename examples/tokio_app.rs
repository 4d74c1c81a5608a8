//! weft messaging inside a tokio application: no weft worker threads; tokio tasks await
//! weft requests and a sync object's completion stream, and whichever task polls first
//! while progress is free drives it.
//!
//! Four ranks pass tokens around a ring for a number of rounds; a monitor task on rank 0
//! counts rank 0's receives through a sync object's `next().await`.
//!
//! `cargo run --release -p weft-examples --example tokio_app`
use weft::{Runtime, Source, Tag};

const RANKS: u32 = 4;
const ROUNDS: u64 = 200;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ranks = Runtime::builder().workers(0).build_local(RANKS)?;
    let mut handles = Vec::new();
    for rt in &ranks {
        let comm = rt.world().clone();
        handles.push(tokio::spawn(async move {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % RANKS, (me + RANKS - 1) % RANKS);
            let mut sum = 0u64;
            for round in 0..ROUNDS {
                let recv = comm.irecv(Vec::<u64>::with_capacity(1), Source::Rank(prev), Tag::Is(1))?;
                comm.isend(vec![round * 10 + u64::from(me)], next, 1)?.await?;
                let (v, st) = recv.await?;
                assert_eq!(st.source, prev);
                sum += v[0];
            }
            Ok::<u64, weft::Error>(sum)
        }));
    }
    // Rank 0 also serves requests: 50 messages from rank 1 on a second tag, collected
    // through a sync object stream while the ring runs.
    let sync = ranks[0].sync_object::<usize>();
    let c0 = ranks[0].world().clone();
    let mut reqs = Vec::new();
    for i in 0..50usize {
        let mut r = c0.irecv(Vec::<u8>::with_capacity(16), Source::Rank(1), Tag::Is(2))?;
        sync.attach(&mut r, i).expect("fresh request");
        reqs.push(r);
    }
    let c1 = ranks[1].world().clone();
    let feeder = tokio::spawn(async move {
        for i in 0..50u8 {
            c1.isend(vec![i; 16], 0, 2)?.await?;
        }
        Ok::<(), weft::Error>(())
    });
    let mut served = 0;
    while let Some(c) = sync.next().await {
        c.outcome?;
        served += 1;
    }
    feeder.await??;
    for (rank, h) in handles.into_iter().enumerate() {
        let sum = h.await??;
        let prev = (rank as u64 + u64::from(RANKS) - 1) % u64::from(RANKS);
        let want: u64 = (0..ROUNDS).map(|r| r * 10 + prev).sum();
        if sum != want {
            eprintln!("tokio_app: rank {rank} got {sum}, expected {want}");
            std::process::exit(1);
        }
    }
    // FIFO per source: the i-th receive got the i-th message.
    for (i, r) in reqs.iter_mut().enumerate() {
        let (v, _) = r.take().expect("complete")?;
        if v != vec![i as u8; 16] {
            eprintln!("tokio_app: message {i} out of order");
            std::process::exit(1);
        }
    }
    println!("tokio_app: {RANKS} ranks x {ROUNDS} ring rounds and {served} sync-object completions on tokio, verified");
    Ok(())
}
