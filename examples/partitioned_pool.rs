//! One message filled by pool tasks (MPI 4.0 ch. 4, partitioned point-to-point): rank 0
//! hands each partition of a persistent partitioned send to a task of its pool
//! (`Runtime::spawn`); each task computes its rows and marks its partition ready, and the
//! partition travels at once. Rank 1 cuts the same message into fewer, larger partitions and
//! consumes each as soon as every send partition overlapping it has arrived, before the
//! whole message is in.
//!
//! `cargo run --release -p weft-examples --example partitioned_pool`
use weft::Runtime;

/// Columns of a row of the matrix sent.
const COLS: usize = 1024;
/// Rows of the matrix: 8 send partitions of 32 rows, 4 receive partitions of 64.
const ROWS: usize = 256;
const SEND_PARTS: usize = 8;
const RECV_PARTS: usize = 4;
const ROUNDS: u64 = 5;

/// Element `(row, col)` of round `round`'s matrix.
fn value(round: u64, row: usize, col: usize) -> f64 {
    (round as f64) * 1e6 + (row * COLS + col) as f64
}

fn main() -> Result<(), weft::Error> {
    let ranks = Runtime::builder().workers(4).build_local(2)?;
    let (sender, receiver) = (&ranks[0], &ranks[1]);
    let (a, b) = (sender.world(), receiver.world());
    let mut send = a.psend_init(vec![0f64; ROWS * COLS], SEND_PARTS, 1, 1)?;
    let mut recv = b.precv_init(vec![0f64; ROWS * COLS], RECV_PARTS, 0, 1)?;
    let rows_per_part = ROWS / SEND_PARTS;
    for round in 0..ROUNDS {
        recv.start()?;
        send.start()?;
        // Each partition moves into a pool task ('static handles): the task fills its rows
        // and marks the partition ready.
        let tasks: Vec<_> = send
            .owned_partitions()?
            .into_iter()
            .map(|mut p| {
                sender.spawn(async move {
                    let first_row = p.index() * rows_per_part;
                    for (k, x) in p.as_mut_slice().iter_mut().enumerate() {
                        *x = value(round, first_row + k / COLS, k % COLS);
                    }
                    p.ready()
                })
            })
            .collect();
        // Rank 1 sums each of its partitions as soon as it has arrived.
        let sums = std::thread::scope(|s| {
            let consumer = s.spawn(|| {
                let mut sums = [None; RECV_PARTS];
                while sums.iter().any(Option::is_none) {
                    for (i, sum) in sums.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                        if recv.parrived(i) {
                            *sum = recv.partition(i).map(|rows| rows.iter().sum::<f64>());
                        }
                    }
                }
                recv.wait().map(|()| sums)
            });
            for t in tasks {
                sender.block_on(t).expect("a filling task panicked")?;
            }
            send.wait()?;
            consumer.join().expect("the consumer panicked")
        })?;
        let rows_per_recv = ROWS / RECV_PARTS;
        for (i, sum) in sums.iter().enumerate() {
            let want: f64 = (i * rows_per_recv..(i + 1) * rows_per_recv).flat_map(|r| (0..COLS).map(move |c| value(round, r, c))).sum();
            assert_eq!(sum.expect("every partition summed"), want, "round {round}, receive partition {i}");
        }
        let got = recv.buffer().expect("inactive after its wait");
        assert_eq!(got[ROWS * COLS - 1], value(round, ROWS - 1, COLS - 1));
    }
    println!(
        "{ROUNDS} rounds of a {ROWS}x{COLS} matrix: {SEND_PARTS} partitions filled by pool tasks, received as {RECV_PARTS}, each consumed on arrival"
    );
    Ok(())
}
