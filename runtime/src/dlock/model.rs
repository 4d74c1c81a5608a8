//! An exhaustive check of the lock protocols of [`super::queues`] (D-MCS, RMA-MCS, RMA-RW):
//! mutual exclusion and deadlock freedom over every interleaving of their window operations,
//! for 2-3 processes, as the seed checked its design with SPIN [Schmid 2016, §4.4].
//!
//! The model is the protocol of `queues.rs` transcribed step by step (the same words at the
//! same offsets, the same constants, the same "beyond the listing" steps), each step one
//! window operation done atomically: a put with its flush, a get, a fetch-and-op, a
//! compare-and-swap (a get of several words, the OWNER words, is one step, as a put of
//! them is). A spin on a word is a step that is enabled only once the word holds what the
//! spin waits for; a wait that reads two words (the writer's drain, the reader's barrier)
//! is a loop of steps. Every process is a writer or a reader and acquires the lock a fixed
//! number of times. The spin for the hand-off is the libfabric one: after a poll that
//! failed, the waiter marks its predecessor's NEXT parked (a compare-and-swap of its node to
//! its node and `NEXT_PARKED`) and, if the mark took, parks, and then moves only once a wake
//! frame came; if it did not (the word was claimed), STATUS is written. A hand-off is a put of
//! STATUS, then the claim of the node's NEXT (an atomic or of `NEXT_PASSED`), which sends
//! the frame if it found the mark (`Queues::pass`, beyond the listing 7 of `queues.rs`). A
//! lost wake-up is then a state that cannot finish, and a frame to a process that is not
//! parked, or a second one, fails the check.
//!
//! The explorer visits every reachable state once (breadth first, states hashed). It
//! checks in each state that at most one writer, and no reader beside a writer, is in the
//! critical section, and at the end that the final state (every process done) is reachable
//! from every reachable state: no deadlock (nobody can move) and no livelock (moves that
//! never finish). [`Mutation`]s break the protocol on purpose; the checks must fail then.
//!
//! Exhaustive search ends at 3 processes of 2 acquisitions. Beyond it, [`real`] runs the
//! code of `queues.rs` itself, not this transcription: each process's protocol future over
//! a window whose every operation is a step, under thousands of random schedules of 4-8
//! processes whose roles change from one acquisition to the next, checking the same
//! properties, with the hand-off's mark and wake frame as the code does them (the waiter's
//! wait on its frame a step at a time until one came). Such schedules meet, within a second, interleavings that threads meet once
//! in 10^5 acquisitions (a reset taking a negative DEPART, beyond the listing 6 of
//! `queues.rs`, let a writer in beside a reader). There a process may also end its part of
//! the words (drop its lock), right after its last release or while holding the lock: the
//! others' accesses to its words then fail and their waits see the end, as on a window.
//! The transcription leaves the end out: each of its steps would need a failing twin in
//! every process, a second transcription of the code's error paths, where the schedules
//! run those paths themselves.

use std::collections::{HashMap, VecDeque};

use super::levels::Machine;
use super::queues::{Layout, ACQUIRE_PARENT, ACQUIRE_START, MODE_CHANGE, NEXT_NODE, NEXT_PARKED, NEXT_PASSED, WAIT, WRITE};

/// The most levels a model has.
const MAXL: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    Writer,
    Reader,
}

/// A change that breaks the protocol, for showing that the checks find it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    None,
    /// A releasing writer whose successor has taken the tail but not yet linked itself
    /// leaves without waiting for it and passing it the lock (Listing 3, lines 6-10 lost).
    NoHandOff,
    /// A reader's reset clears the WRITE mark, as Listing 6 does in every reset (beyond
    /// the listing, 3).
    ReaderResetClearsWrite,
    /// A writer marks the counters WRITE but does not wait for the readers inside to leave
    /// (beyond the listing, 2).
    WriterSkipsDrain,
    /// A hand-off reads its node's NEXT (a get) instead of claiming it (an atomic that marks
    /// it passed), and sends the wake frame if the read found the parked mark.
    PassReadsMark,
    /// A hand-off sends the wake frame whether or not its claim found the parked mark.
    PassAlwaysWakes,
}

/// Where a process is: the next step it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pc {
    Done,
    /// In the critical section (its step leaves it).
    Cs,
    // Writer acquire (Listings 4 and 7).
    PrepNext,
    PrepStatus,
    SwapTail,
    LinkPred,
    SpinStatus,
    /// The mark of the predecessor's NEXT (compare-and-swap of its node to its node and
    /// `NEXT_PARKED`).
    MarkParked,
    /// Parked: moves only once a wake frame came (and takes it).
    Parked,
    /// Polls STATUS after a mark that failed with STATUS still `WAIT` (a broken protocol's
    /// state): enabled once it is not.
    PollStatus,
    GetOwners,
    AcqParent,
    MarkWrite,
    DrainArrive,
    DrainDepart,
    WriteMode,
    // Writer release (Listings 5, 8, 3).
    RelNext,
    RelStatus,
    RelOwners,
    RelPass,
    RootNextPlain,
    RootStatus,
    RootNext,
    LeaveCas,
    LeaveSpin,
    LeavePut,
    /// The claim of the node's NEXT after the put of a hand-off, and its frame.
    Claim,
    // reset_counter (Listing 6).
    ResetArrive,
    ResetDepart,
    ResetSubDepart,
    ResetSubArrive,
    // Reader (Listings 9 and 10).
    ReadAdd,
    ReadTail,
    ReadBack,
    BarrierArrive,
    BarrierTail,
}

/// Where a `reset_counter` goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Cont {
    /// Writer, next-stat reached `T_W`: read NEXT.
    RootNext,
    /// Writer, no successor: leave level 1.
    RootLeave,
    /// Reader at `T_R` with no writer: back off, then try again.
    ReadAgain,
    /// Reader in the barrier, no writer: try again.
    ReadAdd,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    pc: Pc,
    /// Acquisitions left, this one included.
    left: u8,
    /// The level index of the step.
    l: u8,
    /// The counter index of the step (writer's loops over the counters).
    j: u8,
    /// The last value read (status, predecessor, ARRIVE).
    v: u64,
    /// DEPART, read.
    d: u64,
    succ: [u64; MAXL],
    /// Per level, the rank whose node holds it.
    held: [u8; MAXL],
    /// The status a writer passes at level 1.
    stat: u64,
    /// Writer: the counters were reset in this release. Reader: try again at once.
    flag: bool,
    /// The running reset clears the WRITE mark.
    clear: bool,
    cont: Cont,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    mem: Vec<u64>,
    procs: Vec<Proc>,
    /// Per process, the wake frames sent to it and not yet taken.
    frames: Vec<u8>,
}

/// RMA-RW's counters: on which ranks, `T_R`, `T_W`.
struct Counters {
    ranks: Vec<u32>,
    t_r: i64,
    t_w: u64,
}

/// One configuration: processes, their machine, thresholds, a mutation.
struct Model {
    machine: Machine,
    roles: Vec<Role>,
    rounds: u8,
    t_l: Vec<u64>,
    counters: Option<Counters>,
    /// The counter of a reader is rank `p / t_dc * t_dc`.
    t_dc: u32,
    mutation: Mutation,
}

/// What the explorer found.
#[derive(Debug)]
struct Outcome {
    states: usize,
    /// The first state with two writers, or a reader and a writer, in the critical section.
    exclusion_broken: Option<String>,
    /// Reachable states from which the processes cannot all finish.
    stuck: usize,
    /// The first state with a wake frame astray ([`Model::frame_astray`]).
    frame_astray: Option<String>,
    /// Reachable states with a wake frame on its way to a parked waiter.
    frames_sent: usize,
    /// Steps in which a waiter's poll (before any mark) saw the hand-off.
    polled: usize,
    /// Steps in which a waiter's mark found its predecessor's NEXT already claimed.
    claimed_first: usize,
}

impl Model {
    fn n(&self) -> usize {
        self.machine.depth()
    }

    /// Where the words are, as in `Queues`.
    fn layout(&self) -> Layout {
        Layout(self.n())
    }

    fn at(&self, rank: u64, off: usize) -> usize {
        rank as usize * self.layout().words() + off
    }

    fn tail_at(&self, l: usize, p: u64) -> usize {
        self.at(u64::from(self.machine.tail_rank(l, p as u32)), Layout::tail(l))
    }

    fn initial(&self) -> State {
        let procs = (0..self.roles.len())
            .map(|i| {
                let mut p = Proc {
                    pc: Pc::Done,
                    left: self.rounds,
                    l: 0,
                    j: 0,
                    v: 0,
                    d: 0,
                    succ: [0; MAXL],
                    held: [0; MAXL],
                    stat: 0,
                    flag: false,
                    clear: false,
                    cont: Cont::RootNext,
                };
                self.start(&mut p, i);
                p
            })
            .collect();
        State { mem: vec![0; self.roles.len() * self.layout().words()], procs, frames: vec![0; self.roles.len()] }
    }

    /// The first step of an acquisition (or `Done`).
    fn start(&self, p: &mut Proc, i: usize) {
        if p.left == 0 {
            p.pc = Pc::Done;
            return;
        }
        match self.roles[i] {
            Role::Writer => {
                p.l = (self.n() - 1) as u8;
                p.held = [i as u8; MAXL];
                p.pc = Pc::PrepNext;
            }
            Role::Reader => {
                p.flag = false;
                p.pc = Pc::ReadAdd;
            }
        }
    }

    /// The reader's counter, or the writer's `j`-th, for a reset.
    fn reset_rank(&self, p: &Proc, i: usize) -> u64 {
        match self.roles[i] {
            Role::Reader => u64::from(i as u32 / self.t_dc * self.t_dc),
            Role::Writer => u64::from(self.counters.as_ref().expect("RMA-RW").ranks[p.j as usize]),
        }
    }

    fn counter_ranks(&self) -> usize {
        self.counters.as_ref().map_or(0, |c| c.ranks.len())
    }

    /// Leaves level `l` (Listing 5, lines 13-23; Listing 8, lines 14-23; Listing 3).
    fn leave(p: &mut Proc, l: usize) {
        p.l = l as u8;
        p.pc = if p.succ[l] == 0 { Pc::LeaveCas } else { Pc::LeavePut };
    }

    /// Leaves the levels from `l` down, then ends the release.
    fn leave_below(&self, p: &mut Proc, i: usize, l: usize) {
        if l < self.n() {
            Self::leave(p, l);
        } else {
            p.left -= 1;
            (p.stat, p.flag, p.clear) = (0, false, false);
            self.start(p, i);
        }
    }

    /// Level 1's release: Listing 8 (RMA-RW) or Listing 3.
    fn root_release(&self, p: &mut Proc) {
        p.pc = if self.counters.is_some() { Pc::RootStatus } else { Pc::RootNextPlain };
    }

    /// Where a writer goes once its STATUS at level `l` was passed (`status`).
    fn passed(&self, p: &mut Proc, l: usize, status: u64) -> Pc {
        if l == 0 && status == MODE_CHANGE {
            p.j = 0;
            Pc::MarkWrite
        } else if l == 0 {
            Pc::Cs
        } else if status != ACQUIRE_PARENT {
            Pc::GetOwners
        } else {
            Pc::AcqParent
        }
    }

    fn reset_counters(p: &mut Proc, cont: Cont) {
        p.j = 0;
        p.clear = true;
        p.cont = cont;
        p.pc = Pc::ResetArrive;
    }

    /// Process `i`'s next step from `s`, or `None` if it is done or waits.
    fn step(&self, s: &State, i: usize) -> Option<State> {
        let mut s = s.clone();
        let me = i as u64;
        let State { mem, procs, frames } = &mut s;
        let p = &mut procs[i];
        let l = p.l as usize;
        let unmarked = |a: i64| if a >= WRITE / 2 { a.wrapping_sub(WRITE) } else { a };
        match p.pc {
            Pc::Done => return None,
            Pc::PrepNext => {
                mem[self.at(me, Layout::next(l))] = 0;
                p.pc = Pc::PrepStatus;
            }
            Pc::PrepStatus => {
                mem[self.at(me, Layout::status(l))] = WAIT;
                p.pc = Pc::SwapTail;
            }
            Pc::SwapTail => {
                let t = self.tail_at(l, me);
                p.v = std::mem::replace(&mut mem[t], me + 1);
                p.pc = if p.v != 0 {
                    Pc::LinkPred
                } else if l == 0 && self.counters.is_some() {
                    p.j = 0;
                    Pc::MarkWrite
                } else if l == 0 {
                    Pc::Cs
                } else {
                    Pc::AcqParent
                };
            }
            Pc::LinkPred => {
                mem[self.at(p.v - 1, Layout::next(l))] = me + 1;
                p.pc = Pc::SpinStatus;
            }
            Pc::SpinStatus => {
                let status = mem[self.at(me, Layout::status(l))];
                // A polled word that spins is marked.
                p.pc = if status == WAIT { Pc::MarkParked } else { self.passed(p, l, status) };
            }
            Pc::MarkParked => {
                // `p.v` is the predecessor (`SwapTail`).
                let w = self.at(p.v - 1, Layout::next(l));
                if mem[w] == me + 1 {
                    mem[w] |= NEXT_PARKED;
                    p.pc = Pc::Parked;
                } else {
                    // Claimed (or reset), so passed: STATUS holds what the passer put, and
                    // nobody else changes it; the waiter's poll of it is this step's. (Only
                    // a broken protocol leaves it `WAIT`: then the waiter polls on.)
                    let status = mem[self.at(me, Layout::status(l))];
                    p.pc = if status == WAIT { Pc::PollStatus } else { self.passed(p, l, status) };
                }
            }
            Pc::PollStatus => {
                let status = mem[self.at(me, Layout::status(l))];
                if status == WAIT {
                    return None;
                }
                p.pc = self.passed(p, l, status);
            }
            Pc::Parked => {
                if frames[i] == 0 {
                    return None;
                }
                frames[i] -= 1;
                // The frame follows the claim, which follows the put (as above).
                p.pc = self.passed(p, l, mem[self.at(me, Layout::status(l))]);
            }
            Pc::GetOwners => {
                for k in 0..l {
                    p.held[k] = (mem[self.at(me, self.layout().owners() + k)] - 1) as u8;
                }
                p.pc = Pc::Cs;
            }
            Pc::AcqParent => {
                mem[self.at(me, Layout::status(l))] = ACQUIRE_START;
                p.l -= 1;
                p.pc = Pc::PrepNext;
            }
            Pc::MarkWrite => {
                let r = self.reset_rank(p, i);
                let a = self.at(r, self.layout().arrive());
                mem[a] = mem[a].wrapping_add(WRITE as u64);
                p.pc = if usize::from(p.j) + 1 < self.counter_ranks() {
                    p.j += 1;
                    Pc::MarkWrite
                } else if self.mutation == Mutation::WriterSkipsDrain {
                    Pc::WriteMode
                } else {
                    p.j = 0;
                    Pc::DrainArrive
                };
            }
            Pc::DrainArrive => {
                p.v = mem[self.at(self.reset_rank(p, i), self.layout().arrive())];
                p.pc = Pc::DrainDepart;
            }
            Pc::DrainDepart => {
                let d = mem[self.at(self.reset_rank(p, i), self.layout().depart())] as i64;
                let active = unmarked(p.v as i64).wrapping_sub(d);
                p.v = 0;
                p.pc = if active != 0 {
                    Pc::DrainArrive
                } else if usize::from(p.j) + 1 < self.counter_ranks() {
                    p.j += 1;
                    Pc::DrainArrive
                } else {
                    Pc::WriteMode
                };
            }
            Pc::WriteMode => {
                mem[self.at(me, Layout::status(0))] = ACQUIRE_START;
                p.j = 0;
                p.pc = Pc::Cs;
            }
            Pc::Cs => match self.roles[i] {
                Role::Writer => {
                    p.v = 0;
                    if self.n() > 1 {
                        p.l = (self.n() - 1) as u8;
                        p.pc = Pc::RelNext;
                    } else {
                        self.root_release(p);
                    }
                }
                Role::Reader => {
                    // Listing 10.
                    let a = self.at(self.reset_rank(p, i), self.layout().depart());
                    mem[a] = mem[a].wrapping_add(1);
                    p.left -= 1;
                    self.start(p, i);
                }
            },
            Pc::RelNext => {
                p.succ[l] = mem[self.at(u64::from(p.held[l]), Layout::next(l))] & NEXT_NODE;
                p.pc = Pc::RelStatus;
            }
            Pc::RelStatus => {
                p.v = mem[self.at(u64::from(p.held[l]), Layout::status(l))];
                if p.succ[l] != 0 && p.v < self.t_l[l] {
                    p.pc = Pc::RelOwners;
                } else if l > 1 {
                    p.l -= 1;
                    p.pc = Pc::RelNext;
                } else {
                    self.root_release(p);
                }
            }
            Pc::RelOwners => {
                for k in 0..l {
                    mem[self.at(p.succ[l] - 1, self.layout().owners() + k)] = u64::from(p.held[k]) + 1;
                }
                p.pc = Pc::RelPass;
            }
            Pc::RelPass => {
                mem[self.at(p.succ[l] - 1, Layout::status(l))] = p.v + 1;
                p.v = 0;
                p.pc = Pc::Claim;
            }
            Pc::RootNextPlain => {
                p.succ[0] = mem[self.at(u64::from(p.held[0]), Layout::next(0))] & NEXT_NODE;
                p.stat = ACQUIRE_START + 1;
                Self::leave(p, 0);
            }
            Pc::RootStatus => {
                p.stat = mem[self.at(u64::from(p.held[0]), Layout::status(0))].wrapping_add(1);
                p.flag = false;
                if p.stat >= self.counters.as_ref().expect("RMA-RW").t_w {
                    p.stat = MODE_CHANGE;
                    p.flag = true;
                    Self::reset_counters(p, Cont::RootNext);
                } else {
                    p.pc = Pc::RootNext;
                }
            }
            Pc::RootNext => {
                p.succ[0] = mem[self.at(u64::from(p.held[0]), Layout::next(0))] & NEXT_NODE;
                if p.succ[0] == 0 && !p.flag {
                    p.stat = MODE_CHANGE;
                    Self::reset_counters(p, Cont::RootLeave);
                } else {
                    Self::leave(p, 0);
                }
            }
            Pc::LeaveCas => {
                let o = u64::from(p.held[l]);
                let t = self.tail_at(l, o);
                if mem[t] == o + 1 {
                    mem[t] = 0;
                    self.leave_below(p, i, l + 1);
                } else if self.mutation == Mutation::NoHandOff {
                    self.leave_below(p, i, l + 1);
                } else {
                    p.pc = Pc::LeaveSpin;
                }
            }
            Pc::LeaveSpin => {
                let succ = mem[self.at(u64::from(p.held[l]), Layout::next(l))] & NEXT_NODE;
                if succ == 0 {
                    return None;
                }
                p.succ[l] = succ;
                p.pc = Pc::LeavePut;
            }
            Pc::LeavePut => {
                let status = if l == 0 { p.stat } else { ACQUIRE_PARENT };
                mem[self.at(p.succ[l] - 1, Layout::status(l))] = status;
                p.pc = Pc::Claim;
            }
            Pc::Claim => {
                let w = self.at(u64::from(p.held[l]), Layout::next(l));
                let old = mem[w];
                if self.mutation != Mutation::PassReadsMark {
                    mem[w] |= NEXT_PASSED;
                }
                let wake = old & NEXT_PARKED != 0 || self.mutation == Mutation::PassAlwaysWakes;
                frames[(p.succ[l] - 1) as usize] += u8::from(wake);
                p.succ[l] = 0;
                self.leave_below(p, i, l + 1);
            }
            Pc::ResetArrive => {
                p.v = mem[self.at(self.reset_rank(p, i), self.layout().arrive())];
                p.pc = Pc::ResetDepart;
            }
            Pc::ResetDepart => {
                // Beyond the listing (6): nothing is taken from a DEPART below zero.
                p.d = (mem[self.at(self.reset_rank(p, i), self.layout().depart())] as i64).max(0) as u64;
                p.pc = Pc::ResetSubDepart;
            }
            Pc::ResetSubDepart => {
                let a = self.at(self.reset_rank(p, i), self.layout().depart());
                mem[a] = mem[a].wrapping_sub(p.d);
                p.pc = Pc::ResetSubArrive;
            }
            Pc::ResetSubArrive => {
                let mut sub = (p.d as i64).wrapping_neg();
                if p.clear && p.v as i64 >= WRITE / 2 {
                    sub = sub.wrapping_sub(WRITE);
                }
                let a = self.at(self.reset_rank(p, i), self.layout().arrive());
                mem[a] = mem[a].wrapping_add(sub as u64);
                (p.v, p.d) = (0, 0);
                match p.cont {
                    Cont::RootNext | Cont::RootLeave if usize::from(p.j) + 1 < self.counter_ranks() => {
                        p.j += 1;
                        p.pc = Pc::ResetArrive;
                    }
                    Cont::RootNext => {
                        p.j = 0;
                        p.pc = Pc::RootNext;
                    }
                    Cont::RootLeave => {
                        p.j = 0;
                        Self::leave(p, 0);
                    }
                    Cont::ReadAgain => {
                        p.flag = true;
                        p.pc = Pc::ReadBack;
                    }
                    Cont::ReadAdd => p.pc = Pc::ReadAdd,
                }
            }
            Pc::ReadAdd => {
                let c = self.counters.as_ref().expect("RMA-RW");
                let a = self.at(self.reset_rank(p, i), self.layout().arrive());
                let cs = mem[a] as i64;
                mem[a] = mem[a].wrapping_add(1);
                p.flag = false;
                p.pc = if cs < c.t_r {
                    Pc::Cs
                } else if cs == c.t_r {
                    Pc::ReadTail
                } else {
                    Pc::ReadBack
                };
            }
            Pc::ReadTail => {
                if mem[self.tail_at(0, me)] == 0 {
                    p.clear = self.mutation == Mutation::ReaderResetClearsWrite;
                    p.cont = Cont::ReadAgain;
                    p.pc = Pc::ResetArrive;
                } else {
                    p.pc = Pc::ReadBack;
                }
            }
            Pc::ReadBack => {
                let a = self.at(self.reset_rank(p, i), self.layout().arrive());
                mem[a] = mem[a].wrapping_sub(1);
                p.pc = if p.flag { Pc::ReadAdd } else { Pc::BarrierArrive };
                p.flag = false;
            }
            Pc::BarrierArrive => {
                let cs = mem[self.at(self.reset_rank(p, i), self.layout().arrive())] as i64;
                let t_r = self.counters.as_ref().expect("RMA-RW").t_r;
                p.pc = if cs < t_r {
                    Pc::ReadAdd
                } else if cs < WRITE / 2 {
                    Pc::BarrierTail
                } else {
                    Pc::BarrierArrive
                };
            }
            Pc::BarrierTail => {
                if mem[self.tail_at(0, me)] == 0 {
                    p.clear = self.mutation == Mutation::ReaderResetClearsWrite;
                    p.cont = Cont::ReadAdd;
                    p.pc = Pc::ResetArrive;
                } else {
                    p.pc = Pc::BarrierArrive;
                }
            }
        }
        Some(s)
    }

    /// Whether a wake frame went where no parked waiter takes it: more than one frame to a
    /// process, or one to a process that is not parked (the frame of a hand-off is sent
    /// exactly to a waiter that marked its word and parks).
    fn frame_astray(s: &State) -> bool {
        s.frames.iter().zip(&s.procs).any(|(&f, p)| f > 1 || (f == 1 && p.pc != Pc::Parked))
    }

    /// Whether `s` has two writers, or a reader and a writer, in the critical section.
    fn exclusion_broken(&self, s: &State) -> bool {
        let inside = |role| s.procs.iter().zip(&self.roles).filter(|(p, &r)| p.pc == Pc::Cs && r == role).count();
        let writers = inside(Role::Writer);
        writers > 1 || (writers == 1 && inside(Role::Reader) > 0)
    }

    /// Visits every reachable state (up to `limit`, else panics: not exhaustive).
    fn explore(&self, limit: usize) -> Outcome {
        let init = self.initial();
        let mut ids: HashMap<State, u32> = HashMap::new();
        let mut states: Vec<State> = Vec::new();
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut terminal: Vec<u32> = Vec::new();
        let mut queue = VecDeque::new();
        let (mut frames_sent, mut polled, mut claimed_first) = (0, 0, 0);
        ids.insert(init.clone(), 0);
        states.push(init);
        queue.push_back(0u32);
        while let Some(id) = queue.pop_front() {
            let s = states[id as usize].clone();
            if s.procs.iter().all(|p| p.pc == Pc::Done) {
                terminal.push(id);
            }
            for i in 0..s.procs.len() {
                let Some(t) = self.step(&s, i) else { continue };
                polled += usize::from(s.procs[i].pc == Pc::SpinStatus && !matches!(t.procs[i].pc, Pc::MarkParked));
                claimed_first += usize::from(s.procs[i].pc == Pc::MarkParked && t.procs[i].pc != Pc::Parked);
                let next = match ids.get(&t) {
                    Some(&n) => n,
                    None => {
                        let (broken, astray) = (self.exclusion_broken(&t), Self::frame_astray(&t));
                        if broken || astray {
                            let pcs: Vec<String> = t.procs.iter().zip(&self.roles).map(|(p, r)| format!("{r:?} {:?}", p.pc)).collect();
                            let at = Some(format!("{}, frames {:?}", pcs.join(", "), t.frames));
                            let (exclusion_broken, frame_astray) = if broken { (at, None) } else { (None, at) };
                            return Outcome {
                                states: states.len(),
                                exclusion_broken,
                                stuck: 0,
                                frame_astray,
                                frames_sent,
                                polled,
                                claimed_first,
                            };
                        }
                        frames_sent += usize::from(t.frames.iter().any(|&f| f > 0));
                        let n = states.len() as u32;
                        assert!(states.len() < limit, "more than {limit} states: the model is too large to check exhaustively");
                        ids.insert(t.clone(), n);
                        states.push(t);
                        queue.push_back(n);
                        n
                    }
                };
                edges.push((id, next));
            }
        }
        // Backwards from the final states: every state must reach one.
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); states.len()];
        for &(a, b) in &edges {
            preds[b as usize].push(a);
        }
        let mut finishes = vec![false; states.len()];
        let mut stack = terminal;
        stack.iter().for_each(|&t| finishes[t as usize] = true);
        while let Some(b) = stack.pop() {
            for &a in &preds[b as usize] {
                if !finishes[a as usize] {
                    finishes[a as usize] = true;
                    stack.push(a);
                }
            }
        }
        let stuck = finishes.iter().filter(|&&f| !f).count();
        Outcome { states: states.len(), exclusion_broken: None, stuck, frame_astray: None, frames_sent, polled, claimed_first }
    }
}

/// The most states a configuration may have.
const LIMIT: usize = 4_000_000;

/// D-MCS (one level, tail on rank 0) with `writers` writers.
fn d_mcs(writers: usize, rounds: u8, mutation: Mutation) -> Model {
    let machine = Machine::simulated(&[], writers as u32).with_root_tail(0);
    Model { machine, roles: vec![Role::Writer; writers], rounds, t_l: vec![1], counters: None, t_dc: 1, mutation }
}

/// RMA-MCS over `sizes` (simulated levels) with `writers` writers.
fn rma_mcs(sizes: &[u32], writers: usize, t_l: &[u64], rounds: u8) -> Model {
    let machine = Machine::simulated(sizes, writers as u32);
    let t_l = (0..machine.depth()).map(|l| t_l[l.min(t_l.len() - 1)]).collect();
    Model { machine, roles: vec![Role::Writer; writers], rounds, t_l, counters: None, t_dc: 1, mutation: Mutation::None }
}

/// RMA-RW over `sizes` with these roles and thresholds.
fn rma_rw(sizes: &[u32], roles: &[Role], t_l: &[u64], t_r: i64, t_dc: u32, rounds: u8, mutation: Mutation) -> Model {
    let p = roles.len() as u32;
    let machine = Machine::simulated(sizes, p);
    let t_l: Vec<u64> = (0..machine.depth()).map(|l| t_l[l.min(t_l.len() - 1)]).collect();
    let t_w = t_l.iter().product();
    let counters = Counters { ranks: (0..p).step_by(t_dc as usize).collect(), t_r, t_w };
    Model { machine, roles: roles.to_vec(), rounds, t_l, counters: Some(counters), t_dc, mutation }
}

/// Checks `m`: no broken exclusion, every state can finish.
fn holds(m: &Model, what: &str) -> usize {
    let o = m.explore(LIMIT);
    assert_eq!(o.exclusion_broken, None, "{what}: mutual exclusion broken");
    assert_eq!(o.frame_astray, None, "{what}: a wake frame went to no parked waiter");
    assert_eq!(o.stuck, 0, "{what}: {} of {} states cannot finish (deadlock or livelock)", o.stuck, o.states);
    o.states
}

use Role::{Reader as R, Writer as W};

#[test]
fn d_mcs_excludes_and_never_deadlocks() {
    let n = holds(&d_mcs(2, 3, Mutation::None), "D-MCS, 2 writers");
    assert!(n > 100, "{n} states");
    holds(&d_mcs(3, 2, Mutation::None), "D-MCS, 3 writers");
}

/// The hand-off's wake frame, with the parked mark in the predecessor's NEXT
/// (`Queues::pass`, `Queues::wait_status`): over every interleaving of the waiter's polls,
/// its mark, and the passer's put and claim, a frame goes to a waiter exactly when it marked
/// the word before the claim and parks, one frame a wait (checked in every state by
/// [`holds`]), and a parked waiter, which moves only once its frame came, is never left
/// waiting (no lost wake-up). Every way is reached: hand-offs the waiter saw while it polled
/// (no frame), marks that found the word claimed (no frame; STATUS polled), and hand-offs to
/// a parked waiter.
#[test]
fn the_hand_offs_wake_frame_goes_to_a_parked_waiter_exactly_once() {
    let m = d_mcs(2, 2, Mutation::None);
    let o = m.explore(LIMIT);
    assert!(o.frames_sent > 0, "no hand-off to a parked waiter: {o:?}");
    assert!(o.polled > 0, "no hand-off seen while polling: {o:?}");
    assert!(o.claimed_first > 0, "no mark after the claim: {o:?}");
    holds(&rma_mcs(&[2], 3, &[1, 2], 1), "RMA-MCS, 2 levels, one round");
    holds(&rma_rw(&[], &[W, W], &[1], 1, 1, 2, Mutation::None), "RMA-RW, 2 writers, T_W 1");
}

/// The mark read with a get, not claimed: a waiter that marks after the read (and after the
/// put) is passed the lock without a frame, and stays parked.
#[test]
fn a_hand_off_that_reads_the_mark_without_claiming_it_loses_a_wake_up() {
    let o = d_mcs(2, 2, Mutation::PassReadsMark).explore(LIMIT);
    assert_eq!(o.exclusion_broken, None);
    assert!(o.stuck > 0, "a parked waiter passed the lock without a frame waits forever: {o:?}");
}

/// A frame on every hand-off goes to waiters that saw the hand-off while they polled.
#[test]
fn a_hand_off_that_always_wakes_sends_a_frame_astray() {
    let o = d_mcs(2, 2, Mutation::PassAlwaysWakes).explore(LIMIT);
    assert!(o.frame_astray.is_some(), "{o:?}");
}

#[test]
fn d_mcs_without_the_hand_off_deadlocks() {
    let o = d_mcs(2, 2, Mutation::NoHandOff).explore(LIMIT);
    assert_eq!(o.exclusion_broken, None);
    assert!(o.stuck > 0, "a successor nobody passes the lock to waits forever: {o:?}");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "10^5 states and more: checked in release (.ci/run, step loom-locks)")]
fn rma_mcs_over_two_levels_excludes_and_never_deadlocks() {
    // Ranks 0-1 on node 0, rank 2 on node 1; T_L,2 = 2: the lock passes within a node up
    // to twice, then leaves it. (With the hand-off's claim a step of its own, this is 0.74
    // million states; `T_L,2` = 1 as well would double the time.)
    holds(&rma_mcs(&[2], 3, &[1, 2], 2), "RMA-MCS, 2 levels, T_L,2 = 2");
}

#[test]
fn rma_rw_two_processes_exclude_and_never_deadlock() {
    // A writer and a reader, T_R 1: the reader reaches T_R at every second entry.
    let n = holds(&rma_rw(&[], &[W, R], &[1], 1, 2, 2, Mutation::None), "RMA-RW, 1 writer, 1 reader");
    assert!(n > 100, "{n} states");
    holds(&rma_rw(&[], &[W, W], &[2], 1, 1, 2, Mutation::None), "RMA-RW, 2 writers");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "10^5 states and more: checked in release (.ci/run, step loom-locks)")]
fn rma_rw_excludes_and_never_deadlocks() {
    // One counter, T_R 2: readers reach it and reset it, and the writer takes the lock from
    // them; T_W 1: the lock goes back to the readers after every writer.
    holds(&rma_rw(&[], &[W, R, R], &[1], 2, 3, 2, Mutation::None), "RMA-RW, 1 writer, 2 readers");
    // A counter per rank.
    holds(&rma_rw(&[], &[R, W, R], &[1], 1, 1, 2, Mutation::None), "RMA-RW, a counter per rank");
    holds(&rma_rw(&[], &[W, W, R], &[2], 1, 3, 2, Mutation::None), "RMA-RW, 2 writers, 1 reader");
}

#[test]
#[cfg_attr(debug_assertions, ignore = "10^5 states and more: checked in release (.ci/run, step loom-locks)")]
fn rma_rw_over_two_levels_excludes_and_never_deadlocks() {
    // Node 0: writers 0 and 1; node 1: reader 2. T_L,2 = 2: the lock passes within node 0.
    holds(&rma_rw(&[2], &[W, W, R], &[1, 2], 1, 2, 2, Mutation::None), "RMA-RW, 2 levels");
}

#[test]
fn rma_rw_reader_reset_clearing_write_breaks_exclusion() {
    let m = rma_rw(&[], &[W, R, R], &[1], 2, 3, 2, Mutation::ReaderResetClearsWrite);
    let o = m.explore(LIMIT);
    assert!(o.exclusion_broken.as_deref().is_some_and(|s| s.contains("Writer Cs") && s.contains("Reader Cs")), "{o:?}");
}

#[test]
fn rma_rw_writer_that_does_not_drain_breaks_exclusion() {
    let m = rma_rw(&[], &[W, R], &[1], 2, 2, 1, Mutation::WriterSkipsDrain);
    let o = m.explore(LIMIT);
    assert!(o.exclusion_broken.is_some(), "{o:?}");
}

/// The protocols of `queues.rs` themselves (not the transcription above) under random
/// schedules: each process runs [`Queues`] over [`ModelWords`], whose every operation is a
/// step (the process's future returns `Pending` before it, and the scheduler picks whom to
/// poll next), so a schedule interleaves the real code's window operations one by one.
#[cfg(not(loom))]
mod real {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use parking_lot::Mutex;
    use weft_sync::Error;

    use crate::dlock::levels::Machine;
    use crate::dlock::queues::{Counters, Layout, Queues, Words};
    use crate::dlock::wait::{Armed, Backoff, Wakes};
    use crate::dlock::LOCK_ENDED;
    use crate::rma::{AtomicElement, Op, WINDOW_ENDED};

    /// One operation as the trace shows it: (process, what, target rank, offset, value
    /// written or read).
    type Traced = (u32, &'static str, u32, usize, u64);

    /// The window's words of every process, the wake frames come to each word and not yet
    /// taken (where the hand-off's waiters park on them), and the last operations.
    struct Memory {
        words: Vec<AtomicU64>,
        per_rank: usize,
        /// Whether a waiter marks its predecessor's NEXT and parks on the hand-off's wake
        /// frame.
        frames: bool,
        /// The steps after which a parked waiter checks its word without a frame (its
        /// `WAKE_CHECK`); `u32::MAX`: never, so a lost wake-up leaves it parked.
        check_after: u32,
        mailboxes: Vec<AtomicU32>,
        /// Per process: it ended its part (dropped its lock); every later access of
        /// another process to its words fails, as a window's does.
        ended: Vec<AtomicBool>,
        /// A wake frame sent to a word that already had one waiting: described.
        astray: Mutex<Option<String>>,
        trace: Mutex<std::collections::VecDeque<Traced>>,
    }

    impl Memory {
        fn at(&self, rank: u32, offset: usize) -> &AtomicU64 {
            assert!(offset < self.per_rank, "offset {offset} outside a rank's {} words", self.per_rank);
            &self.words[rank as usize * self.per_rank + offset]
        }

        /// The wake frames with tag `tag` come to `rank` and not taken.
        fn mailbox(&self, rank: u32, tag: usize) -> &AtomicU32 {
            &self.mailboxes[rank as usize * self.per_rank + tag]
        }

        /// `WINDOW_ENDED` if `rank`, not `me`, ended its part.
        fn reach(&self, me: u32, rank: u32) -> Result<(), Error> {
            if rank != me && self.ended[rank as usize].load(Relaxed) {
                return Err(WINDOW_ENDED);
            }
            Ok(())
        }

        fn log(&self, op: Traced) {
            let mut t = self.trace.lock();
            if t.len() == 48 {
                t.pop_front();
            }
            t.push_back(op);
        }
    }

    /// `Pending` once: the point where the scheduler may run another process.
    struct Step(bool);

    impl Future for Step {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    fn step() -> Step {
        Step(false)
    }

    /// One process's window: every operation is one step, done at once when its turn comes.
    struct ModelWords {
        rank: u32,
        size: u32,
        mem: Arc<Memory>,
    }

    impl Words for ModelWords {
        fn rank(&self) -> u32 {
            self.rank
        }

        fn size(&self) -> u32 {
            self.size
        }

        async fn get(&self, rank: u32, offset: usize, out: &mut [u64]) -> Result<(), Error> {
            step().await;
            self.mem.reach(self.rank, rank)?;
            for (k, o) in out.iter_mut().enumerate() {
                *o = self.mem.at(rank, offset + k).load(Relaxed);
            }
            self.mem.log((self.rank, "get", rank, offset, out[0]));
            Ok(())
        }

        async fn put_unflushed(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
            self.put(rank, offset, data).await
        }

        async fn put(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
            step().await;
            self.mem.reach(self.rank, rank)?;
            for (k, &d) in data.iter().enumerate() {
                self.mem.at(rank, offset + k).store(d, Relaxed);
            }
            self.mem.log((self.rank, "put", rank, offset, data[0]));
            Ok(())
        }

        async fn fetch_and_op(&self, rank: u32, offset: usize, operand: u64, op: Op) -> Result<u64, Error> {
            step().await;
            self.mem.reach(self.rank, rank)?;
            let w = self.mem.at(rank, offset);
            let old = w.load(Relaxed);
            w.store(u64::combine(old, operand, op).expect("an integer operation"), Relaxed);
            self.mem.log((self.rank, if op == Op::NoOp { "read" } else { "fetch-op" }, rank, offset, old));
            Ok(old)
        }

        async fn compare_and_swap(&self, rank: u32, offset: usize, compare: u64, swap: u64) -> Result<u64, Error> {
            step().await;
            self.mem.reach(self.rank, rank)?;
            let old = self.mem.at(rank, offset).compare_exchange(compare, swap, Relaxed, Relaxed).unwrap_or_else(|v| v);
            self.mem.log((self.rank, "cas", rank, offset, old));
            Ok(old)
        }

        fn arm<const N: usize>(&self, _: &Backoff, _: [(u32, usize); N]) -> Armed<'_, N> {
            Armed::Yield
        }

        async fn pause(&self) {
            step().await;
        }

        fn lost(&self) -> Option<u32> {
            None
        }

        fn ended_rank(&self, rank: u32) -> bool {
            self.mem.ended[rank as usize].load(Relaxed)
        }

        /// Each of this process's operations is complete when its step is: a process that
        /// ended did so after its writes, as a window's owner ends its part after its flush.
        fn ended(&self, _: &Backoff) -> Option<u32> {
            (0..self.size).find(|&r| r != self.rank && self.ended_rank(r))
        }

        fn as_window(&self) -> Option<&crate::rma::Window<'_, u64>> {
            None
        }

        fn frames(&self, _: Option<&Wakes>) -> bool {
            self.mem.frames
        }

        /// Posted from the third poll of a wait on (so that hand-offs are also seen while
        /// polling): a receive that takes a frame come before or after it.
        fn arm_frame<'a>(&'a self, _: Option<&'a Wakes>, backoff: &Backoff, tag: usize) -> Option<Armed<'a, 1>> {
            (self.mem.frames && backoff.polls() >= 2).then(|| Armed::Mailbox(self.mem.mailbox(self.rank, tag), self.mem.check_after))
        }

        fn wake(&self, _: Option<&Wakes>, rank: u32, tag: usize) -> Result<(), Error> {
            self.mem.log((self.rank, "frame", rank, tag, 0));
            if self.mem.mailbox(rank, tag).fetch_add(1, Relaxed) != 0 {
                self.mem.astray.lock().get_or_insert_with(|| format!("a second wake frame to process {rank}'s word {tag}"));
            }
            Ok(())
        }

        fn drain(&self, _: Option<&Wakes>, tag: usize) {
            self.mem.mailbox(self.rank, tag).store(0, Relaxed);
        }
    }

    impl ModelWords {
        /// Ends this process's part (a step): the drop of its lock.
        async fn end(&self) {
            step().await;
            self.mem.log((self.rank, "end", self.rank, 0, 0));
            self.mem.ended[self.rank as usize].store(true, Relaxed);
        }
    }

    /// How the last process ends its part of the lock's words at its last acquisition.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum End {
        /// After its release (a hand-off, perhaps), at once: every other process must
        /// still finish its acquisitions (with 2 processes, where the other needs nothing
        /// of its part but the hand-off).
        Released,
        /// Holding the lock (its guard forgotten): every other process's acquisitions must
        /// end, with the lock or `LOCK_ENDED` (or `WINDOW_ENDED`, an access to the ended
        /// part), none waiting for ever.
        Holding,
    }

    /// A process's acquisitions, under way.
    type Process<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;

    /// Who is in the critical section.
    #[derive(Default)]
    struct Inside {
        writers: AtomicUsize,
        readers: AtomicUsize,
    }

    /// A lock of the queues: RMA-RW (with counters) or a mutual-exclusion lock.
    pub(super) struct Config {
        pub(super) sizes: Vec<u32>,
        pub(super) procs: u32,
        pub(super) t_l: Vec<u64>,
        /// `(T_R, T_DC)` for RMA-RW; `None`: RMA-MCS (D-MCS with one level).
        pub(super) rw: Option<(i64, u32)>,
        /// Every `every`-th acquisition of a process writes (shifted by the process).
        pub(super) every: u32,
        pub(super) rounds: u32,
        /// A waiter marks its predecessor's NEXT and parks on the hand-off's wake frame (libfabric);
        /// else it polls (the embedded provider's waits, which listen, are steps here).
        pub(super) frames: bool,
        /// Whether, and how, the last process ends its part at its last acquisition.
        pub(super) end: Option<End>,
    }

    /// Runs `walks` random schedules of `config` (xorshift from `seed`), each at most
    /// `steps` steps; the first that broke exclusion or did not finish, described.
    pub(super) fn walks(config: &Config, walks: u32, steps: u32, seed: u64) -> Option<String> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let machine = Machine::simulated(&config.sizes, config.procs);
        let n = machine.depth();
        let t_l: Vec<u64> = (0..n).map(|l| config.t_l[l.min(config.t_l.len() - 1)]).collect();
        let counters = config.rw.map(|(t_r, t_dc)| Counters { t_dc, t_r, t_w: t_l.iter().product() });
        for walk in 0..walks {
            let words = config.procs as usize * Layout(n).words();
            let mem = Arc::new(Memory {
                words: (0..words).map(|_| AtomicU64::new(0)).collect(),
                per_rank: Layout(n).words(),
                frames: config.frames,
                // Every other walk: a frame nobody waits for any more is left to be consumed.
                // Where a process ends, a parked waiter's frame may never come: it checks
                // again (its `WAKE_CHECK`, `WAKE_ALARM`).
                check_after: if walk % 2 == 0 && config.end.is_none() { u32::MAX } else { 64 },
                mailboxes: (0..words).map(|_| AtomicU32::new(0)).collect(),
                ended: (0..config.procs).map(|_| AtomicBool::new(false)).collect(),
                astray: Mutex::new(None),
                trace: Mutex::new(Default::default()),
            });
            let queues: Vec<Queues<ModelWords>> = (0..config.procs)
                .map(|rank| {
                    let words = ModelWords { rank, size: config.procs, mem: mem.clone() };
                    Queues::on(words, machine.clone(), t_l.clone(), counters).expect("valid thresholds")
                })
                .collect();
            let inside = Inside::default();
            let mut procs: Vec<Option<Process<'_>>> =
                queues.iter().map(|q| Some(Box::pin(process(q, config, &inside)) as Process<'_>)).collect();
            let mut cx = Context::from_waker(Waker::noop());
            let mut left = steps;
            let mut failed = None;
            let failure = loop {
                let alive: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].is_some()).collect();
                if alive.is_empty() {
                    break None;
                }
                if left == 0 {
                    break Some(format!("not finished after {steps} steps (deadlock or livelock)"));
                }
                let i = alive[(next() % alive.len() as u64) as usize];
                for _ in 0..1 + next() % 4 {
                    left = left.saturating_sub(1);
                    let Some(f) = procs[i].as_mut() else { break };
                    if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                        procs[i] = None;
                        match (r, config.end) {
                            (Ok(()), _) => {}
                            (Err(e), Some(End::Holding)) if e == LOCK_ENDED || e == WINDOW_ENDED => {}
                            (Err(e), _) => failed = Some(format!("process {i} failed: {e:?}")),
                        }
                    }
                    let (w, r) = (inside.writers.load(Relaxed), inside.readers.load(Relaxed));
                    if w > 1 || (w == 1 && r > 0) {
                        break;
                    }
                }
                let (w, r) = (inside.writers.load(Relaxed), inside.readers.load(Relaxed));
                if w > 1 || (w == 1 && r > 0) {
                    break Some(format!("{w} writers and {r} readers inside"));
                }
                if let Some(astray) = mem.astray.lock().take() {
                    break Some(astray);
                }
                if let Some(failed) = failed.take() {
                    break Some(failed);
                }
            };
            // Every wait on a marked word consumed its frame, or the frames nobody took (a
            // wait that failed for an end may leave one: the lock is not used after it).
            let failure = failure.or_else(|| {
                if config.end == Some(End::Holding) {
                    return None;
                }
                let left = mem.mailboxes.iter().position(|m| m.load(Relaxed) != 0)?;
                Some(format!("a wake frame left queued at process {}'s word {}", left / mem.per_rank, left % mem.per_rank))
            });
            if let Some(what) = failure {
                let trace: Vec<String> =
                    mem.trace.lock().iter().map(|(p, op, r, off, v)| format!("{p}: {op} rank {r} word {off}: {:#x}", v)).collect();
                return Some(format!("walk {walk}: {what}; the last operations:\n{}", trace.join("\n")));
            }
        }
        None
    }

    /// One process: `config.rounds` acquisitions, each a write or a read, held for a step.
    async fn process(q: &Queues<ModelWords>, config: &Config, inside: &Inside) -> Result<(), Error> {
        let me = q.window.rank;
        for j in 0..config.rounds {
            let write = config.rw.is_none() || (me + j) % config.every == 0;
            let who = if write { &inside.writers } else { &inside.readers };
            if write {
                q.writer_acquire().await?;
            } else {
                q.reader_acquire().await?;
            }
            who.fetch_add(1, Relaxed);
            step().await;
            who.fetch_sub(1, Relaxed);
            let ends = me == config.procs - 1 && j == config.rounds - 1;
            if ends && config.end == Some(End::Holding) {
                q.window.end().await;
                return Ok(());
            }
            if write {
                q.writer_release().await?;
            } else {
                q.reader_release().await?;
            }
            if ends && config.end == Some(End::Released) {
                q.window.end().await;
            }
        }
        Ok(())
    }
}

/// The code of `queues.rs` itself under random schedules of 4-8 processes: RMA-RW with
/// roles that change, one counter and several, one level and two; RMA-MCS and D-MCS; most
/// with the waiters of hand-offs marking their predecessor's NEXT and parking on the wake frame as on
/// libfabric (a lost wake-up leaves a process parked, a walk that does not finish; a second
/// frame to a wait, or one left queued, fails too), two polling as elsewhere. The
/// schedules are the same at every run (fixed seeds). A process that drops its lock right
/// after its last release (a hand-off, then its end) leaves the other taking the lock every
/// time; one that drops it holding it leaves every other process's wait ending (with the
/// lock, `LOCK_ENDED` or `WINDOW_ENDED`), none waiting for ever. 30 walks per lock in a debug build,
/// 300 in release, `WEFT_MODEL_WALKS` to search longer. (Not under `--cfg loom`: the
/// queues' local lock would take loom's atomics outside a loom model.)
#[test]
#[cfg(not(loom))]
fn the_protocols_code_under_random_schedules_excludes_and_finishes() {
    use real::{Config, End};
    let default = if cfg!(debug_assertions) { 30 } else { 300 };
    let walks: u32 = std::env::var("WEFT_MODEL_WALKS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let configs = [
        (
            "RMA-RW, 6 processes, one counter, T_R 2, T_W 2",
            Config { sizes: vec![], procs: 6, t_l: vec![2], rw: Some((2, 6)), every: 4, rounds: 40, frames: true, end: None },
        ),
        (
            "RMA-RW, 8 processes, one counter, T_R 1, T_W 1",
            Config { sizes: vec![], procs: 8, t_l: vec![1], rw: Some((1, 8)), every: 3, rounds: 30, frames: true, end: None },
        ),
        (
            "RMA-RW, 4 processes, a counter per rank",
            Config { sizes: vec![], procs: 4, t_l: vec![3], rw: Some((1, 1)), every: 2, rounds: 40, frames: false, end: None },
        ),
        (
            "RMA-RW, 6 processes on 3 nodes, 3 counters",
            Config { sizes: vec![2], procs: 6, t_l: vec![2, 2], rw: Some((2, 2)), every: 4, rounds: 30, frames: true, end: None },
        ),
        (
            "RMA-RW, 8 processes on 2 nodes, T_R 4",
            Config { sizes: vec![4], procs: 8, t_l: vec![16], rw: Some((4, 4)), every: 4, rounds: 30, frames: true, end: None },
        ),
        (
            "RMA-MCS, 8 processes, 2 nodes of 2 sockets",
            Config { sizes: vec![2, 2], procs: 8, t_l: vec![1, 2, 2], rw: None, every: 1, rounds: 20, frames: true, end: None },
        ),
        ("D-MCS, 6 processes", Config { sizes: vec![], procs: 6, t_l: vec![1], rw: None, every: 1, rounds: 30, frames: false, end: None }),
        (
            "D-MCS, 6 processes, parked on wake frames",
            Config { sizes: vec![], procs: 6, t_l: vec![1], rw: None, every: 1, rounds: 30, frames: true, end: None },
        ),
        // A process that drops its lock at once after its last release (a hand-off, perhaps):
        // the other takes the lock every time.
        (
            "D-MCS, 2 processes, parked on wake frames, one drops its lock after its release",
            Config { sizes: vec![], procs: 2, t_l: vec![1], rw: None, every: 1, rounds: 20, frames: true, end: Some(End::Released) },
        ),
        (
            "D-MCS, 2 processes, one drops its lock after its release",
            Config { sizes: vec![], procs: 2, t_l: vec![1], rw: None, every: 1, rounds: 20, frames: false, end: Some(End::Released) },
        ),
        (
            "RMA-MCS, 2 processes on 2 nodes, one drops its lock after its release",
            Config { sizes: vec![1], procs: 2, t_l: vec![1, 2], rw: None, every: 1, rounds: 20, frames: true, end: Some(End::Released) },
        ),
        (
            "RMA-RW, 2 processes, one drops its lock after its release",
            Config {
                sizes: vec![],
                procs: 2,
                t_l: vec![1],
                rw: Some((1, 2)),
                every: 2,
                rounds: 20,
                frames: true,
                end: Some(End::Released),
            },
        ),
        // A process that drops its lock while holding it: the others' waits end.
        (
            "D-MCS, 4 processes, one drops its lock holding it",
            Config { sizes: vec![], procs: 4, t_l: vec![1], rw: None, every: 1, rounds: 10, frames: true, end: Some(End::Holding) },
        ),
        (
            "RMA-MCS, 6 processes on 3 nodes, one drops its lock holding it",
            Config { sizes: vec![2], procs: 6, t_l: vec![1, 2], rw: None, every: 1, rounds: 10, frames: true, end: Some(End::Holding) },
        ),
        (
            "RMA-RW, 4 processes, one counter, one drops its lock holding it",
            Config { sizes: vec![], procs: 4, t_l: vec![2], rw: Some((2, 4)), every: 2, rounds: 10, frames: true, end: Some(End::Holding) },
        ),
    ];
    for (seed, (what, config)) in configs.iter().enumerate() {
        if let Some(failure) = real::walks(config, walks, 2_000_000, seed as u64 + 3) {
            panic!("{what}: {failure}");
        }
    }
}
