//! Matched probe (MPI 3.0 §3.8.2): [`Communicator::improbe`] and [`Communicator::mprobe`]
//! take the message they find out of the matching queues and hand it over as a [`Message`],
//! which only [`Message::mrecv`] / [`Message::imrecv`] receive.
//!
//! `iprobe` followed by `recv` is a race when two threads probe the same source: between one
//! thread's probe and its receive, the other thread's receive may take the message probed,
//! and the first one receives another message than the one it sized its buffer for (or
//! waits for one that never comes). A matched probe takes the message out of the unexpected
//! queue under the matching lock, where a receive would take it, so no receive and no other
//! probe can match it afterwards: each thread receives exactly the message it probed.

use std::time::Duration;

use weft_sync::{Error, IdleBackoff, Status};
use weft_transport::Frame;

use crate::buffer::RecvBuf;
use crate::comm::{recv_operation, Communicator};
use crate::matching::{message_len, Source, Tag};
use crate::request::Request;

/// A message matched by a probe ([`Communicator::improbe`], [`Communicator::mprobe`];
/// `MPI_Message`): out of the matching queues, it belongs to this handle, and only
/// [`mrecv`](Self::mrecv) or [`imrecv`](Self::imrecv) receive it.
///
/// Dropping it without receiving discards the message (a rendezvous sender is told the
/// message was consumed, so its send completes).
pub struct Message<'c> {
    comm: &'c Communicator,
    /// `None` once received.
    frame: Option<Frame>,
    /// Its envelope, with the source as a rank of `comm`.
    status: Status,
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message").field("status", &self.status).finish()
    }
}

impl Communicator {
    /// Looks for a matching message that has arrived and, if there is one, takes it out of
    /// the matching queues (`MPI_Improbe`): the [`Message`] returned is received by
    /// [`Message::mrecv`] or [`Message::imrecv`] only, never by another receive or probe.
    /// Makes one step of progress first.
    ///
    /// `source` and `tag` may be wildcards; the message taken is the one a receive posted
    /// now would match (the earliest that fits, in the order MPI's matching rules give). As
    /// [`iprobe`](Self::iprobe): a source or tag a receive would refuse is refused, and with
    /// nothing queued, a source that is gone (lost or finished; `Source::Any` with no peer
    /// left) is [`Error::PeerLost`] rather than `None` for ever. (weft has no null rank, so
    /// MPI's `MPI_MESSAGE_NO_PROC` has no counterpart.)
    ///
    /// ```
    /// use weft::{Runtime, Source, Tag};
    /// let rt = Runtime::builder().env(false).build().unwrap();
    /// let comm = rt.world();
    /// assert!(comm.improbe(Source::Any, Tag::Any).unwrap().is_none());
    /// comm.send(vec![1u32, 2, 3], 0, 5).unwrap();
    /// let msg = comm.mprobe(Source::Any, Tag::Any).unwrap();
    /// // Sized from the probe: exactly the message probed is received.
    /// let n = msg.status().bytes / 4;
    /// assert!(comm.iprobe(0u32, 5).unwrap().is_none(), "the message left the queues");
    /// let (v, st) = msg.mrecv(Vec::<u32>::with_capacity(n)).unwrap();
    /// assert_eq!((v, st.tag), (vec![1, 2, 3], 5));
    /// ```
    pub fn improbe(&self, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Option<Message<'_>>, Error> {
        let frame = self.probe_with(source.into(), tag.into(), |m, source, tag| m.take_unexpected(source, tag))?;
        Ok(frame.map(|frame| {
            let h = frame.header;
            let status = self.local_status(Status { source: h.source, tag: h.tag, bytes: message_len(&frame) });
            Message { comm: self, frame: Some(frame), status }
        }))
    }

    /// Waits for a matching message and takes it out of the matching queues (`MPI_Mprobe`);
    /// see [`improbe`](Self::improbe), which it repeats, making progress, until one is
    /// found or an error says none can come. While nothing arrives it backs off from
    /// spinning to naps of at most 1 ms (running the rank's pool tasks meanwhile), as the
    /// blocking probes of MPI libraries poll.
    pub fn mprobe(&self, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Message<'_>, Error> {
        let (source, tag) = (source.into(), tag.into());
        let engine = self.engine();
        let mut idle = IdleBackoff::new();
        let mut nap = Duration::from_micros(20);
        loop {
            if let Some(msg) = self.improbe(source, tag)? {
                return Ok(msg);
            }
            if engine.work_before_sleep() || crate::executor::help(&engine.executor) {
                idle.reset();
                nap = Duration::from_micros(20);
            } else if !idle.is_completed() {
                idle.snooze();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }
}

impl<'c> Message<'c> {
    /// The message's envelope: its source (a rank of the communicator), tag and length in
    /// bytes (`MPI_Mprobe`'s status).
    pub fn status(&self) -> Status {
        self.status
    }

    /// The communicator the message arrived on.
    pub fn communicator(&self) -> &'c Communicator {
        self.comm
    }

    /// Starts receiving the message into `buf`'s capacity (`MPI_Imrecv`). The request
    /// resolves as an [`irecv`](Communicator::irecv)'s does: the buffer with its length set
    /// to the message, or [`Error::Truncated`] / [`Error::Misaligned`] if it does not fit.
    /// An eager message is copied before this returns; a rendezvous one is read when
    /// progress runs. It cannot be cancelled: its message is matched already.
    pub fn imrecv<B: RecvBuf>(mut self, mut buf: B) -> Request<'c, B> {
        let comm = self.comm;
        let st = comm.p2p();
        let inner = recv_operation(st.context, &mut buf);
        // A message holds its frame until this call (by value) or its drop takes it.
        let Some(frame) = self.frame.take() else {
            inner.cell.complete(Err(Error::InvalidArgument("message already received")));
            return Request::recv(comm, inner, buf, 0);
        };
        let part = st.place(Source::Rank(frame.header.source), Tag::Is(frame.header.tag)).part;
        let s = comm.engine();
        s.finish_match(s.cri_for_thread(), crate::operation::Held::of(&inner), frame);
        Request::recv(comm, inner, buf, part)
    }

    /// Receives the message into `buf`'s capacity and waits (`MPI_Mrecv`); see
    /// [`imrecv`](Self::imrecv).
    pub fn mrecv<B: RecvBuf>(self, buf: B) -> Result<(B, Status), Error> {
        self.imrecv(buf).wait()
    }
}

impl Drop for Message<'_> {
    fn drop(&mut self) {
        if let Some(frame) = self.frame.take() {
            self.comm.engine().release_frame(frame);
        }
    }
}
