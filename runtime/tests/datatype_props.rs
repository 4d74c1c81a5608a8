//! Property tests of datatypes against an offset-by-offset reference: random contiguous,
//! vector and indexed layouts (valid or not), packed and unpacked on this thread, split into
//! pool tasks across pack thresholds and worker counts, and received as typed messages of
//! any length up to the layout's size (partial unpacks; eager and rendezvous). Shrunk
//! failures are kept in `runtime/tests/datatype_props.proptest-regressions`.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use weft::{Datatype, Error, Runtime};

/// A layout as generated.
#[derive(Clone, Debug)]
enum Layout {
    Contiguous(usize),
    Vector {
        count: usize,
        blocklen: usize,
        stride: usize,
    },
    /// `(block length, displacement)` pairs, in packed order.
    Indexed(Vec<(usize, usize)>),
}

impl Layout {
    /// The reference: the buffer offset of every selected element, in packed order; `None`
    /// for a layout a constructor must refuse (overlapping blocks).
    fn offsets(&self) -> Option<Vec<usize>> {
        match *self {
            Layout::Contiguous(n) => Some((0..n).collect()),
            Layout::Vector { count, blocklen, stride } => {
                if count > 1 && stride < blocklen {
                    return None;
                }
                Some((0..count).flat_map(|b| (0..blocklen).map(move |j| b * stride + j)).collect())
            }
            Layout::Indexed(ref blocks) => {
                let offs: Vec<usize> = blocks.iter().flat_map(|&(len, at)| at..at + len).collect();
                let mut sorted = offs.clone();
                sorted.sort_unstable();
                sorted.dedup();
                (sorted.len() == offs.len()).then_some(offs)
            }
        }
    }

    fn build(&self) -> Result<Datatype<u32>, Error> {
        match self {
            Layout::Contiguous(n) => Datatype::contiguous(*n),
            Layout::Vector { count, blocklen, stride } => Datatype::vector(*count, *blocklen, *stride),
            Layout::Indexed(blocks) => {
                let lens: Vec<usize> = blocks.iter().map(|b| b.0).collect();
                let displs: Vec<usize> = blocks.iter().map(|b| b.1).collect();
                Datatype::indexed(&lens, &displs)
            }
        }
    }
}

/// Layouts of up to `scale` elements or so, about a third of the indexed ones overlapping.
fn layout(scale: usize) -> impl Strategy<Value = Layout> {
    prop_oneof![
        (0..scale * 2).prop_map(Layout::Contiguous),
        (0..scale / 2 + 2, 0..6usize, 0..10usize).prop_map(|(count, blocklen, stride)| Layout::Vector { count, blocklen, stride }),
        prop::collection::vec((0..6usize, 0..scale * 2), 0..12).prop_map(Layout::Indexed),
    ]
}

/// A layout the constructors accept, with its reference offsets.
fn valid_layout(scale: usize) -> impl Strategy<Value = (Layout, Vec<usize>)> {
    layout(scale).prop_filter_map("overlapping blocks", |l| l.offsets().map(|o| (l, o)))
}

/// `extent` elements with distinct values (the source of a pack).
fn source(extent: usize) -> Vec<u32> {
    (0..extent as u32).map(|i| i.wrapping_mul(2_654_435_761) | 1).collect()
}

/// What unpacking the first `n` packed elements into a buffer of `len` elements that
/// holds `FILL` must give.
fn unpacked(offs: &[usize], packed: &[u32], n: usize, len: usize) -> Vec<u32> {
    let mut want = vec![FILL; len];
    for (k, &o) in offs.iter().take(n).enumerate() {
        want[o] = packed[k];
    }
    want
}

/// What unpacking never writes: a gap between blocks keeps it.
const FILL: u32 = 0xdead_beef;

fn extent_of(offs: &[usize]) -> usize {
    offs.iter().max().map_or(0, |m| m + 1)
}

proptest! {
    // Fewer cases under Miri, which interprets every copy.
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 24 } else { 1024 }, ..ProptestConfig::default() })]

    /// Constructors accept exactly the layouts without overlapping blocks; size and extent,
    /// pack, `pack_to_vec` and unpacks of every prefix agree with the offsets; buffers too
    /// short are refused with an error.
    #[test]
    fn layouts_pack_and_unpack_offset_by_offset(l in layout(32), cut in any::<prop::sample::Index>()) {
        let ty = l.build();
        let Some(offs) = l.offsets() else {
            prop_assert!(matches!(ty, Err(Error::InvalidArgument(_))), "{:?} overlaps: refused, got {:?}", l, ty);
            return Ok(());
        };
        let ty = ty.map_err(|e| TestCaseError::fail(format!("{l:?} refused: {e}")))?;
        let extent = extent_of(&offs);
        prop_assert_eq!((ty.size(), ty.extent()), (offs.len(), extent));
        prop_assert_eq!((ty.size_bytes(), ty.extent_bytes()), (offs.len() * 4, extent * 4));
        let src = source(extent + 3);
        let want: Vec<u32> = offs.iter().map(|&o| src[o]).collect();
        let mut packed = vec![FILL; offs.len() + 2];
        prop_assert_eq!(ty.pack(&src, &mut packed), Ok(offs.len()));
        prop_assert_eq!(&packed[..offs.len()], &want[..]);
        prop_assert!(packed[offs.len()..].iter().all(|&x| x == FILL), "pack wrote past the size");
        prop_assert_eq!(ty.pack_to_vec(&src[..extent]), Ok(want.clone()));
        // Any prefix of the packed elements fills the layout in order, nothing else.
        let n = if offs.is_empty() { 0 } else { cut.index(offs.len() + 1) };
        let mut dst = vec![FILL; extent + 2];
        prop_assert_eq!(ty.unpack(&want[..n], &mut dst), Ok(n));
        prop_assert_eq!(dst, unpacked(&offs, &want, n, extent + 2));
        if extent > 0 {
            let short_src = ty.pack(&src[..extent - 1], &mut packed);
            prop_assert!(matches!(short_src, Err(Error::InvalidArgument(_))), "short source: {:?}", short_src);
            let short_dst = ty.unpack(&want, &mut vec![0; extent - 1]);
            prop_assert!(matches!(short_dst, Err(Error::InvalidArgument(_))), "short destination: {:?}", short_dst);
        }
        let long = ty.unpack(&vec![0u32; offs.len() + 1], &mut vec![0; extent]);
        prop_assert!(matches!(long, Err(Error::Truncated { .. })), "more than the size: {:?}", long);
    }
}

/// A test runner for the properties below, which share runtimes between cases (built once:
/// a runtime per case would cost threads per case). Failures are kept beside this file's.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config { cases, source_file: Some(file!()), ..Config::default() })
}

/// Packs and unpacks split into pool tasks (the pack threshold from 4 bytes up, 0-3
/// workers) give what the offsets say, for whole and partial unpacks.
#[test]
fn parallel_packs_split_across_thresholds_and_workers_match_the_offsets() {
    let mut rts = Vec::new();
    for workers in [0, 1, 3] {
        for threshold in [4, 64, 256 << 10] {
            rts.push(Runtime::builder().env(false).workers(workers).pack_threshold(threshold).build().unwrap());
        }
    }
    let strategy = (valid_layout(400), any::<prop::sample::Index>(), any::<prop::sample::Index>());
    runner(192)
        .run(&strategy, |((l, offs), which, cut)| {
            let rt = &rts[which.index(rts.len())];
            let what = format!("{l:?} on {} workers, threshold {}", rt.config().workers, rt.config().pack_threshold);
            let ty = l.build().map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
            let extent = extent_of(&offs);
            let src = source(extent);
            let want: Vec<u32> = offs.iter().map(|&o| src[o]).collect();
            let mut packed = vec![FILL; offs.len()];
            prop_assert_eq!(rt.pack(&ty, &src, &mut packed), Ok(offs.len()), "{}", what);
            prop_assert_eq!(&packed, &want, "{}", what);
            let n = if offs.is_empty() { 0 } else { cut.index(offs.len() + 1) };
            for n in [offs.len(), n] {
                let mut dst = vec![FILL; extent];
                prop_assert_eq!(rt.unpack(&ty, &want[..n], &mut dst), Ok(n), "{}", what);
                prop_assert_eq!(dst, unpacked(&offs, &want, n, extent), "{} (first {} of {})", what, n, offs.len());
            }
            Ok(())
        })
        .unwrap();
}

/// A message of any length up to the layout's size, received with the layout, fills the
/// layout in order (eager messages and, past 64 bytes, rendezvous ones); a longer one is
/// refused as truncated.
#[test]
fn typed_receives_of_any_length_unpack_the_prefix() {
    let rt = Runtime::builder().env(false).workers(1).eager_threshold(64).pack_threshold(16).build().unwrap();
    let comm = rt.world();
    let strategy = (valid_layout(100), any::<prop::sample::Index>(), any::<bool>());
    runner(128)
        .run(&strategy, |((l, offs), cut, longer)| {
            let ty = l.build().map_err(|e| TestCaseError::fail(format!("{l:?}: {e}")))?;
            let extent = extent_of(&offs);
            let n = if longer { offs.len() + 1 } else { cut.index(offs.len() + 1) };
            let msg = source(n);
            let mut dst = vec![FILL; extent];
            let recv = comm.irecv_typed(&mut dst, &ty, 0u32, 5).unwrap();
            comm.send(msg.clone(), 0, 5).unwrap();
            let got = recv.wait();
            if longer {
                let truncated = matches!(got, Err(Error::Truncated { .. }));
                prop_assert!(truncated, "{:?}: {} elements into {}: {:?}", l, n, offs.len(), got);
                return Ok(());
            }
            prop_assert_eq!(got.map(|st| st.bytes), Ok(n * 4), "{:?}", l);
            prop_assert_eq!(dst, unpacked(&offs, &msg, n, extent), "{:?}: first {} of {}", l, n, offs.len());
            Ok(())
        })
        .unwrap();
}
