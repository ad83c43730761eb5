//! The further paths between two ranks: once the mesh is formed, each rank
//! offers each peer how many paths it will use and the ports of its
//! further sockets; a rank that connects a further path says which.

use super::{end, field, words, GroupMessageError};

/// The most sockets (so paths per peer) a rank opens.
pub const MAX_SOCKETS: usize = 64;

const OFFER: &str = "gradlane-paths/1";
const HELLO: &str = "gradlane-path/1";

/// An offer's longest text: the kind, a count and `MAX_SOCKETS - 1` ports.
const MAX_OFFER_BYTES: usize = OFFER.len() + 4 + MAX_SOCKETS * 6;

/// A path hello's longest text: the kind and two numbers.
const MAX_PATH_HELLO_BYTES: usize = HELLO.len() + 2 * 21;

/// What a rank tells each peer on the first path once the mesh is formed:
/// how many paths it offers, and the ports of its further sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathOffer {
    /// The paths it offers (1 to [`MAX_SOCKETS`]).
    pub paths: usize,
    /// Its further sockets' ports, in order (none for one path).
    pub ports: Vec<u16>,
}

impl PathOffer {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        format!("{OFFER} {} {}", self.paths, ports.join(" "))
            .trim_end()
            .as_bytes()
            .to_vec()
    }

    /// The offer in `body`, if its paths fit its ports.
    pub fn decode(body: &[u8]) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "path offer";
        let mut words = words(body, MESSAGE, OFFER, MAX_OFFER_BYTES)?;
        let paths: usize = field(&mut words, MESSAGE, "paths")?;
        let mut ports = Vec::new();
        for word in words {
            let port = word.parse().map_err(|_| GroupMessageError::BadField {
                message: MESSAGE,
                field: "port",
            })?;
            ports.push(port);
        }
        let fits = (1..=MAX_SOCKETS).contains(&paths)
            && ports.len() < MAX_SOCKETS
            && (paths == 1 || !ports.is_empty());
        if !fits {
            return Err(GroupMessageError::PathsDoNotFit {
                paths,
                ports: ports.len(),
                max: MAX_SOCKETS,
            });
        }
        Ok(Self { paths, ports })
    }
}

/// The first message on a further path: who connects, and which path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathHello {
    /// The connecting rank.
    pub rank: usize,
    /// The path (1 and up: path 0 is the mesh's link).
    pub path: usize,
}

impl PathHello {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        format!("{HELLO} {} {}", self.rank, self.path).into_bytes()
    }

    /// The path hello in `body`. Whether that rank and path were expected
    /// is the receiver's to check.
    pub fn decode(body: &[u8]) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "path hello";
        let mut words = words(body, MESSAGE, HELLO, MAX_PATH_HELLO_BYTES)?;
        let rank = field(&mut words, MESSAGE, "rank")?;
        let path = field(&mut words, MESSAGE, "path")?;
        end(&mut words, MESSAGE)?;
        Ok(Self { rank, path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_and_path_hellos_round_trip() {
        let offer = PathOffer {
            paths: 3,
            ports: vec![40001, 40002],
        };
        assert_eq!(PathOffer::decode(&offer.encode()), Ok(offer));
        let single = PathOffer {
            paths: 1,
            ports: vec![],
        };
        assert_eq!(PathOffer::decode(&single.encode()), Ok(single));
        let most = PathOffer {
            paths: MAX_SOCKETS,
            ports: vec![u16::MAX; MAX_SOCKETS - 1],
        };
        assert_eq!(PathOffer::decode(&most.encode()), Ok(most));
        let hello = PathHello { rank: 3, path: 2 };
        assert_eq!(PathHello::decode(&hello.encode()), Ok(hello));
    }

    #[test]
    fn bad_offers_and_hellos_are_typed_errors() {
        for bad in [&b""[..], b"gradlane-paths/1 2 x", b"\xff"] {
            assert!(PathOffer::decode(bad).is_err(), "{bad:?}");
        }
        for bad in [
            &b"gradlane-paths/1 0"[..],
            b"gradlane-paths/1 2",
            b"gradlane-paths/1 65 1",
        ] {
            assert!(
                matches!(
                    PathOffer::decode(bad),
                    Err(GroupMessageError::PathsDoNotFit { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            PathOffer::decode(b"gradlane-paths/1 2 70000"),
            Err(GroupMessageError::BadField { field: "port", .. })
        ));
        assert!(matches!(
            PathOffer::decode(b"gradlane-paths/2 1"),
            Err(GroupMessageError::WrongKind { .. })
        ));
        // Many ports: refused by length before a port is read.
        let many = format!("gradlane-paths/1 2 {}", "1 ".repeat(1000));
        assert!(matches!(
            PathOffer::decode(many.as_bytes()),
            Err(GroupMessageError::TooLong { .. })
        ));
        assert!(matches!(
            PathOffer::decode(b"gradlane-paths/1"),
            Err(GroupMessageError::BadField { field: "paths", .. })
        ));
        assert!(matches!(
            PathHello::decode(b"x 1 2"),
            Err(GroupMessageError::WrongKind { .. })
        ));
        assert!(matches!(
            PathHello::decode(b"gradlane-path/1 3"),
            Err(GroupMessageError::BadField { field: "path", .. })
        ));
        assert!(matches!(
            PathHello::decode(b"gradlane-path/1 3 2 1"),
            Err(GroupMessageError::Trailing { .. })
        ));
        assert!(matches!(
            PathHello::decode(b"gradlane-paths/1 3 2"),
            Err(GroupMessageError::WrongKind { .. })
        ));
    }
}
