//! Property tests of the matching engine: random sequences of posts, arrivals (in any order,
//! so frames come out of sequence), cancels, wildcards and merges of tag partitions, driven
//! through [`MatchState`] the way the engine drives it (a state per tag partition until the
//! first `Tag::Any`, or per tag partition and source until the first `Source::Any`; trims
//! and switches when a state asks for them), and checked after every
//! step against MPI's rules kept by a naive model of what was posted and what arrived:
//!
//! * a receive and the frame it gets fit each other;
//! * the earliest posted receive that fits a frame gets it (no receive still posted before
//!   it fits);
//! * FIFO per source: a receive never gets a frame while an earlier frame of the same
//!   source that fits it has arrived and is still unmatched;
//! * a cancel succeeds exactly for a receive still posted;
//! * nothing is lost or duplicated: once every frame has arrived, each frame was paired
//!   once or is handed back by `drain`, each receive paired once, cancelled or drained,
//!   and no drained receive fits a drained frame;
//! * the processed-number windows stay bounded and nothing waits in the far list.
//!
//! Shrunk failures are kept in `runtime/proptest-regressions/matching/props.txt`.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use weft_transport::{Frame, FrameKind, Header, Payload};

use super::{fits, Due, MatchState, Matches, Order, Source, Tag};
use crate::operation::Operation;

/// Ranks that send (the communicator's size; with [`PARTS`] states, sources 0 and 4 share
/// an offset in the layout by source).
const SOURCES: u32 = 5;
/// Tags in use; with [`PARTS`] partitions, tags 0 and 4 share a partition.
const TAGS: i32 = 6;
/// Tag partitions of a partitioned state.
const PARTS: usize = 4;

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Step {
    /// Post a receive (`None`: the wildcard).
    Post(Option<u32>, Option<i32>),
    /// The next frame of the arrival order arrives.
    Arrive,
    /// Cancel the receive posted `n`th among those still posted (modulo their number).
    Cancel(usize),
    /// Switch a partitioned state to one order now (what a `Tag::Any` probe does).
    Merge,
    /// Move states laid out by source to the layout by tag now (what a `Source::Any` probe
    /// does).
    ByTag,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (prop::option::weighted(0.8, 0..SOURCES), prop::option::weighted(0.85, 0..TAGS)).prop_map(|(s, t)| Step::Post(s, t)),
        4 => Just(Step::Arrive),
        1 => any::<usize>().prop_map(Step::Cancel),
        1 => Just(Step::Merge),
        1 => Just(Step::ByTag),
    ]
}

/// A sequence: the frames each source sends (their tags, in send order), the order they
/// arrive in (a permutation), and the steps.
fn sequence() -> impl Strategy<Value = (Vec<(u32, i32)>, Vec<usize>, Vec<Step>)> {
    prop::collection::vec((0..SOURCES, 0..TAGS), 0..24).prop_flat_map(|frames| {
        let order: Vec<usize> = (0..frames.len()).collect();
        (Just(frames), Just(order).prop_shuffle(), prop::collection::vec(step(), 0..48))
    })
}

/// What the model knows of a frame.
#[derive(Clone, Copy, Debug)]
struct Sent {
    source: u32,
    tag: i32,
    /// Send order of its source over every tag.
    gseq: u32,
}

/// What the model knows of a receive.
#[derive(Clone, Copy, Debug)]
struct Recv {
    source: Source,
    tag: Tag,
    /// Still posted (not paired, not cancelled).
    live: bool,
}

/// The engine's states for one communicator at one rank, and the naive model.
struct Harness {
    order: Order,
    parts: Vec<MatchState>,
    /// States laid out by (tag partition + source), not by tag partition.
    by_source: bool,
    switched: bool,
    frames: Vec<Sent>,
    /// Each frame's header, numbered as its sender numbers it.
    headers: Vec<Header>,
    arrived: Vec<bool>,
    paired_frame: Vec<bool>,
    recvs: Vec<Recv>,
    ops: Vec<Arc<Operation>>,
    by_op: HashMap<*const Operation, usize>,
}

impl Harness {
    fn new(order: Order, by_source: bool, sent: &[(u32, i32)]) -> Self {
        let parts = if order == Order::Partition { PARTS } else { 1 };
        let mut seq: HashMap<(u32, usize), u32> = HashMap::new();
        let mut gseq: HashMap<u32, u32> = HashMap::new();
        let mut frames = Vec::new();
        let mut headers = Vec::new();
        for (id, &(source, tag)) in sent.iter().enumerate() {
            let chan = if parts > 1 { tag as usize % PARTS } else { 0 };
            let s = seq.entry((source, chan)).or_default();
            let g = gseq.entry(source).or_default();
            headers.push(Header {
                kind: FrameKind::Eager,
                src_cri: 0,
                context: 0,
                source,
                tag,
                seq: *s,
                gseq: *g,
                chan: chan as u16,
                len: 0,
                cookie: id as u64,
                key: 0,
                addr: 0,
            });
            frames.push(Sent { source, tag, gseq: *g });
            *s += 1;
            *g += 1;
        }
        Harness {
            order,
            parts: (0..parts).map(|_| MatchState::new(SOURCES, order)).collect(),
            by_source: by_source && parts > 1,
            switched: false,
            arrived: vec![false; frames.len()],
            paired_frame: vec![false; frames.len()],
            frames,
            headers,
            recvs: Vec::new(),
            ops: Vec::new(),
            by_op: HashMap::new(),
        }
    }

    /// The state where `source` and `tag` are matched (the engine's `CommState::part_in`).
    fn part(&self, source: Source, tag: Tag) -> usize {
        match (source, tag) {
            _ if self.switched || self.parts.len() == 1 => 0,
            (Source::Rank(s), Tag::Is(t)) if self.by_source => (t as usize % PARTS + s as usize) % PARTS,
            (_, Tag::Is(t)) => t as usize % PARTS,
            (_, Tag::Any) => 0,
        }
    }

    /// Moves states laid out by source to the layout by tag.
    fn by_tag(&mut self) {
        if self.by_source && !self.switched {
            let mut refs: Vec<&mut MatchState> = self.parts.iter_mut().collect();
            MatchState::by_tag(&mut refs);
        }
        self.by_source = false;
    }

    fn merge(&mut self) -> Result<(), TestCaseError> {
        if self.parts.len() == 1 || self.switched {
            return Ok(());
        }
        let mut out = Matches::default();
        let mut refs: Vec<&mut MatchState> = self.parts.iter_mut().collect();
        MatchState::merge(&mut refs, &mut out);
        self.switched = true;
        self.pairs(out)
    }

    /// Checks and records the pairs a step made, in the order made.
    fn pairs(&mut self, out: Matches) -> Result<(), TestCaseError> {
        for m in &out.pairs {
            let r = self.by_op[&std::ptr::from_ref::<Operation>(&m.req)];
            self.pair(r, out.frames[m.at].header.cookie as usize)?;
        }
        Ok(())
    }

    fn pair(&mut self, r: usize, f: usize) -> Result<(), TestCaseError> {
        let (rv, fr) = (self.recvs[r], self.frames[f]);
        prop_assert!(rv.live, "receive {r} paired twice or after its cancel");
        prop_assert!(self.arrived[f] && !self.paired_frame[f], "frame {f} paired twice or before it arrived");
        prop_assert!(fits(rv.source, rv.tag, fr.source, fr.tag), "receive {r} {rv:?} got frame {f} {fr:?}, which it does not fit");
        if let Some(e) = (0..r).find(|&e| self.recvs[e].live && fits(self.recvs[e].source, self.recvs[e].tag, fr.source, fr.tag)) {
            return Err(TestCaseError::fail(format!(
                "frame {f} {fr:?} went to receive {r}, but receive {e} {:?} was posted earlier and fits",
                self.recvs[e]
            )));
        }
        if self.order != Order::Overtake {
            let earlier = (0..self.frames.len()).find(|&g| {
                let o = self.frames[g];
                g != f
                    && self.arrived[g]
                    && !self.paired_frame[g]
                    && o.source == fr.source
                    && o.gseq < fr.gseq
                    && fits(rv.source, rv.tag, o.source, o.tag)
            });
            if let Some(g) = earlier {
                return Err(TestCaseError::fail(format!(
                    "receive {r} {rv:?} got frame {f} {fr:?} while frame {g} {:?}, sent before it, had arrived unmatched",
                    self.frames[g]
                )));
            }
        }
        self.recvs[r].live = false;
        self.paired_frame[f] = true;
        Ok(())
    }

    fn post(&mut self, source: Source, tag: Tag) -> Result<(), TestCaseError> {
        if tag == Tag::Any {
            self.merge()?;
        } else if source == Source::Any {
            self.by_tag();
        }
        let op = Arc::new(Operation::held());
        let r = self.recvs.len();
        self.by_op.insert(Arc::as_ptr(&op), r);
        self.recvs.push(Recv { source, tag, live: true });
        let part = self.part(source, tag);
        let mut early = None;
        self.parts[part].post_into(source, tag, &op, &mut early);
        self.ops.push(op);
        if let Some(frame) = early {
            self.pair(r, frame.header.cookie as usize)?;
        }
        Ok(())
    }

    fn arrive(&mut self, f: usize) -> Result<(), TestCaseError> {
        self.arrived[f] = true;
        let h = self.headers[f];
        let part = self.part(Source::Rank(h.source), Tag::Is(h.tag));
        let mut out = Matches::default();
        self.parts[part].arrive(Frame { header: h, payload: Payload::Empty }, &mut out);
        self.pairs(out)?;
        match self.parts[part].take_due() {
            Due::None => {}
            Due::Trim => {
                let mut refs: Vec<&mut MatchState> = self.parts.iter_mut().collect();
                MatchState::trim(&mut refs);
            }
            Due::Switch => self.merge()?,
            Due::Release => return Err(TestCaseError::fail("no tag is forgotten here")),
        }
        Ok(())
    }

    fn cancel(&mut self, n: usize) -> Result<(), TestCaseError> {
        let live: Vec<usize> = (0..self.recvs.len()).filter(|&r| self.recvs[r].live).collect();
        // A receive already paired or cancelled: the cancel must fail.
        let r = if live.is_empty() || n % 3 == 0 { n % self.recvs.len().max(1) } else { live[n % live.len()] };
        let Some(op) = self.ops.get(r).cloned() else { return Ok(()) };
        let done = self.parts.iter_mut().any(|m| m.cancel(&op));
        prop_assert_eq!(done, self.recvs[r].live, "cancel of receive {} {:?}", r, self.recvs[r]);
        self.recvs[r].live = false;
        Ok(())
    }

    /// Every frame arrives; then nothing may be lost.
    fn finish(&mut self, order: &[usize]) -> Result<(), TestCaseError> {
        for &f in order {
            if !self.arrived[f] {
                self.arrive(f)?;
            }
        }
        for m in &self.parts {
            prop_assert!(m.far.is_empty() && m.parked.is_empty(), "frames left out of order after every frame arrived");
            for s in &m.seen {
                prop_assert!(s.len() <= super::TRIM_WORDS + 1, "a processed-number window grew to {} words", s.len());
            }
        }
        let mut left_frames = Vec::new();
        let mut left_recvs = Vec::new();
        for m in &mut self.parts {
            left_recvs.extend(m.drain(|f| left_frames.push(f.header.cookie as usize)));
        }
        for f in 0..self.frames.len() {
            let n = left_frames.iter().filter(|&&x| x == f).count();
            prop_assert_eq!(n + usize::from(self.paired_frame[f]), 1, "frame {} {:?}: paired or left exactly once", f, self.frames[f]);
        }
        let left_recvs: Vec<usize> = left_recvs.iter().map(|op| self.by_op[&Arc::as_ptr(op)]).collect();
        for (r, rv) in self.recvs.iter().enumerate() {
            prop_assert_eq!(left_recvs.contains(&r), rv.live, "receive {} {:?}: drained exactly when still posted", r, rv);
        }
        for &r in &left_recvs {
            let rv = self.recvs[r];
            for &f in &left_frames {
                let fr = self.frames[f];
                prop_assert!(
                    !fits(rv.source, rv.tag, fr.source, fr.tag),
                    "receive {r} {rv:?} and frame {f} {fr:?} fit but were left unpaired"
                );
            }
        }
        Ok(())
    }
}

/// Runs a sequence on a state ordered by `order`.
fn run(order: Order, by_source: bool, sent: &[(u32, i32)], arrivals: &[usize], steps: &[Step]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(order, by_source, sent);
    let mut next = 0;
    for s in steps {
        match *s {
            Step::Post(src, tag) => {
                let source = src.map_or(Source::Any, Source::Rank);
                let tag = tag.map_or(Tag::Any, Tag::Is);
                h.post(source, tag)?;
            }
            Step::Arrive => {
                if let Some(&f) = arrivals.get(next) {
                    next += 1;
                    h.arrive(f)?;
                }
            }
            Step::Cancel(n) => h.cancel(n)?,
            Step::Merge => h.merge()?,
            Step::ByTag => h.by_tag(),
        }
    }
    h.finish(arrivals)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// One order per source (a communicator with one tag partition).
    #[test]
    fn one_order_matches_as_mpi_says((sent, arrivals, steps) in sequence()) {
        run(Order::Chan, false, &sent, &arrivals, &steps)?;
    }

    /// Tag partitions matched apart until a `Tag::Any` (or a merge step) switches them to
    /// one order.
    #[test]
    fn partitions_and_their_merge_match_as_mpi_says((sent, arrivals, steps) in sequence()) {
        run(Order::Partition, false, &sent, &arrivals, &steps)?;
    }

    /// States laid out by tag partition and source until a `Source::Any` (or a step) moves
    /// them to the layout by tag, and a `Tag::Any` (or a step) to one order; the moves at
    /// any point of a sequence.
    #[test]
    fn partitions_by_source_and_their_moves_match_as_mpi_says((sent, arrivals, steps) in sequence()) {
        run(Order::Partition, true, &sent, &arrivals, &steps)?;
    }

    /// One state ordered by the number over every tag (`MatchingMode::Global`).
    #[test]
    fn the_global_order_matches_as_mpi_says((sent, arrivals, steps) in sequence()) {
        run(Order::Gseq, false, &sent, &arrivals, &steps)?;
    }

    /// Overtaking allowed: no order, but the earliest fitting receive still wins and
    /// nothing is lost.
    #[test]
    fn overtaking_loses_nothing((sent, arrivals, steps) in sequence()) {
        run(Order::Overtake, false, &sent, &arrivals, &steps)?;
    }
}
