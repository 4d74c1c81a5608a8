//! Datatypes: layouts, pack/unpack against a reference, bad input, parallel packing, and
//! typed sends/receives (eager and rendezvous).

mod common;

use std::time::Duration;

use common::within;
use weft::{Datatype, Error, ProgressMode, Runtime, Source, Tag};

/// Reference: the selected offsets, in packed order.
fn offsets_vector(count: usize, blocklen: usize, stride: usize) -> Vec<usize> {
    (0..count).flat_map(|b| (0..blocklen).map(move |j| b * stride + j)).collect()
}

#[test]
fn layouts_size_extent_and_round_trip() {
    let v = Datatype::<u32>::vector(5, 3, 7).unwrap();
    assert_eq!((v.size(), v.extent(), v.size_bytes(), v.extent_bytes()), (15, 31, 60, 124));
    let src: Vec<u32> = (0..31).collect();
    let mut packed = vec![0; 15];
    assert_eq!(v.pack(&src, &mut packed).unwrap(), 15);
    let want: Vec<u32> = offsets_vector(5, 3, 7).iter().map(|&o| o as u32).collect();
    assert_eq!(packed, want);
    let mut back = vec![u32::MAX; 31];
    v.unpack(&packed, &mut back).unwrap();
    for (i, x) in back.iter().enumerate() {
        if want.contains(&(i as u32)) {
            assert_eq!(*x, i as u32);
        } else {
            assert_eq!(*x, u32::MAX, "gap {i} written");
        }
    }

    let ix = Datatype::<f64>::indexed(&[2, 0, 1, 3], &[10, 99, 0, 4]).unwrap();
    assert_eq!((ix.size(), ix.extent()), (6, 12));
    let src: Vec<f64> = (0..12).map(f64::from).collect();
    assert_eq!(ix.pack_to_vec(&src).unwrap(), vec![10.0, 11.0, 0.0, 4.0, 5.0, 6.0]);

    let c = Datatype::<u8>::contiguous(4).unwrap();
    assert_eq!(c.pack_to_vec(b"abcdef").unwrap(), b"abcd");
    // Empty types are fine.
    assert_eq!(Datatype::<u8>::vector(0, 4, 8).unwrap().size(), 0);
    assert_eq!(Datatype::<u8>::indexed(&[], &[]).unwrap().extent(), 0);

    // Partial unpack fills the layout in order.
    let mut out = vec![0u32; 31];
    assert_eq!(v.unpack(&[1, 2, 3, 4], &mut out).unwrap(), 4);
    assert_eq!((out[0], out[1], out[2], out[7], out[8]), (1, 2, 3, 4, 0));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(matches!(Datatype::<u8>::vector(3, 4, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::vector(usize::MAX, 2, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u64>::vector(2, 1, usize::MAX / 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::indexed(&[1, 2], &[0]), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::indexed(&[4, 2], &[0, 3]), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::indexed(&[1], &[usize::MAX]), Err(Error::InvalidArgument(_))));
    let v = Datatype::<u16>::vector(4, 2, 3).unwrap();
    let mut dst = vec![0u16; 8];
    assert!(matches!(v.pack(&[0; 10], &mut dst), Err(Error::InvalidArgument(_))), "short source");
    assert!(matches!(v.pack(&[0; 11], &mut dst[..7]), Err(Error::InvalidArgument(_))), "short destination");
    assert!(matches!(v.unpack(&[0; 9], &mut [0; 11]), Err(Error::Truncated { message_len: 18, buffer_len: 16 })));
    assert!(matches!(v.unpack(&[0; 8], &mut [0; 10]), Err(Error::InvalidArgument(_))));
    let rt = Runtime::builder().env(false).workers(1).build().unwrap();
    assert!(rt.pack(&v, &[0; 3], &mut dst).is_err());
    let c = rt.world();
    assert!(matches!(c.isend_typed(&[0u16; 3], &v, 0, 0), Err(Error::InvalidArgument(_))));
    let mut small = [0u16; 3];
    assert!(matches!(c.irecv_typed(&mut small, &v, 0u32, 0), Err(Error::InvalidArgument(_))));
    let mut ok = [0u16; 11];
    assert!(matches!(c.irecv_typed(&mut ok, &v, 5u32, 0), Err(Error::RankOutOfRange { .. })));
}

#[test]
fn byte_sizes_never_overflow() {
    // `contiguous` checks its byte size like `vector` and `indexed`: a layout of more bytes
    // than a slice can hold is an error, so `size_bytes` and `extent_bytes` of any datatype
    // that was built cannot overflow (they used to panic in debug builds and wrap in
    // release ones).
    assert!(matches!(Datatype::<u64>::contiguous(usize::MAX), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u64>::contiguous(usize::MAX / 4), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::contiguous(usize::MAX), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u8>::vector(usize::MAX, 1, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(Datatype::<u64>::indexed(&[usize::MAX / 8], &[0]), Err(Error::InvalidArgument(_))));
    // The largest layouts allowed: exactly `isize::MAX` bytes.
    let max = isize::MAX as usize;
    let c = Datatype::<u8>::contiguous(max).unwrap();
    assert_eq!((c.size_bytes(), c.extent_bytes()), (max, max));
    let c = Datatype::<u64>::contiguous(max / 8).unwrap();
    assert_eq!((c.size_bytes(), c.extent_bytes()), (max / 8 * 8, max / 8 * 8));
    let v = Datatype::<u32>::vector(2, 1, max / 8).unwrap();
    assert_eq!((v.size_bytes(), v.extent_bytes()), (8, (max / 8 + 1) * 4));
    // Packing such a type with a buffer that cannot span it is an error, not a panic.
    assert!(matches!(c.pack_to_vec(&[1, 2]), Err(Error::InvalidArgument(_))));
}

#[test]
fn parallel_pack_matches_sequential() {
    for workers in [0, 1, 2] {
        let rt = Runtime::builder().env(false).workers(workers).pack_threshold(4096).build().unwrap();
        let v = Datatype::<u64>::vector(10_000, 5, 9).unwrap();
        let src: Vec<u64> = (0..v.extent() as u64).collect();
        let want = v.pack_to_vec(&src).unwrap();
        let mut got = vec![0u64; v.size()];
        assert_eq!(rt.pack(&v, &src, &mut got).unwrap(), v.size());
        assert_eq!(got, want, "workers {workers}");
        let mut back = vec![0u64; v.extent()];
        rt.unpack(&v, &got, &mut back).unwrap();
        let mut want_back = vec![0u64; v.extent()];
        v.unpack(&want, &mut want_back).unwrap();
        assert_eq!(back, want_back);

        let lens: Vec<usize> = (0..3000).map(|i| 1 + i % 13).collect();
        let mut displs = Vec::new();
        let mut at = 0;
        for &l in &lens {
            displs.push(at);
            at += l + 3;
        }
        displs.reverse(); // packed in the given (reversed) order
        let mut lens_r = lens.clone();
        lens_r.reverse();
        let ix = Datatype::<u32>::indexed(&lens_r, &displs).unwrap();
        let src: Vec<u32> = (0..ix.extent() as u32).collect();
        let mut got = vec![0u32; ix.size()];
        rt.pack(&ix, &src, &mut got).unwrap();
        assert_eq!(got, ix.pack_to_vec(&src).unwrap());
    }
}

#[test]
fn typed_send_and_receive_eager_and_rendezvous() {
    for mode in [ProgressMode::Owner, ProgressMode::Concurrent] {
        let ranks =
            Runtime::builder().env(false).progress(mode).workers(1).eager_threshold(4096).pack_threshold(64 * 1024).build_local(2).unwrap();
        for (count, blocklen, stride) in [(4, 2, 3), (1000, 3, 5), (100_000, 2, 3)] {
            let send_ty = Datatype::<f64>::vector(count, blocklen, stride).unwrap();
            // The receiver lays the same elements out differently: contiguous pairs in a
            // wider stride.
            let recv_ty = Datatype::<f64>::vector(count, blocklen, stride + 1).unwrap();
            let src: Vec<f64> = (0..send_ty.extent()).map(|i| i as f64).collect();
            let mut dst = vec![-1.0; recv_ty.extent()];
            std::thread::scope(|s| {
                s.spawn(|| {
                    let c = ranks[0].world();
                    let st = c.send_typed(&src, &send_ty, 1, 3).unwrap();
                    assert_eq!(st.bytes, send_ty.size_bytes());
                });
                let c = ranks[1].world();
                let st = c.recv_typed(&mut dst, &recv_ty, Source::Any, Tag::Is(3)).unwrap();
                assert_eq!((st.source, st.bytes), (0, recv_ty.size_bytes()));
            });
            for b in 0..count {
                for j in 0..blocklen {
                    assert_eq!(dst[b * (stride + 1) + j], (b * stride + j) as f64);
                }
                if b + 1 < count {
                    assert_eq!(dst[b * (stride + 1) + blocklen], -1.0);
                }
            }
        }
    }
}

#[test]
fn typed_receive_as_future_truncation_and_sync_object() {
    let ranks = Runtime::builder().env(false).workers(2).build_local(2).unwrap();
    let (c0, c1) = (ranks[0].world(), ranks[1].world());
    let ty = Datatype::<i32>::indexed(&[2, 2], &[6, 0]).unwrap();
    let mut dst = [0i32; 8];
    // As a future, driven by the runtime's block_on.
    let r = c1.irecv_typed(&mut dst, &ty, 0u32, 1).unwrap();
    c0.send(vec![1i32, 2, 3, 4], 1, 1).unwrap();
    let st = ranks[1].block_on(r).unwrap();
    assert_eq!(st.bytes, 16);
    assert_eq!(dst, [3, 4, 0, 0, 0, 0, 1, 2]);
    // Too long a message: Truncated, buffer untouched.
    let mut dst2 = [0i32; 8];
    let r = c1.irecv_typed(&mut dst2, &ty, 0u32, 2).unwrap();
    c0.send(vec![9i32; 5], 1, 2).unwrap();
    assert!(matches!(r.wait(), Err(Error::Truncated { message_len: 20, buffer_len: 16 })));
    assert_eq!(dst2, [0; 8]);
    // Attached to a sync object; unpacked after the completion is queued.
    let sync = ranks[1].sync_object::<u8>();
    let mut dst3 = [0i32; 8];
    let mut r = c1.irecv_typed(&mut dst3, &ty, 0u32, 3).unwrap();
    sync.attach(&mut r, 7).unwrap();
    c0.send(vec![5i32, 6, 7, 8], 1, 3).unwrap();
    let c = sync.wait_any().unwrap();
    assert_eq!(c.data, 7);
    r.wait().unwrap();
    assert_eq!(dst3, [7, 8, 0, 0, 0, 0, 5, 6]);
}

#[test]
fn empty_types_and_dropped_typed_receives() {
    let ranks = Runtime::builder().env(false).workers(1).build_local(2).unwrap();
    let (c0, c1) = (ranks[0].world(), ranks[1].world());
    // An empty datatype: an empty message, nothing written.
    let empty = Datatype::<u64>::vector(0, 3, 5).unwrap();
    let mut dst: [u64; 0] = [];
    let r = c1.irecv_typed(&mut dst, &empty, 0u32, 1).unwrap();
    assert_eq!(c0.send_typed(&[], &empty, 1, 1).unwrap().bytes, 0);
    assert_eq!(r.wait().unwrap().bytes, 0);
    // A typed receive dropped before its message: the buffer is never written, and the
    // message goes to the next matching receive.
    let ty = Datatype::<u8>::vector(2, 1, 2).unwrap();
    let mut a = [0u8; 3];
    drop(c1.irecv_typed(&mut a, &ty, 0u32, 2).unwrap());
    c0.send_typed(&[7, 0, 9], &ty, 1, 2).unwrap();
    assert_eq!(a, [0, 0, 0]);
    let mut b = [0u8; 3];
    c1.recv_typed(&mut b, &ty, Source::Any, Tag::Any).unwrap();
    assert_eq!(b, [7, 0, 9]);
}

/// A one-rank runtime whose packs of 1 KiB or more are split over one worker.
fn splitting_rank() -> Runtime {
    Runtime::builder().env(false).workers(1).pack_threshold(1024).build_local(1).unwrap().remove(0)
}

/// Runs `scenario` 200 times on a communicator clone of a fresh rank whose last `Runtime`
/// handle another thread drops 0.2 to 3.2 ms in (spread so the drop lands before, during
/// and after the parallel pack); returns `(iteration, count)` for every run in which the
/// scenario counted wrong bytes.
fn racing_runtime_drop(what: &'static str, scenario: fn(weft::Communicator) -> usize) -> Vec<(u64, usize)> {
    within(120, what, move || {
        let mut bad = Vec::new();
        for it in 0..200u64 {
            let rt = splitting_rank();
            let c = rt.world().clone();
            let t = std::thread::spawn(move || scenario(c));
            std::thread::sleep(Duration::from_micros(200 + (it * 37) % 3000));
            drop(rt);
            let wrong = t.join().unwrap();
            if wrong != 0 {
                bad.push((it, wrong));
            }
        }
        bad
    })
}

#[test]
fn typed_send_racing_runtime_drop_sends_every_byte_packed() {
    // A typed send packs in parallel (pieces queued as pool tasks) on a communicator clone
    // while another thread drops the last `Runtime` handle. Pieces still queued at shutdown
    // are cancelled; the packing thread must then pack them itself. It used to count a
    // cancelled piece as done and send a buffer of which up to a quarter was never written
    // (uninitialised memory, reported Ok).
    let bad = racing_runtime_drop("typed sends racing a runtime drop", |c| {
        let ty = Datatype::<u8>::vector(1 << 18, 1, 2).unwrap();
        let data: Vec<u8> = (0..ty.extent()).map(|i| if i % 2 == 0 { (i / 2 % 251) as u8 } else { 255 }).collect();
        let r = c.irecv(Vec::<u8>::with_capacity(ty.size()), 0, 1).unwrap();
        let s = c.isend_typed(&data, &ty, 0, 1).unwrap();
        let (buf, _) = r.wait().unwrap();
        s.wait().unwrap();
        let want: Vec<u8> = (0..ty.size()).map(|i| (i % 251) as u8).collect();
        buf.iter().zip(&want).filter(|(a, b)| a != b).count() + want.len().abs_diff(buf.len())
    });
    assert!(bad.is_empty(), "(iteration, bytes not packed) of 262,144: {bad:?}");
}

#[test]
fn typed_receive_racing_runtime_drop_unpacks_every_byte() {
    // The same race on the receiving side: `TypedRecv::wait` unpacks in parallel while the
    // runtime is dropped; every element of the layout is written, the gaps are not.
    let bad = racing_runtime_drop("typed receives racing a runtime drop", |c| {
        let ty = Datatype::<u8>::vector(1 << 18, 1, 2).unwrap();
        let mut dst = vec![255u8; ty.extent()];
        let r = c.irecv_typed(&mut dst, &ty, 0u32, 1).unwrap();
        let packed: Vec<u8> = (0..ty.size()).map(|i| (i % 251) as u8).collect();
        c.send(packed, 0, 1).unwrap();
        r.wait().unwrap();
        dst.iter().enumerate().filter(|&(i, &x)| x != if i % 2 == 0 { (i / 2 % 251) as u8 } else { 255 }).count()
    });
    assert!(bad.is_empty(), "(iteration, elements not unpacked) of 262,144: {bad:?}");
}
