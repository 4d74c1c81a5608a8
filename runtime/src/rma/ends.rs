//! A window's end, told to its peers (module docs, *A window's end*): the rank that ends
//! its part sends each peer a `WindowEnd` frame naming the window's communicator and its
//! serial of the part; the peer marks that part ended in its own window, where every later
//! access reads the mark (one load of local memory) and fails before it reaches the
//! transport.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use weft_sync::Error;
use weft_transport::{FrameKind, Header};

use crate::engine::Engine;

/// The error of an access to a part of a window its owner ended (dropped, or freed while
/// this rank did not).
pub(crate) const WINDOW_ENDED: Error = Error::InvalidArgument("the target rank ended its part of the window");

/// Per rank of a window: whether its owner ended its part (set by its notice); then one
/// more, set after any of them (the one load of a wait that asks whether any did).
pub(super) type EndMarks = Arc<[AtomicBool]>;

/// The windows of a rank whose peers' notices it marks (`Engine::window_ends`).
#[derive(Default)]
pub(crate) struct WindowEnds {
    /// Serials of this rank's parts (0: none).
    serial: AtomicU64,
    registry: parking_lot::Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    /// By (a peer's world rank, its serial of its part): the marks of the window and the
    /// peer's rank in its communicator.
    parts: HashMap<(u32, u64), (EndMarks, u32)>,
    /// Window creations under way, by communicator context: the notices that came before
    /// the window was registered here (a peer that left the creation first may end its part
    /// at once). One at a time per communicator, as every collective.
    creating: Vec<(u32, Vec<(u32, u64)>)>,
}

impl WindowEnds {
    /// A serial for a part of this rank, never given before.
    pub(super) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A window's creation on communicator `context` begins: notices for it are kept until
    /// [`finish`](Self::finish) (or [`abandon`](Self::abandon)).
    pub(super) fn begin(&self, context: u32) {
        self.registry.lock().creating.push((context, Vec::new()));
    }

    /// The creation on `context` failed.
    pub(super) fn abandon(&self, context: u32) {
        let mut r = self.registry.lock();
        r.creating.retain(|(c, _)| *c != context);
    }

    /// The creation on `context` is over, with `parts` (per rank of the communicator, its
    /// world rank and serial; 0: nothing registered); `me` is this rank there. Returns the
    /// window's marks, with those of the notices that came early set.
    pub(super) fn finish(&self, context: u32, me: u32, parts: &[(u32, u64)]) -> EndMarks {
        let marks: EndMarks = (0..=parts.len()).map(|_| AtomicBool::new(false)).collect();
        let mut r = self.registry.lock();
        let early = r.creating.iter().position(|(c, _)| *c == context).map(|i| r.creating.swap_remove(i).1).unwrap_or_default();
        for (rank, &(world, serial)) in parts.iter().enumerate() {
            if rank as u32 == me || serial == 0 {
                continue;
            }
            if early.contains(&(world, serial)) {
                marks[rank].store(true, Ordering::Release);
                marks[parts.len()].store(true, Ordering::Release);
            }
            r.parts.insert((world, serial), (marks.clone(), rank as u32));
        }
        marks
    }

    /// The window of `parts` (as in [`finish`](Self::finish)) is gone here: later notices
    /// for it are dropped.
    pub(super) fn forget(&self, me: u32, parts: impl Iterator<Item = (u32, u64)>) {
        let mut r = self.registry.lock();
        for (rank, key) in parts.enumerate() {
            if rank as u32 != me {
                r.parts.remove(&key);
            }
        }
    }
}

impl crate::engine::WindowEnds for WindowEnds {
    /// A peer's notice (`engine/frames.rs`): world rank `source` ended its part `serial` of
    /// a window on `context`.
    fn ended(&self, source: u32, context: u32, serial: u64) {
        let mut r = self.registry.lock();
        if let Some((marks, rank)) = r.parts.remove(&(source, serial)) {
            // Release: an access that reads the mark comes after whatever the notice's
            // handling made visible (pairs with the load in `Window::target`).
            marks[rank as usize].store(true, Ordering::Release);
            // After the rank's own mark: a load that finds this one finds that too.
            marks[marks.len() - 1].store(true, Ordering::Release);
        } else if let Some((_, early)) = r.creating.iter_mut().find(|(c, _)| *c == context) {
            early.push((source, serial));
        }
        // Otherwise this rank's window is gone already (or its creation failed here).
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Engine {
    /// This rank's registry of windows (installed with the engine by `runtime.rs`).
    pub(super) fn window_ends(&self) -> &WindowEnds {
        self.window_ends.as_any().downcast_ref().expect("the engine's window registry is `rma::WindowEnds`")
    }

    /// Tells world rank `peer` that this rank ended its part `serial` of a window on
    /// `context`, from this thread's CRI: a frame this thread sends to the peer afterwards
    /// comes after it, so the peer's accesses once it received that frame fail.
    pub(super) fn tell_window_end(&self, peer: u32, context: u32, serial: u64) {
        let k = self.cri_for_thread();
        let n = self.transport.num_cris();
        let header = Header { kind: FrameKind::WindowEnd, context, cookie: serial, ..Header::eager(context, 0, 0, 0, 0) };
        self.send_control(peer, if k < n { k } else { k % n }, header);
    }
}
