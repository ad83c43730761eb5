//! Any bytes into the handshake and parameter-server message decoders.
#![no_main]

use gradlane_core::ps::messages::{decode_refused, ParamsHeader, Request};
use gradlane_core::control::{Control, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Hello::decode(data);
    let _ = Control::decode(data);
    let _ = Request::decode(data);
    let _ = ParamsHeader::decode(data);
    let _ = decode_refused(data);
});
