//! The `tracing` events a user debugging a hang relies on are emitted where the design says:
//! a rendezvous message's read start and finish and its sender's `Fin`, and a frame deferred
//! behind a full inbox. (A minimal subscriber records the messages on this thread.)

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use weft::{wait_all, Runtime, Source, Tag};

/// Records the `message` of every event.
#[derive(Clone, Default)]
struct Messages(Arc<Mutex<Vec<String>>>);

struct MessageOf<'a>(&'a mut String);

impl Visit for MessageOf<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Messages {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut m = String::new();
        event.record(&mut MessageOf(&mut m));
        self.0.lock().unwrap().push(m);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Messages {
    fn count(&self, what: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|m| m.contains(what)).count()
    }
}

#[test]
fn rendezvous_and_deferral_are_traced() {
    let messages = Messages::default();
    tracing::subscriber::with_default(messages.clone(), || {
        // Eager threshold 64 bytes, inbox of 2 frames: the 1 KiB message goes by
        // rendezvous, and a burst of small sends fills the inbox.
        let ranks = Runtime::builder().env(false).eager_threshold(64).inbox_capacity(2).build_local(2).unwrap();
        let (a, b) = (ranks[0].world(), ranks[1].world());
        let big = vec![7u8; 1024];
        let mut reqs = vec![b.irecv(Vec::<u8>::with_capacity(1024), Source::Rank(0), Tag::Is(1)).unwrap()];
        let mut sends = vec![a.isend(big, 1, 1).unwrap()];
        for i in 0..16 {
            sends.push(a.isend(vec![i as u8], 1, 2).unwrap());
        }
        for _ in 0..16 {
            reqs.push(b.irecv(Vec::<u8>::with_capacity(8), Source::Rank(0), Tag::Is(2)).unwrap());
        }
        wait_all(&mut reqs).unwrap();
        wait_all(&mut sends).unwrap();
        let (buf, _) = reqs.remove(0).wait().unwrap();
        assert_eq!(buf, vec![7u8; 1024]);
    });
    assert_eq!(messages.count("rendezvous read starts"), 1, "events: {:?}", messages.0.lock().unwrap());
    assert_eq!(messages.count("rendezvous read over"), 1);
    assert_eq!(messages.count("rendezvous send finished"), 1);
    assert!(messages.count("frame deferred behind a full inbox") >= 1, "events: {:?}", messages.0.lock().unwrap());
}
