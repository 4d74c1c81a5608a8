//! A PaRSEC-like task runtime on weft: a tiled matrix product `C = A * B` as a DAG of tasks
//! spread over ranks, whose inputs arrive as messages that release the tasks waiting for
//! them through continuations [Schuchart 2021].
//!
//! * Tiles are distributed 2D-cyclically over the ranks. The owner of `A(i,k)` sends it to
//!   every rank that owns a tile of row `i` of `C` (and `B(k,j)` to the owners of column
//!   `j`), straight out of the full matrix with a vector datatype (no copy by hand).
//! * Each rank posts a receive for every remote tile it needs and gives it a continuation
//!   on the rank's continuation request: when the tile arrives, the thread whose progress
//!   completed the receive runs it inline — it stores the tile and spawns every task
//!   `GEMM(i,j,k)` whose two inputs are now present on the rank's work-stealing pool. No
//!   thread loops over the requests or waits for the next completion; the rank's thread
//!   only waits, once, for every continuation to have run.
//! * Partial products are summed into `C`, gathered on rank 0 and checked against a
//!   sequential product; the program exits with status 1 on a mismatch.
//!
//! `cargo run --release -p weft-examples --example parsec_dag -- [ranks] [tiles] [tile]`
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use weft::{Datatype, Invoke, JoinHandle, Runtime, Source, Tag};

/// Which matrix a tile belongs to.
const A: usize = 0;
const B: usize = 1;

#[derive(Clone, Copy)]
struct Dims {
    ranks: usize,
    /// Tiles per dimension.
    t: usize,
    /// Tile edge in elements.
    ts: usize,
}

impl Dims {
    fn n(&self) -> usize {
        self.t * self.ts
    }
    fn owner(&self, i: usize, j: usize) -> usize {
        (i * self.t + j) % self.ranks
    }
    fn tag(&self, m: usize, i: usize, j: usize) -> i32 {
        ((m * self.t + i) * self.t + j) as i32
    }
    /// Offset of tile `(i, j)` in a row-major `n x n` matrix.
    fn offset(&self, i: usize, j: usize) -> usize {
        i * self.ts * self.n() + j * self.ts
    }
}

/// Small integers, so every sum is exact in `f64` and the check can be `==`.
fn a_at(r: usize, c: usize) -> f64 {
    ((r * 7 + c * 3) % 11) as f64 - 5.0
}
fn b_at(r: usize, c: usize) -> f64 {
    ((r * 5 + c * 13) % 9) as f64 - 4.0
}

fn full(n: usize, f: fn(usize, usize) -> f64) -> Vec<f64> {
    (0..n * n).map(|x| f(x / n, x % n)).collect()
}

fn tile_of(d: &Dims, m: &[f64], i: usize, j: usize) -> Vec<f64> {
    let ty = Datatype::<f64>::vector(d.ts, d.ts, d.n()).expect("tile layout");
    ty.pack_to_vec(&m[d.offset(i, j)..]).expect("tile inside the matrix")
}

/// `C += A * B` on `ts x ts` tiles.
fn gemm(ts: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut c = vec![0.0; ts * ts];
    for r in 0..ts {
        for k in 0..ts {
            let x = a[r * ts + k];
            for col in 0..ts {
                c[r * ts + col] += x * b[k * ts + col];
            }
        }
    }
    c
}

/// Tiles of `C` by `(row, column)`.
type Tiles = HashMap<(usize, usize), Vec<f64>>;

/// A tile of `A` or `B`: `(matrix, row, column)`.
type TileId = (usize, usize, usize);

/// A task's partial product of tile `C(i,j)`.
type Partial = ((usize, usize), Vec<f64>);

/// One rank's DAG: the input tiles here, the tasks spawned, the first receive that failed.
struct Dag {
    have: HashMap<TileId, Arc<Vec<f64>>>,
    spawned: HashSet<(usize, usize, usize)>,
    tasks: Vec<JoinHandle<Partial>>,
    failed: Option<weft::Error>,
}

impl Dag {
    /// Spawns every task `GEMM(i,j,k)` of a tile `C(i,j)` in `mine` whose inputs `A(i,k)` and
    /// `B(k,j)` are both here and that is not spawned yet.
    fn release(&mut self, rt: &Runtime, d: &Dims, mine: &[(usize, usize)]) {
        for &(i, j) in mine {
            for k in 0..d.t {
                if self.spawned.contains(&(i, j, k)) {
                    continue;
                }
                if let (Some(a), Some(b)) = (self.have.get(&(A, i, k)), self.have.get(&(B, k, j))) {
                    self.spawned.insert((i, j, k));
                    let (a, b, ts) = (a.clone(), b.clone(), d.ts);
                    self.tasks.push(rt.spawn(async move { ((i, j), gemm(ts, &a, &b)) }));
                }
            }
        }
    }
}

/// One rank's part: returns its `C` tiles.
fn rank_main(rt: &Runtime, d: &Dims) -> Result<Tiles, weft::Error> {
    let me = rt.rank() as usize;
    let comm = rt.world();
    let n = d.n();
    let (fa, fb) = (full(n, a_at), full(n, b_at));
    let tile_ty = Datatype::<f64>::vector(d.ts, d.ts, n)?;

    // Which tiles this rank needs: row i of A and column j of B for each C(i,j) it owns.
    let mine: Arc<Vec<(usize, usize)>> =
        Arc::new((0..d.t).flat_map(|i| (0..d.t).map(move |j| (i, j))).filter(|&(i, j)| d.owner(i, j) == me).collect());
    let mut need = std::collections::BTreeSet::new();
    for &(i, j) in mine.iter() {
        for k in 0..d.t {
            need.insert((A, i, k));
            need.insert((B, k, j));
        }
    }

    // The tiles owned here release their tasks at once.
    let dag = Arc::new(Mutex::new(Dag { have: HashMap::new(), spawned: HashSet::new(), tasks: Vec::new(), failed: None }));
    {
        let mut g = dag.lock().expect("dag");
        for &(m, i, j) in need.iter().filter(|&&(_, i, j)| d.owner(i, j) == me) {
            let src = if m == A { &fa } else { &fb };
            g.have.insert((m, i, j), Arc::new(tile_of(d, src, i, j)));
        }
        g.release(rt, d, &mine);
    }

    // A receive for every remote input, whose continuation stores the tile and releases the
    // tasks it completes (inline: it only spawns them).
    let cr = rt.continuation_request();
    for &(m, i, j) in need.iter().filter(|&&(_, i, j)| d.owner(i, j) != me) {
        let mut r = comm.irecv(Vec::<f64>::with_capacity(d.ts * d.ts), Source::Rank(d.owner(i, j) as u32), Tag::Is(d.tag(m, i, j)))?;
        let (dag, rt, mine, d) = (dag.clone(), rt.clone(), mine.clone(), *d);
        cr.attach(&mut r, Invoke::Inline, move |res| {
            let mut g = dag.lock().unwrap_or_else(|e| e.into_inner());
            match res {
                Ok((tile, _)) => {
                    g.have.insert((m, i, j), Arc::new(tile));
                    g.release(&rt, &d, &mine);
                }
                Err(e) => {
                    g.failed.get_or_insert(e);
                }
            }
        })?;
    }

    // Send the tiles this rank owns to every other rank that needs them (from the full
    // matrix, with the tile datatype).
    let mut sends = Vec::new();
    for i in 0..d.t {
        for k in 0..d.t {
            if d.owner(i, k) != me {
                continue;
            }
            for (m, src) in [(A, &fa), (B, &fb)] {
                let mut dests: Vec<usize> =
                    (0..d.t).map(|x| if m == A { d.owner(i, x) } else { d.owner(x, k) }).filter(|&r| r != me).collect();
                dests.sort_unstable();
                dests.dedup();
                for r in dests {
                    sends.push(comm.isend_typed(&src[d.offset(i, k)..], &tile_ty, r as u32, d.tag(m, i, k))?);
                }
            }
        }
    }

    // Every input has arrived once every continuation has run (and spawned its tasks).
    cr.wait()?;
    weft::wait_all(&mut sends)?;
    let (tasks, failed) = {
        let mut g = dag.lock().unwrap_or_else(|e| e.into_inner());
        (std::mem::take(&mut g.tasks), g.failed)
    };
    if let Some(e) = failed {
        return Err(e);
    }

    // Sum the partial products (each C tile has t of them).
    let mut c_tiles: Tiles = mine.iter().map(|&ij| (ij, vec![0.0; d.ts * d.ts])).collect();
    let results = rt.block_on(async move {
        let mut out = Vec::new();
        for h in tasks {
            out.push(h.await);
        }
        out
    });
    for r in results {
        let (ij, part) = r.map_err(|_| weft::Error::InvalidArgument("a GEMM task panicked"))?;
        for (x, y) in c_tiles.get_mut(&ij).expect("own tile").iter_mut().zip(part) {
            *x += y;
        }
    }
    Ok(c_tiles)
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let mut next = |default: usize| args.next().unwrap_or(Ok(default)).unwrap_or(default);
    let d = Dims { ranks: next(3).clamp(1, 16), t: next(4).max(1), ts: next(32).max(1) };
    let ranks = match Runtime::builder().workers(2).build_local(d.ranks as u32) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("parsec_dag: {e}");
            std::process::exit(2);
        }
    };
    let t0 = std::time::Instant::now();
    let results: Vec<Result<Tiles, weft::Error>> = std::thread::scope(|s| {
        ranks
            .iter()
            .map(|rt| s.spawn(|| rank_main(rt, &d)))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let elapsed = t0.elapsed();

    // Gathered here through the threads' results (the tiles crossed ranks as messages).
    let n = d.n();
    let (fa, fb) = (full(n, a_at), full(n, b_at));
    let mut bad = 0usize;
    let mut tiles = 0usize;
    for res in results {
        let c_tiles = match res {
            Ok(c) => c,
            Err(e) => {
                eprintln!("parsec_dag: rank failed: {e}");
                std::process::exit(1);
            }
        };
        for ((i, j), tile) in c_tiles {
            tiles += 1;
            for r in 0..d.ts {
                for c in 0..d.ts {
                    let (gr, gc) = (i * d.ts + r, j * d.ts + c);
                    let want: f64 = (0..n).map(|k| fa[gr * n + k] * fb[k * n + gc]).sum();
                    if tile[r * d.ts + c] != want {
                        bad += 1;
                    }
                }
            }
        }
    }
    if bad > 0 || tiles != d.t * d.t {
        eprintln!("parsec_dag: MISMATCH: {bad} wrong elements, {tiles} of {} tiles", d.t * d.t);
        std::process::exit(1);
    }
    println!(
        "parsec_dag: {n}x{n} product over {} ranks as {} GEMM tasks on {}x{} tiles: verified in {:?}",
        d.ranks,
        d.t * d.t * d.t,
        d.ts,
        d.ts,
        elapsed
    );
}
