//! Any bytes into the handshake and parameter-server message decoders:
//! errors, never a panic. What decodes encodes back to itself, and a hello
//! of another protocol version is refused as such (both versions named),
//! not as bytes that are no hello at all.
#![no_main]

use gradlane_core::control::{CloseNote, Control, HandshakeError, Hello, PROTOCOL_VERSION};
use gradlane_core::ps::messages::{decode_refused, decode_welcome, ParamsHeader, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Hello::decode(data) {
        Ok(hello) => assert_eq!(Hello::decode(&hello.encode()), Ok(hello)),
        Err(HandshakeError::Version { peer, ours }) => {
            assert_eq!(ours, PROTOCOL_VERSION);
            assert_ne!(peer, ours, "our own version refused as another");
        }
        Err(_) => {}
    }
    if let [b'G', b'L', b'H', v @ b'0'..=b'9', ..] = data {
        if v - b'0' != PROTOCOL_VERSION {
            assert!(
                matches!(Hello::decode(data), Err(HandshakeError::Version { .. })),
                "a hello of version {} not refused for its version",
                v - b'0'
            );
        }
    }
    if let Ok(control) = Control::decode(data) {
        assert_eq!(Control::decode(&control.encode()), Ok(control));
    }
    if let Some(note) = CloseNote::decode(data) {
        assert_eq!(CloseNote::decode(&note.encode()), Some(note));
    }
    let _ = Request::decode(data);
    let _ = ParamsHeader::decode(data);
    let _ = decode_refused(data);
    let _ = decode_welcome(data);
});
