//! `WEFT_IDLE_PAUSE` / `Builder::idle_pause`: parsed, bounded, and a runtime with any valid
//! value carries traffic. (One test per binary: it sets process environment variables.)

use weft::{Runtime, Source, Tag};

#[test]
fn idle_pause_from_builder_and_environment() {
    assert_eq!(Runtime::builder().env(false).resolve().unwrap().idle_pause, 1, "default");
    assert_eq!(Runtime::builder().env(false).idle_pause(0).resolve().unwrap().idle_pause, 0);
    let err = Runtime::builder().env(false).idle_pause(5000).build().unwrap_err();
    assert!(matches!(err, weft::Error::InvalidArgument(_)), "{err:?}");

    std::env::set_var("WEFT_IDLE_PAUSE", " 3 ");
    assert_eq!(Runtime::builder().idle_pause(9).resolve().unwrap().idle_pause, 3, "the variable overrides the builder");
    for bad in ["-1", "lots", "4097", "99999999999"] {
        std::env::set_var("WEFT_IDLE_PAUSE", bad);
        let err = Runtime::builder().resolve().unwrap_err();
        assert!(matches!(err, weft::Error::InvalidArgument(_)), "{bad}: {err:?}");
        assert!(Runtime::builder().build().is_err(), "{bad}");
    }
    std::env::remove_var("WEFT_IDLE_PAUSE");

    // Waiters with no pause and with a long one both get their messages.
    for pause in [0, 4096] {
        let ranks = Runtime::builder().env(false).idle_pause(pause).build_local(2).unwrap();
        let (a, b) = (ranks[0].world(), ranks[1].world());
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..200u32 {
                    let (buf, st) = b.recv(Vec::<u32>::with_capacity(1), Source::Rank(0), Tag::Any).unwrap();
                    assert_eq!((buf, st.tag), (vec![i], i as i32));
                }
            });
            for i in 0..200u32 {
                a.send(vec![i], 1, i as i32).unwrap();
            }
        });
    }
}
