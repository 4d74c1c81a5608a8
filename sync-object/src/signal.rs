//! `Signal`: an event-listener [`Event`] whose notification costs one fence and one load
//! when nobody listens.
//!
//! event-listener 5 takes the event's internal mutex on every `notify`, listeners or not.
//! weft notifies on every frame pushed (the doorbell) and on every completion that drains a
//! sync object, while a waiter spins and only rarely parks, so almost every notification
//! finds nobody listening. A `Signal` counts its live listeners and skips `notify` when the
//! count is zero.
//!
//! Parking allocates nothing: [`Signal::listen_scoped`] registers a listener that lives on
//! the caller's stack (event-listener's `listener!`), which is what blocking waits use. Only
//! [`Signal::listen`], whose listener outlives the call (futures, listeners kept across
//! polls), boxes it.
//!
//! # Memory ordering (Dekker-style, like tokio's `Notify` and crossbeam's `Parker`)
//!
//! * A listener registers with the event first, then increments `listeners`, then issues a
//!   `SeqCst` fence, then re-checks its condition.
//! * A notifier changes the state first, then issues a `SeqCst` fence, then loads
//!   `listeners`.
//!
//! The two fences are ordered one way or the other. If the notifier's fence comes first,
//! the listener's re-check (after its own fence) sees the state change and it does not
//! wait. If the listener's fence comes first, its registration and increment (before it)
//! are visible to the notifier's load (after its fence): the count is not zero, and
//! `notify` finds the registered listener. No wake-up is lost either way. A stale non-zero
//! count only costs a needless `notify`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use event_listener::{listener, Event, EventListener, Listener};

use crate::loom::sync::atomic::{fence, AtomicUsize, Ordering};

/// An event that threads and tasks can wait for; notifying it costs one fence and one load
/// while nobody listens (the memory-ordering argument is in this module's source).
#[derive(Default)]
pub struct Signal {
    event: Event,
    /// Live [`SignalListener`]s (registered, not yet dropped).
    listeners: CachePadded<AtomicUsize>,
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal").field("listeners", &self.listeners.load(Ordering::Relaxed)).finish()
    }
}

impl Signal {
    /// A signal nobody listens to yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a listener for the next notification. The caller must re-check its
    /// condition after this returns and before waiting (check -> listen -> re-check -> wait).
    ///
    /// The listener is boxed (one allocation); a blocking wait that ends before the caller
    /// returns takes [`listen_scoped`](Self::listen_scoped) instead, which allocates nothing.
    pub fn listen(&self) -> SignalListener<'_> {
        let inner = self.event.listen();
        self.counted();
        SignalListener { waiter: Waiter::Owned(Some(inner)), listeners: &self.listeners }
    }

    /// Registers a listener for the next notification on this stack frame and hands it to
    /// `f`, which re-checks its condition and waits (check -> listen -> re-check -> wait).
    /// Allocates nothing: the listener lives until `f` returns.
    pub fn listen_scoped<R>(&self, f: impl FnOnce(SignalListener<'_>) -> R) -> R {
        listener!(self.event => stacked);
        self.counted();
        let mut slot = Some(stacked);
        f(SignalListener { waiter: Waiter::Borrowed(&mut slot), listeners: &self.listeners })
    }

    /// Counts a listener just registered with the event.
    #[inline]
    fn counted(&self) {
        self.listeners.fetch_add(1, Ordering::Relaxed);
        // SeqCst: orders the registration and the count before the caller's re-check
        // (module docs).
        fence(Ordering::SeqCst);
    }

    /// Whether a notifier must call into the event: fences, then reads the count.
    #[inline]
    fn anyone(&self) -> bool {
        // SeqCst: orders the caller's state change before the count load (module docs).
        fence(Ordering::SeqCst);
        self.listeners.load(Ordering::Relaxed) != 0
    }

    /// Wakes up to `n` listeners that are not notified yet (`Event::notify`). Call it after
    /// the state change the listeners wait for.
    #[inline]
    pub fn notify(&self, n: usize) {
        if self.anyone() {
            // Relaxed: `anyone` already fenced.
            self.event.notify_relaxed(n);
        }
    }

    /// [`notify`](Self::notify) without its fence, for a notifier that orders its state
    /// change before this call itself: with a `SeqCst` fence, or where every listener, after
    /// [`listen`](Self::listen) or [`listen_scoped`](Self::listen_scoped) and before its
    /// re-check, has a full barrier run on the notifier's CPU (`membarrier(2)`), with a
    /// compiler fence. Otherwise a wake-up may be lost.
    #[inline]
    pub fn notify_unfenced(&self, n: usize) {
        // Relaxed: the caller's fence, or the listeners' barrier, orders this load after its
        // state change.
        if self.listeners.load(Ordering::Relaxed) != 0 {
            self.notify_listening(n);
        }
    }

    /// The event's notification, out of line: a notifier that inlines
    /// [`notify_unfenced`](Self::notify_unfenced) into its hot path inlines a load and a
    /// branch, not the event's locking.
    #[cold]
    #[inline(never)]
    fn notify_listening(&self, n: usize) {
        self.event.notify_relaxed(n);
    }

    /// Wakes `n` more listeners, notified ones not counted (`Event::notify_additional`).
    #[inline]
    pub fn notify_additional(&self, n: usize) {
        if self.anyone() {
            // Relaxed: `anyone` already fenced.
            self.event.notify_additional_relaxed(n);
        }
    }
}

/// A registered listener of a [`Signal`]: a future, or something to block on.
#[must_use = "a listener does nothing unless waited for"]
pub struct SignalListener<'a> {
    /// The event-listener registration.
    waiter: Waiter<'a>,
    /// The signal's count of live listeners, released at drop.
    listeners: &'a AtomicUsize,
}

/// Where a [`SignalListener`]'s registration lives.
enum Waiter<'a> {
    /// Boxed by [`Signal::listen`].
    Owned(Option<EventListener>),
    /// On the stack frame of [`Signal::listen_scoped`].
    Borrowed(&'a mut (dyn Registered + Send + Sync + 'a)),
}

impl Waiter<'_> {
    fn registered(&mut self) -> &mut (dyn Registered + Send + Sync + '_) {
        match self {
            Waiter::Owned(l) => l,
            Waiter::Borrowed(l) => *l,
        }
    }
}

/// An event-listener registration, boxed or on a stack, behind one object-safe face.
/// `None` once consumed by a blocking wait.
trait Registered {
    /// Blocks until notified or `deadline`; returns whether it was notified. Consumes the
    /// registration (a second call returns `false` at once).
    fn wait_until(&mut self, deadline: Option<Instant>) -> bool;
    /// Polls for the notification; ready at once when already consumed.
    fn poll_notified(&mut self, cx: &mut Context<'_>) -> Poll<()>;
}

impl<L: Listener + Unpin> Registered for Option<L> {
    fn wait_until(&mut self, deadline: Option<Instant>) -> bool {
        match (self.take(), deadline) {
            (Some(l), None) => {
                l.wait();
                true
            }
            (Some(l), Some(d)) => l.wait_deadline(d).is_some(),
            (None, _) => false,
        }
    }

    fn poll_notified(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.as_mut() {
            Some(l) => Pin::new(l).poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl fmt::Debug for SignalListener<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalListener").finish_non_exhaustive()
    }
}

impl SignalListener<'_> {
    /// Blocks until notified.
    pub fn wait(mut self) {
        self.waiter.registered().wait_until(None);
        // `self` drops here, after the wait: the count covers the whole wait.
    }

    /// Blocks until notified or `timeout` passes; returns whether it was notified.
    pub fn wait_timeout(self, timeout: Duration) -> bool {
        self.wait_deadline(Instant::now() + timeout)
    }

    /// Blocks until notified or `deadline`; returns whether it was notified.
    pub fn wait_deadline(mut self, deadline: Instant) -> bool {
        self.waiter.registered().wait_until(Some(deadline))
    }
}

impl Future for SignalListener<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.waiter.registered().poll_notified(cx)
    }
}

impl Drop for SignalListener<'_> {
    fn drop(&mut self) {
        // Relaxed: a late decrement only makes a notifier call `notify` needlessly.
        self.listeners.fetch_sub(1, Ordering::Relaxed);
    }
}
