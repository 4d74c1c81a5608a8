// One-sided windows (`weft::rma`). Included by `rma.rs` (embedded provider) and
// `p2p_ofi.rs` (libfabric shm and tcp), which each define `builder()`.

use std::sync::atomic::{AtomicBool, Ordering};

use weft::rma::{Op, Window};
use weft::{Communicator, Error, Runtime};

use crate::common::within;

fn world(n: u32) -> Vec<Runtime> {
    super::builder().cris(2).build_local(n).unwrap()
}

/// Every rank sends to and receives from every other: after it, each rank has passed the
/// point where the others called it.
pub(super) fn barrier(c: &Communicator) {
    for r in (0..c.size()).filter(|&r| r != c.rank()) {
        c.send(vec![0u8], r, 900).unwrap();
    }
    for r in (0..c.size()).filter(|&r| r != c.rank()) {
        c.recv(Vec::<u8>::with_capacity(1), r, 900).unwrap();
    }
}

/// Runs `f(rank, comm)` on one thread per rank of a fresh world of `n`, bounded in time:
/// a hang guard only, generous (the async lock scenarios take ~20 s on tcp alone, and the
/// whole suite runs them beside each other on 2 cores).
pub(super) fn on_ranks(n: u32, what: &'static str, f: fn(u32, &Communicator)) {
    within(240, what, move || {
        let rts = world(n);
        std::thread::scope(|s| {
            for (r, rt) in rts.iter().enumerate() {
                s.spawn(move || f(r as u32, rt.world()));
            }
        });
    });
}

#[test]
fn put_get_and_local_access() {
    on_ranks(3, "put/get", |me, c| {
        let w: Window<'_, u32> = c.window(8).unwrap();
        assert_eq!((w.len(), w.len_of(2).unwrap(), w.rank(), w.size()), (8, 8, me, 3));
        w.write_local(0, &[100 + me]).unwrap();
        barrier(c);
        // Each rank writes its rank into slot `me` of every other rank.
        for r in (0..3).filter(|&r| r != me) {
            w.put(r, me as usize + 1, &[me * 10 + r]).unwrap();
            w.flush(r).unwrap();
            let mut back = [0u32; 1];
            w.get(r, 0, &mut back).unwrap();
            assert_eq!(back[0], 100 + r, "get of the target's local write");
        }
        barrier(c);
        let mut mine = [0u32; 8];
        w.read_local(0, &mut mine).unwrap();
        for r in (0..3).filter(|&r| r != me) {
            assert_eq!(mine[r as usize + 1], r * 10 + me, "rank {me}: slot of {r}");
        }
        assert_eq!(mine[0], 100 + me);
        assert_eq!(&mine[4..], &[0; 4], "untouched elements stay zero");
        // A longer put and get, to self as well.
        let data: Vec<u32> = (0..5).collect();
        w.put(me, 3, &data).unwrap();
        w.flush_local(me).unwrap();
        let mut back = [0u32; 5];
        w.get(me, 3, &mut back).unwrap();
        assert_eq!(back.to_vec(), data);
        barrier(c);
        w.free().unwrap();
    });
}

/// A rank parked in a blocking receive serves a peer's first one-sided operations from
/// CRIs that never reached it yet: the peer's thread (its own CRI) and a second thread (the
/// next CRI) each read and write the parked rank's part, then release it. On `tcp;ofi_rxm`
/// each is the first operation on a connection to the parked rank's RMA target endpoint,
/// which the parked rank must accept and serve; its flush used to wait out its deadline.
#[test]
fn a_parked_rank_serves_first_operations_from_new_cris() {
    on_ranks(2, "first operations on a parked rank", |me, c| {
        let w: Window<'_, u64> = c.window(4).unwrap();
        if me == 1 {
            // Parks: rank 0 sends only once its operations are back.
            c.recv(Vec::<u8>::with_capacity(1), 0, 901).unwrap();
        } else {
            let access = |slot: usize| {
                let start = std::time::Instant::now();
                w.put(1, slot, &[10 + slot as u64]).unwrap();
                w.flush(1).unwrap();
                let mut back = [0u64; 1];
                w.get(1, slot, &mut back).unwrap();
                assert_eq!(back[0], 10 + slot as u64);
                start.elapsed()
            };
            let mine = access(0);
            let other = std::thread::scope(|s| s.spawn(|| access(1)).join().unwrap());
            c.send(vec![0u8], 1, 901).unwrap();
            // A hang guard (the flush's own deadline is 60 s); served, each takes milliseconds.
            for (who, took) in [("the rank's thread", mine), ("a second thread", other)] {
                assert!(took < std::time::Duration::from_secs(10), "{who}: first put, flush and get on the parked rank took {took:?}");
            }
        }
        barrier(c);
        let mut mine = [0u64; 4];
        w.read_local(0, &mut mine).unwrap();
        assert_eq!(mine, if me == 1 { [10, 11, 0, 0] } else { [0; 4] });
        w.free().unwrap();
    });
}

/// Ranks that drop a window as soon as they created it (an error right after the creation,
/// as a table whose lock refuses its shape) do not hold up the ranks still creating it:
/// window creation reaches the peers' RMA target endpoints through a region each rank keeps
/// for its lifetime, never through the new window's parts, which a peer may have removed
/// already. (On `tcp;ofi_rxm` a read of a removed registration is never answered, and each
/// creation waited out the reaching flush's deadline.) Then a window in use.
#[test]
fn windows_dropped_at_once_do_not_hold_up_their_creation() {
    on_ranks(2, "windows dropped at once", |me, c| {
        for round in 0..4 {
            let start = std::time::Instant::now();
            drop(c.window::<u64>(2).unwrap());
            let took = start.elapsed();
            // A hang guard (the flush's deadline is 60 s); each creation takes milliseconds.
            assert!(took < std::time::Duration::from_secs(10), "rank {me}: creation {round} took {took:?}");
        }
        let w: Window<'_, u64> = c.window(2).unwrap();
        w.put(1 - me, 0, &[u64::from(me) + 7]).unwrap();
        w.flush(1 - me).unwrap();
        barrier(c);
        let mut mine = [0u64; 1];
        w.read_local(0, &mut mine).unwrap();
        assert_eq!(mine[0], u64::from(1 - me) + 7);
        w.free().unwrap();
    });
}

/// What an access to a part of a window its owner ended fails with (`weft::rma`, *A
/// window's end*).
const ENDED: Error = Error::InvalidArgument("the target rank ended its part of the window");

/// An access to a window its target already dropped, or freed while this rank did not (an
/// erroneous program: `free` is collective), fails at once with a clear error and writes
/// nothing, once this rank received a message the target sent after the end; messages
/// between the two ranks still flow afterwards, and a new window works. (On `tcp;ofi_rxm`
/// the target's provider answered an access to the removed registration by shutting the
/// connection down, and the origin's flush waited out its 60 s deadline.)
#[test]
fn an_access_to_a_window_its_target_dropped_fails_and_messages_still_flow() {
    on_ranks(2, "access to a dropped window", |me, c| {
        for freed in [false, true] {
            let w: Window<'_, u64> = c.window(2).unwrap();
            if me == 1 {
                if freed {
                    w.free().unwrap();
                } else {
                    drop(w);
                }
                barrier(c);
                // Parks until rank 0 is done with the ended window.
                assert_eq!(c.recv(Vec::<u8>::with_capacity(4), 0, 902).unwrap().0, b"done");
                c.send(b"back".to_vec(), 0, 903).unwrap();
                continue;
            }
            if freed {
                // Rank 1's `free` waits for every rank: this barrier lets it return.
                c.barrier().unwrap();
            }
            barrier(c);
            let start = std::time::Instant::now();
            let put = w.put(1, 0, &[7]);
            let flush = w.flush(1);
            let mut back = [0u64; 1];
            let get = w.get(1, 0, &mut back);
            let fetched = w.fetch_and_op(1, 1, 1, Op::Sum);
            let swapped = w.compare_and_swap(1, 1, 0, 1);
            let shape = w.len_of(1);
            let took = start.elapsed();
            for (what, e) in [
                ("put", put.err()),
                ("flush", flush.err()),
                ("get", get.err()),
                ("fetch-and-op", fetched.err()),
                ("compare-and-swap", swapped.err()),
            ] {
                assert_eq!(e, Some(ENDED), "{what} on the window rank 1 {}", if freed { "freed" } else { "dropped" });
            }
            assert_eq!(shape, Ok(2), "the part's shape is still known");
            assert!(took < std::time::Duration::from_secs(1), "the failed accesses took {took:?}");
            // This rank's own part is untouched, and the other traffic between the ranks too.
            w.put(0, 0, &[9]).unwrap();
            w.flush(0).unwrap();
            c.send(b"done".to_vec(), 1, 902).unwrap();
            assert_eq!(c.recv(Vec::<u8>::with_capacity(4), 1, 903).unwrap().0, b"back");
            drop(w);
        }
        // A window created afterwards reaches rank 1 again.
        let w: Window<'_, u64> = c.window(2).unwrap();
        w.put(1 - me, 0, &[u64::from(me) + 5]).unwrap();
        w.flush(1 - me).unwrap();
        let mut back = [0u64; 1];
        w.get(1 - me, 0, &mut back).unwrap();
        assert_eq!(back[0], u64::from(me) + 5);
        w.free().unwrap();
    });
}

/// Accesses racing with the target's drop of its window — posted while the notice of the
/// end is on its way — either land (in the retired registration, on libfabric) or fail with
/// the clear error; none breaks the connection: once the target's next message is here,
/// accesses fail at once, and messages and a new window work. (On `tcp;ofi_rxm` an access
/// to the removed registration made the target shut the connection down.)
#[test]
fn an_access_racing_with_the_end_of_its_window_does_not_break_the_connection() {
    on_ranks(2, "access racing with a window's end", |me, c| {
        let w: Window<'_, u64> = c.window(4).unwrap();
        if me == 1 {
            c.recv(Vec::<u8>::with_capacity(2), 0, 904).unwrap();
            drop(w);
            c.send(b"dropped".to_vec(), 0, 905).unwrap();
        } else {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let mut dropped = c.irecv(Vec::<u8>::with_capacity(8), 1, 905).unwrap();
            let (mut landed, mut seen_end) = (0u32, false);
            for i in 0u64.. {
                let told = dropped.test();
                let put = w.put(1, 0, &[i]).and_then(|()| w.flush(1));
                let fetched = w.fetch_and_op(1, 1, 1, Op::Sum).map(|_| ());
                for r in [put, fetched] {
                    match r {
                        Ok(()) => {
                            assert!(!told, "an access after the target's next message landed");
                            landed += 1;
                        }
                        Err(e) => {
                            // The embedded provider removes the key at once: a racing access
                            // finds it unknown there.
                            let unknown = Error::InvalidArgument("unknown remote memory key");
                            assert!(e == ENDED || (e == unknown && !told), "access {i}: {e:?}");
                            seen_end = true;
                        }
                    }
                }
                if i == 0 {
                    // The first accesses are in: the target drops now, while more go out.
                    c.send(b"go".to_vec(), 1, 904).unwrap();
                }
                if told {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "no notice of the end after {i} rounds of accesses");
            }
            assert!(landed >= 2 && seen_end, "{landed} accesses landed, end seen: {seen_end}");
            assert_eq!(dropped.wait().unwrap().0, b"dropped");
            drop(w);
        }
        // The connection serves messages and a new window.
        barrier(c);
        let w: Window<'_, u64> = c.window(1).unwrap();
        assert_eq!(w.fetch_and_op(1 - me, 0, 1, Op::Sum).unwrap(), 0);
        barrier(c);
        let mut mine = [0u64; 1];
        w.read_local(0, &mut mine).unwrap();
        assert_eq!(mine[0], 1);
        w.free().unwrap();
    });
}

/// A window of exposed memory (`Communicator::expose`) gives the memory back to its owner
/// when dropped, with what peers wrote before; a peer's access once the owner's next
/// message is here fails with the clear error (an access racing with that drop is the
/// program's error: `weft::rma`, *A window's end*).
#[test]
fn an_exposed_window_dropped_by_its_owner_fails_later_accesses_and_gives_its_memory_back() {
    on_ranks(2, "dropped exposed window", |me, c| {
        let mut memory = [0u64; 2];
        let w = c.expose(&mut memory).unwrap();
        if me == 0 {
            w.put(1, 1, &[42]).unwrap();
            w.flush(1).unwrap();
        }
        barrier(c);
        if me == 1 {
            drop(w);
            assert_eq!(memory, [0, 42], "the owner has its memory back, with the peer's put");
            barrier(c);
        } else {
            barrier(c);
            let mut back = [0u64; 1];
            assert_eq!(w.get(1, 1, &mut back), Err(ENDED));
            assert_eq!(w.fetch_and_op(1, 0, 1, Op::Sum), Err(ENDED));
            drop(w);
        }
        barrier(c);
    });
}

#[test]
fn a_window_of_a_communicator_whose_ranks_differ_from_the_world_targets_its_own_ranks() {
    // Ranks reversed: rank r of `rev` is world rank 2 - r.
    on_ranks(3, "window of a reordered communicator", |me, c| {
        let rev = c.split(Some(0), -(me as i32)).unwrap().unwrap();
        let r = rev.rank();
        assert_eq!(r, 2 - me);
        let w: Window<'_, u64> = rev.window(4).unwrap();
        // Every rank writes its world rank at its slot of `rev`'s rank 0, and counts itself
        // at its slot 3.
        w.put(0, r as usize, &[100 + u64::from(me)]).unwrap();
        w.fetch_and_op(0, 3, 1, Op::Sum).unwrap();
        w.flush(0).unwrap();
        barrier(&rev);
        if r == 0 {
            let mut mine = [0u64; 4];
            w.read_local(0, &mut mine).unwrap();
            assert_eq!(mine, [102, 101, 100, 3], "world rank {me} (rank 0 of the reversed communicator)");
        }
        barrier(&rev);
        w.free().unwrap();
        rev.free();
    });
}

#[test]
fn atomics_of_every_width_are_exact_under_contention() {
    const N: u32 = 200;
    on_ranks(3, "atomics", |me, c| {
        let w8: Window<'_, u8> = c.window(16).unwrap();
        let w16: Window<'_, i16> = c.window(8).unwrap();
        let w32: Window<'_, u32> = c.window(4).unwrap();
        let w64: Window<'_, u64> = c.window(4).unwrap();
        let wi: Window<'_, i64> = c.window(4).unwrap();
        let wf: Window<'_, f64> = c.window(2).unwrap();
        let wf32: Window<'_, f32> = c.window(2).unwrap();
        barrier(c);
        for i in 0..N {
            // Neighbouring narrow elements of one word, updated by every rank at once.
            w8.fetch_and_op(0, 5, 1, Op::Sum).unwrap();
            w8.fetch_and_op(0, 6, 1 << (i % 8), Op::BitXor).unwrap();
            w16.accumulate(0, 1, &[-1, 2], Op::Sum).unwrap();
            w32.fetch_and_op(0, 3, 1, Op::Sum).unwrap();
            w64.fetch_and_op(0, 1, 1, Op::Sum).unwrap();
            w64.fetch_and_op(0, 2, u64::from(i * 3 + me), Op::Max).unwrap();
            wi.fetch_and_op(0, 0, -(i64::from(i)), Op::Min).unwrap();
            wi.fetch_and_op(0, 1, 3, Op::Prod).unwrap();
            wf.fetch_and_op(0, 1, 0.5, Op::Sum).unwrap();
            wf32.fetch_and_op(0, 0, 0.25, Op::Sum).unwrap();
            // A counter by compare-and-swap on a 32-bit element.
            let mut cur = w32.fetch_and_op(0, 1, 0, Op::NoOp).unwrap();
            loop {
                let seen = w32.compare_and_swap(0, 1, cur, cur + 1).unwrap();
                if seen == cur {
                    break;
                }
                cur = seen;
            }
        }
        barrier(c);
        if me == 0 {
            let total = 3 * N;
            let mut b8 = [0u8; 16];
            w8.read_local(0, &mut b8).unwrap();
            assert_eq!(b8[5], (total % 256) as u8, "u8 sum wraps");
            // Three ranks xor the same pattern: it survives once.
            assert_eq!(b8[6], (0..N).fold(0u8, |a, i| a ^ (1 << (i % 8))), "xor of each rank's pattern");
            assert!(b8.iter().enumerate().all(|(i, &v)| i == 5 || i == 6 || v == 0), "neighbours untouched: {b8:?}");
            let mut b16 = [0i16; 8];
            w16.read_local(0, &mut b16).unwrap();
            assert_eq!(b16, [0, -(total as i16), 2 * total as i16, 0, 0, 0, 0, 0]);
            let mut b32 = [0u32; 4];
            w32.read_local(0, &mut b32).unwrap();
            assert_eq!(b32, [0, total, 0, total]);
            let mut b64 = [0u64; 4];
            w64.read_local(0, &mut b64).unwrap();
            assert_eq!(b64, [0, u64::from(total), u64::from((N - 1) * 3 + 2), 0]);
            let mut bi = [0i64; 4];
            wi.read_local(0, &mut bi).unwrap();
            assert_eq!(bi[0], -(i64::from(N) - 1));
            assert_eq!(bi[1], 0, "0 * 3 stays 0");
            let mut bf = [0f64; 2];
            wf.read_local(0, &mut bf).unwrap();
            assert_eq!(bf, [0.0, f64::from(total) * 0.5]);
            let mut bf32 = [0f32; 2];
            wf32.read_local(0, &mut bf32).unwrap();
            assert_eq!(bf32, [total as f32 * 0.25, 0.0]);
        }
        barrier(c);
    });
}

#[test]
fn bad_input_is_refused_and_writes_nothing() {
    on_ranks(2, "bad input", |me, c| {
        let w: Window<'_, u64> = c.window(4).unwrap();
        let wf: Window<'_, f64> = c.window(1).unwrap();
        barrier(c);
        let peer = 1 - me;
        let out = |offset, len| Err::<(), _>(Error::OutOfWindow { offset, len, window: 4 });
        assert_eq!(w.put(peer, 3, &[1, 2]), out(3, 2));
        assert_eq!(w.put(peer, usize::MAX, &[1]), out(usize::MAX, 1));
        assert_eq!(w.get(peer, 4, &mut [0]), out(4, 1));
        assert_eq!(w.fetch_and_op(peer, 4, 1, Op::Sum).map(drop), out(4, 1));
        assert_eq!(w.compare_and_swap(peer, 9, 0, 1).map(drop), out(9, 1));
        assert_eq!(w.accumulate(peer, 2, &[1, 1, 1], Op::Sum), out(2, 3));
        assert_eq!(w.write_local(4, &[1]), out(4, 1));
        assert_eq!(w.put(2, 0, &[1]), Err(Error::RankOutOfRange { rank: 2, size: 2 }));
        assert_eq!(w.flush(7), Err(Error::RankOutOfRange { rank: 7, size: 2 }));
        assert!(matches!(wf.fetch_and_op(peer, 0, 1.0, Op::BitOr), Err(Error::InvalidArgument(_))));
        assert!(matches!(w.get_accumulate(peer, 0, &[1], Op::Sum, &mut [0, 0]), Err(Error::InvalidArgument(_))));
        w.flush_all().unwrap();
        barrier(c);
        let mut all = [9u64; 4];
        w.read_local(0, &mut all).unwrap();
        assert_eq!(all, [0; 4], "a refused operation wrote nothing");
        barrier(c);
    });
}

#[test]
fn exposed_memory_and_unaligned_atomics() {
    #[repr(align(8))]
    struct Aligned([u32; 4]);
    on_ranks(2, "expose", |me, c| {
        let mut mem = Aligned([7; 4]);
        {
            // Starts 4 bytes into an 8-byte word: element 0's word begins before the window.
            let w = c.expose(&mut mem.0[1..4]).unwrap();
            assert_eq!(w.len(), 3);
            barrier(c);
            let peer = 1 - me;
            assert_eq!(w.fetch_and_op(peer, 0, 1, Op::Sum), Err(Error::UnalignedAtomic { offset: 0, elem_size: 4 }));
            assert_eq!(w.fetch_and_op(peer, 2, 1, Op::Sum), Ok(7), "element 2's word is inside");
            w.put(peer, 1, &[me + 40]).unwrap();
            w.flush(peer).unwrap();
            let mut b = [0u32; 3];
            w.get(peer, 0, &mut b).unwrap();
            assert_eq!(b, [7, me + 40, 8], "what this rank wrote, and its sum");
            barrier(c);
            w.free().unwrap();
        }
        assert_eq!(mem.0, [7, 7, 1 - me + 40, 8], "the peer wrote only the exposed part");
    });
}

#[test]
fn a_window_of_a_freed_communicator_fails() {
    on_ranks(2, "freed communicator", |me, c| {
        let d = c.dup().unwrap();
        let w: Window<'_, u64> = d.window(2).unwrap();
        barrier(c);
        d.free();
        let peer = 1 - me;
        assert_eq!(w.put(peer, 0, &[1]), Err(Error::CommFreed));
        assert_eq!(w.get(peer, 0, &mut [0]), Err(Error::CommFreed));
        assert_eq!(w.fetch_and_op(peer, 0, 1, Op::Sum), Err(Error::CommFreed));
        assert_eq!(w.flush_all(), Err(Error::CommFreed));
        let mut local = [5u64; 2];
        assert_eq!(w.read_local(0, &mut local), Err(Error::CommFreed));
        assert!(matches!(d_window(c), Ok(())));
        barrier(c);
    });

    /// A window of a freed communicator cannot be created either.
    fn d_window(c: &Communicator) -> Result<(), Error> {
        let d = c.dup()?;
        d.clone().free();
        match d.window::<u8>(1) {
            Err(Error::CommFreed) => Ok(()),
            other => panic!("window of a freed communicator: {other:?}"),
        }
    }
}

/// A thread that flushes while another keeps issuing puts is not held up by the other's
/// later puts, and its own puts are at the target when its flush returns.
#[test]
fn flush_waits_only_for_what_was_issued_before_it() {
    on_ranks(2, "multithreaded flush", |me, c| {
        let w: Window<'_, u64> = c.window(2).unwrap();
        barrier(c);
        if me == 0 {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        w.put(1, 0, &[i]).unwrap();
                        i += 1;
                    }
                    w.flush(1).unwrap();
                });
                for i in 1..=100u64 {
                    w.put(1, 1, &[i]).unwrap();
                    w.flush(1).unwrap();
                    let mut back = [0u64];
                    w.get(1, 1, &mut back).unwrap();
                    assert_eq!(back[0], i, "this thread's put is at the target after its flush");
                }
                stop.store(true, Ordering::Relaxed);
            });
        }
        barrier(c);
        w.free().unwrap();
    });
}

/// A put that a flush completed is applied at its target before any operation issued after
/// the flush — by another thread of the origin, through another CRI, so another connection
/// where the provider has connections — is seen there (`MPI_Win_flush` completes an
/// operation at the target, not only at the origin). The puts are large (256 KiB), so a
/// provider that completes a write once it is handed to the network would let the small
/// atomic behind it overtake its tail.
#[test]
fn a_flushed_put_lands_before_a_later_operation_of_another_thread() {
    const ROUNDS: u64 = 200;
    const LEN: usize = 32 * 1024;
    on_ranks(2, "a flushed put, then another thread's atomic", |me, c| {
        let w: Window<'_, u64> = c.window(LEN + 1).unwrap();
        barrier(c);
        if me == 0 {
            let (tx, rx) = std::sync::mpsc::channel::<u64>();
            std::thread::scope(|s| {
                let w = &w;
                s.spawn(move || {
                    for i in 1..=ROUNDS {
                        w.put(1, 0, &vec![i; LEN]).unwrap();
                        w.flush(1).unwrap();
                        tx.send(i).unwrap();
                    }
                });
                s.spawn(move || {
                    for i in rx {
                        w.fetch_and_op(1, LEN, i, Op::Replace).unwrap();
                    }
                });
            });
        } else {
            let mut seen = 0;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while seen < ROUNDS && std::time::Instant::now() < deadline {
                let flag = w.fetch_and_op(1, LEN, 0, Op::NoOp).unwrap();
                let mut tail = [0u64];
                w.read_local(LEN - 1, &mut tail).unwrap();
                assert!(
                    tail[0] >= flag,
                    "the atomic of round {flag} was applied before the end of that round's flushed put (found {})",
                    tail[0]
                );
                seen = flag;
            }
            assert_eq!(seen, ROUNDS, "rounds seen");
        }
        barrier(c);
    });
}
