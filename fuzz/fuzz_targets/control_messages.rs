//! Any bytes into the handshake and parameter-server message decoders.
#![no_main]

use gradlane::ps_net::protocol::{decode_refused, ParamsHeader, Request};
use gradlane::transport::handshake::{Control, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Hello::decode(data);
    let _ = Control::decode(data);
    let _ = Request::decode(data);
    let _ = ParamsHeader::decode(data);
    let _ = decode_refused(data);
});
