//! Property test of context ids: random schedules of `dup` and `free` (and traffic on the
//! communicators in between) over 2 to 4 in-process ranks, every rank running the same
//! schedule on a thread of its own. Every rank agrees on each communicator's context id,
//! the live ids of a rank are distinct, a slot reused for a new communicator comes with a
//! newer generation, and a message left unreceived on a freed communicator never reaches
//! one created after it — nor does one still in flight when its receiver freed that
//! communicator and reused its slot for a new one (`Step::Late`: the frame comes in after
//! the new communicator is installed, so only its generation tells it apart). Shrunk
//! failures are kept in `runtime/tests/context_ids_props.proptest-regressions`.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use weft::{Communicator, Runtime, Source, Tag};

/// One step of a schedule; indices pick among the live communicators (modulo their count).
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Duplicate a live communicator (collective).
    Dup(usize),
    /// Leave a message unreceived on a live communicator (not the world), then free it.
    Free(usize),
    /// Every rank sends every other a message on a live communicator, and receives theirs.
    Talk(usize),
    /// Every rank but 0 frees a live communicator (not the world) and creates one over
    /// themselves, likely in the freed slot; then rank 0, which still holds the freed one,
    /// sends on it to rank 1 (a frame in flight on a communicator its receiver freed), and
    /// frees it. Rank 1 must never see that message on its new communicator.
    Late(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<usize>().prop_map(Step::Dup),
        2 => any::<usize>().prop_map(Step::Free),
        2 => any::<usize>().prop_map(Step::Talk),
        1 => any::<usize>().prop_map(Step::Late)
    ]
}

/// The bits of a context id that name its slot (the rest count the slot's generations).
const SLOT_MASK: u32 = (1 << 12) - 1;

/// A message: the step that sent it and the step that created its communicator.
fn message(step: usize, born: usize) -> Vec<u64> {
    vec![step as u64, born as u64]
}

/// One rank's run of `steps`: the context id of every communicator it created, in order.
fn run_rank(rt: &Runtime, steps: &[Step]) -> Result<Vec<u32>, String> {
    let (me, n) = (rt.rank(), rt.size());
    // Live communicators and the step that created each (the world: none).
    let mut live: Vec<(Communicator, usize)> = vec![(rt.world().clone(), usize::MAX)];
    let mut created = Vec::new();
    // The generation each slot had when last used on this rank.
    let mut generations = std::collections::HashMap::new();
    for (k, &s) in steps.iter().enumerate() {
        match s {
            Step::Dup(i) => {
                let c = live[i % live.len()].0.dup().map_err(|e| format!("step {k}: dup: {e}"))?;
                let id = c.context_id();
                if let Some((other, _)) = live.iter().find(|(l, _)| l.context_id() == id) {
                    return Err(format!("step {k}: context id {id:#x} of a new communicator is live already ({other:?})"));
                }
                if let Some(&g) = generations.get(&(id & SLOT_MASK)) {
                    if id >> 12 <= g {
                        return Err(format!("step {k}: slot {} reused with generation {} after {g}", id & SLOT_MASK, id >> 12));
                    }
                }
                generations.insert(id & SLOT_MASK, id >> 12);
                created.push(id);
                live.push((c, k));
            }
            Step::Late(i) if live.len() > 1 => {
                let (c, born) = live.remove(1 + i % (live.len() - 1));
                late(rt, c, born, k)?;
            }
            Step::Free(i) if live.len() > 1 => {
                let (c, born) = live.remove(1 + i % (live.len() - 1));
                c.send(message(k, born), (me + 1) % n, 1).map_err(|e| format!("step {k}: leftover send: {e}"))?;
                c.free();
            }
            Step::Free(_) | Step::Late(_) => {}
            Step::Talk(i) => {
                let (c, born) = &live[i % live.len()];
                let sends: Vec<_> = (0..n)
                    .filter(|&r| r != me)
                    .map(|r| c.isend(message(k, *born), r, 2))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("step {k}: send: {e}"))?;
                // From each rank in turn (a faster rank may already send its next step's
                // message on this communicator), with any tag: a leftover message of a freed
                // communicator delivered here would come first.
                for from in (0..n).filter(|&r| r != me) {
                    let (got, st) = c
                        .recv(Vec::<u64>::with_capacity(2), Source::Rank(from), Tag::Any)
                        .map_err(|e| format!("step {k}: receive: {e}"))?;
                    if got != message(k, *born) || st.tag != 2 {
                        return Err(format!(
                            "step {k}: on the communicator of step {born}, got {got:?} (tag {}) from rank {}: a message of another communicator",
                            st.tag, st.source
                        ));
                    }
                }
                let mut sends = sends;
                weft::wait_all(&mut sends).map_err(|e| format!("step {k}: sends: {e}"))?;
            }
        }
    }
    Ok(created)
}

/// World tags of [`Step::Late`]'s hand-shake (rank 1's new communicator is installed; rank
/// 0's late message is sent), apart from the schedule's tags 1 and 2.
const READY: i32 = 5;
const SENT: i32 = 6;

/// One rank's part of [`Step::Late`] on communicator `c` (created at step `born`).
fn late(rt: &Runtime, c: Communicator, born: usize, k: usize) -> Result<(), String> {
    let world = rt.world();
    let err = |what: &str, e: weft::Error| format!("step {k}: {what}: {e}");
    let old = c.context_id();
    if rt.rank() == 0 {
        // Until rank 1 has its new communicator, in whatever slot it got.
        world.recv(Vec::<u8>::with_capacity(0), Source::Rank(1), READY).map_err(|e| err("ready", e))?;
        c.send(message(k, born), 1, 1).map_err(|e| err("late send", e))?;
        // Behind the late frame on the same channel: when rank 1 has this, it has handled
        // that one too.
        world.send(Vec::<u8>::new(), 1, SENT).map_err(|e| err("sent", e))?;
        c.free();
        return Ok(());
    }
    c.free();
    let others = world.group().excl(&[0]).map_err(|e| err("group", e))?;
    let fresh = world.create_group(&others, 7).map_err(|e| err("create_group", e))?;
    if rt.rank() == 1 {
        world.send(Vec::<u8>::new(), 0, READY).map_err(|e| err("ready", e))?;
        world.recv(Vec::<u8>::with_capacity(0), Source::Rank(0), SENT).map_err(|e| err("sent", e))?;
        if let Some(st) = fresh.iprobe(Source::Any, Tag::Any).map_err(|e| err("probe", e))? {
            return Err(format!(
                "step {k}: a message (tag {}, {} bytes) on the communicator that took the slot of step {born}'s, whose frame came after it was freed (ids {:#x} then {:#x})",
                st.tag,
                st.bytes,
                old,
                fresh.context_id()
            ));
        }
    }
    fresh.free();
    Ok(())
}

/// Runs `steps` on `n` in-process ranks, each on a thread of its own, and checks that they
/// agree on every id.
fn case(n: u32, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let steps2 = steps.clone();
    let ids = common::within(120, "a dup/free schedule", move || {
        let ranks = Runtime::builder().env(false).workers(0).cris(1).build_local(n).unwrap();
        std::thread::scope(|s| {
            // A rank that fails says why at once: the others then wait for it in a
            // collective, and the bound ends the case.
            let hs: Vec<_> =
                ranks.iter().map(|rt| s.spawn(|| run_rank(rt, &steps2).inspect_err(|e| eprintln!("rank {}: {e}", rt.rank())))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    });
    let mut first: Option<&Vec<u32>> = None;
    for (r, got) in ids.iter().enumerate() {
        let got = got.as_ref().map_err(|e| TestCaseError::fail(format!("rank {r}: {e}")))?;
        match first {
            None => first = Some(got),
            Some(f) => prop_assert_eq!(f, got, "rank {} disagrees with rank 0 on the context ids ({:?})", r, steps),
        }
    }
    Ok(())
}

#[test]
fn dup_and_free_schedules_keep_context_ids_consistent_and_messages_apart() {
    let strategy = (2u32..=4, prop::collection::vec(step(), 1..40));
    let mut runner = TestRunner::new(Config { cases: 48, source_file: Some(file!()), ..Config::default() });
    runner.run(&strategy, |(n, steps)| case(n, steps)).unwrap();
}

/// The shrunk schedule that caught frames of a freed communicator delivered to the one that
/// reused its slot (a state looked up by slot alone, generation unchecked).
#[test]
fn a_late_frame_never_reaches_the_communicator_that_reused_its_slot() {
    for n in [2, 4] {
        case(n, vec![Step::Dup(0), Step::Late(0)]).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
