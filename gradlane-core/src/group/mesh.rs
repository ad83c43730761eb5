//! The rendezvous: the first message on every link of a group says which
//! rank speaks (and, to rank 0, where it listens) and for which view of
//! the group; rank 0 answers with every rank's address.
//!
//! Both are text: they are read once per link, and a person reading a
//! packet capture should see who is who.

use super::{end, field, words, GroupMessageError};
use std::net::SocketAddr;

/// The largest group a rank will join: a hello or table claiming more is
/// refused before its table is read.
pub const MAX_WORLD: usize = 1 << 16;

/// The kind and version word both messages start with.
const KIND: &str = "gradlane-group/1";

/// The longest hello: the kind, two ranks, an IPv6 address with port, an
/// epoch and a view digest (at most 125 bytes as encoded).
const MAX_HELLO_BYTES: usize = 128;

/// The longest text of one address in a table (`[v6%scope]:port`).
pub(super) const MAX_ADDRESS_BYTES: usize = 64;

/// The first message on every link of a group: who is speaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshHello {
    /// The digest of the view's members ([`view_digest`]) for a view
    /// after the first: two ranks forming one epoch's mesh for different
    /// member lists of the same size must not link up (an admission and
    /// an agreement that overlapped). `None` for the first mesh, and from
    /// a rank of the hello's first versions.
    pub view: Option<u64>,
    /// The speaker's rank.
    pub rank: usize,
    /// The size of the group it joins.
    pub world: usize,
    /// Where it listens, when it tells rank 0.
    pub listen: Option<SocketAddr>,
    /// The view of the group the link is formed for (0 for the first
    /// mesh; see [`ViewDecision`](super::ViewDecision)).
    pub epoch: u64,
}

impl MeshHello {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let listen = self
            .listen
            .map(|a| a.to_string())
            .unwrap_or_else(|| "-".into());
        let view = self.view.map(|d| format!(" {d:016x}")).unwrap_or_default();
        format!(
            "{KIND} {} {} {listen} {}{view}",
            self.rank, self.world, self.epoch
        )
        .into_bytes()
    }

    /// The hello in `body`: a rank inside a group of 1 to [`MAX_WORLD`].
    /// A hello without the trailing epoch (the first version's three
    /// fields) is for epoch 0.
    pub fn decode(body: &[u8]) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "group hello";
        let mut words = words(body, MESSAGE, KIND, MAX_HELLO_BYTES)?;
        let rank = field(&mut words, MESSAGE, "rank")?;
        let world = field(&mut words, MESSAGE, "world")?;
        let listen = match words.next() {
            Some("-") => None,
            Some(a) => Some(a.parse().map_err(|_| GroupMessageError::BadField {
                message: MESSAGE,
                field: "listening address",
            })?),
            None => {
                return Err(GroupMessageError::BadField {
                    message: MESSAGE,
                    field: "listening address",
                })
            }
        };
        let epoch = match words.next() {
            None => 0,
            Some(e) => e.parse().map_err(|_| GroupMessageError::BadField {
                message: MESSAGE,
                field: "epoch",
            })?,
        };
        let view = match words.next() {
            None => None,
            Some(d) => {
                Some(
                    u64::from_str_radix(d, 16).map_err(|_| GroupMessageError::BadField {
                        message: MESSAGE,
                        field: "view digest",
                    })?,
                )
            }
        };
        end(&mut words, MESSAGE)?;
        check_world(world)?;
        if rank >= world {
            return Err(GroupMessageError::Rank { rank, world });
        }
        Ok(Self {
            view,
            rank,
            world,
            listen,
            epoch,
        })
    }
}

/// Which mesh a rank forms: the view's epoch and, after the first mesh,
/// its members' digest ([`view_digest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshMark {
    /// The view's epoch (0 for the first mesh).
    pub epoch: u64,
    /// Its members' digest; `None` for the first mesh.
    pub digest: Option<u64>,
}

/// What a rank forming a mesh does with a peer's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloVerdict {
    /// Link up with it: its rank is expected here and not linked yet.
    Take,
    /// Drop the connection and wait on: a rank forming another view's
    /// mesh (an agreement that went on without this rank, or an old one).
    OtherView,
    /// The meshes cannot be formed together: this rank stops with it.
    Refuse(MeshRefusal),
}

/// Why a rank forming a mesh stops at a peer's hello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshRefusal {
    /// Same epoch, other members: an admission and an agreement (or two
    /// agreements) that overlapped. Linking up would mix two views in one
    /// mesh.
    #[error(
        "it forms view {epoch} with other members (digest {theirs:016x}, this rank's {ours:016x})"
    )]
    OtherMembers {
        /// The view's epoch.
        epoch: u64,
        /// The hello's digest.
        theirs: u64,
        /// This rank's.
        ours: u64,
    },
    /// It joined a group of another size.
    #[error("it joined a group of {theirs} ranks, this one has {ours}")]
    OtherWorld {
        /// The hello's.
        theirs: usize,
        /// This group's.
        ours: usize,
    },
    /// Its rank is not one this rank waits for (or has a link from
    /// already): two ranks with one number.
    #[error("rank {rank} connected to rank {me} unexpectedly (two ranks with one number?)")]
    Unexpected {
        /// The hello's rank.
        rank: usize,
        /// This rank.
        me: usize,
    },
}

/// The verdict on `hello` for rank `me` of a group of `world` forming the
/// mesh `mark`, where `awaited(rank)` says whether that rank is one it
/// waits for a link from (and has none from yet).
pub fn judge_hello(
    hello: &MeshHello,
    mark: MeshMark,
    me: usize,
    world: usize,
    awaited: impl Fn(usize) -> bool,
) -> HelloVerdict {
    if hello.epoch != mark.epoch {
        return HelloVerdict::OtherView;
    }
    if let (Some(theirs), Some(ours)) = (hello.view, mark.digest) {
        if theirs != ours {
            return HelloVerdict::Refuse(MeshRefusal::OtherMembers {
                epoch: mark.epoch,
                theirs,
                ours,
            });
        }
    }
    if hello.world != world {
        return HelloVerdict::Refuse(MeshRefusal::OtherWorld {
            theirs: hello.world,
            ours: world,
        });
    }
    match awaited(hello.rank) {
        true => HelloVerdict::Take,
        false => HelloVerdict::Refuse(MeshRefusal::Unexpected {
            rank: hello.rank,
            me,
        }),
    }
}

/// The digest a [`MeshHello`] names its view by: FNV-1a over the epoch
/// and the members (as they joined, in the view's order). Two views of
/// one epoch with different members differ in it but by a 64-bit
/// collision.
pub fn view_digest(epoch: u64, members: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let words = std::iter::once(epoch).chain(members.iter().map(|&m| m as u64));
    for byte in words.flat_map(u64::to_le_bytes) {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The address table rank 0 hands every other rank: rank `r` listens at
/// entry `r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressTable(pub Vec<SocketAddr>);

impl AddressTable {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let addrs: Vec<String> = self.0.iter().map(|a| a.to_string()).collect();
        format!("{KIND} table {}", addrs.join(" ")).into_bytes()
    }

    /// The table in `body`, which must hold `world` addresses (the group's
    /// size, at most [`MAX_WORLD`]); its length is checked before any
    /// address is read.
    pub fn decode(body: &[u8], world: usize) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "address table";
        check_world(world)?;
        let max = KIND.len() + " table".len() + world * (1 + MAX_ADDRESS_BYTES);
        let mut words = words(body, MESSAGE, KIND, max)?;
        if words.next() != Some("table") {
            return Err(GroupMessageError::WrongKind {
                message: MESSAGE,
                expected: "gradlane-group/1 table",
            });
        }
        let got = words.clone().count();
        if got != world {
            return Err(GroupMessageError::WorldMismatch {
                message: MESSAGE,
                got,
                world,
            });
        }
        let mut table = Vec::with_capacity(world);
        for _ in 0..world {
            table.push(field(&mut words, MESSAGE, "address")?);
        }
        Ok(Self(table))
    }
}

/// A group of 1 to [`MAX_WORLD`] ranks.
pub(super) fn check_world(world: usize) -> Result<(), GroupMessageError> {
    match world {
        1..=MAX_WORLD => Ok(()),
        _ => Err(GroupMessageError::World {
            world,
            max: MAX_WORLD,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_is_taken_skipped_or_refused_as_its_view_and_rank_say() {
        let ours = view_digest(3, &[0, 1, 3]);
        let mark = MeshMark {
            epoch: 3,
            digest: Some(ours),
        };
        let hello = MeshHello {
            rank: 2,
            world: 4,
            listen: None,
            epoch: 3,
            view: Some(ours),
        };
        let awaited = |r: usize| r == 2;
        assert_eq!(judge_hello(&hello, mark, 1, 4, awaited), HelloVerdict::Take);
        // From a rank of the hello's first versions: no digest to compare.
        let old = MeshHello {
            view: None,
            ..hello
        };
        assert_eq!(judge_hello(&old, mark, 1, 4, awaited), HelloVerdict::Take);
        let later = MeshHello { epoch: 4, ..hello };
        assert_eq!(
            judge_hello(&later, mark, 1, 4, awaited),
            HelloVerdict::OtherView
        );
        let theirs = view_digest(3, &[0, 2, 3]);
        let other = MeshHello {
            view: Some(theirs),
            ..hello
        };
        assert_eq!(
            judge_hello(&other, mark, 1, 4, awaited),
            HelloVerdict::Refuse(MeshRefusal::OtherMembers {
                epoch: 3,
                theirs,
                ours
            })
        );
        let bigger = MeshHello { world: 5, ..hello };
        assert_eq!(
            judge_hello(&bigger, mark, 1, 4, awaited),
            HelloVerdict::Refuse(MeshRefusal::OtherWorld { theirs: 5, ours: 4 })
        );
        let twice = judge_hello(&hello, mark, 1, 4, |_| false);
        assert_eq!(
            twice,
            HelloVerdict::Refuse(MeshRefusal::Unexpected { rank: 2, me: 1 })
        );
    }

    #[test]
    fn hellos_and_tables_round_trip() {
        let h = MeshHello {
            rank: 3,
            world: 4,
            listen: Some("10.0.0.4:4433".parse().unwrap()),
            epoch: 0,
            view: None,
        };
        assert_eq!(MeshHello::decode(&h.encode()), Ok(h));
        let none = MeshHello { listen: None, ..h };
        assert_eq!(MeshHello::decode(&none.encode()), Ok(none));
        let later = MeshHello { epoch: 7, ..h };
        assert_eq!(MeshHello::decode(&later.encode()), Ok(later));
        let named = MeshHello {
            epoch: 7,
            view: Some(view_digest(7, &[0, 2, 3])),
            ..h
        };
        assert_eq!(MeshHello::decode(&named.encode()), Ok(named));
        assert_ne!(view_digest(7, &[0, 2, 3]), view_digest(7, &[1, 2, 3]));
        assert!(MeshHello::decode(b"gradlane-group/1 3 4 - 7 zz").is_err());
        // The longest a hello can be still fits its bound.
        let longest = MeshHello {
            rank: MAX_WORLD - 1,
            world: MAX_WORLD,
            listen: Some(
                "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535"
                    .parse()
                    .unwrap(),
            ),
            epoch: u64::MAX,
            view: Some(u64::MAX),
        };
        assert!(longest.encode().len() <= MAX_HELLO_BYTES);
        assert_eq!(MeshHello::decode(&longest.encode()), Ok(longest));
        let table = AddressTable(vec![
            "127.0.0.1:1".parse().unwrap(),
            "[::1]:2".parse().unwrap(),
        ]);
        assert_eq!(AddressTable::decode(&table.encode(), 2), Ok(table.clone()));
    }

    #[test]
    fn bad_hellos_are_typed_errors() {
        let bad = |body: &[u8]| MeshHello::decode(body).unwrap_err();
        assert!(matches!(bad(b""), GroupMessageError::WrongKind { .. }));
        assert!(matches!(
            bad(b"gradlane-group/2 1 2 -"),
            GroupMessageError::WrongKind { .. }
        ));
        assert!(matches!(
            bad(b"\xff\xfe"),
            GroupMessageError::NotText { .. }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 x 2 -"),
            GroupMessageError::BadField { field: "rank", .. }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 1 2"),
            GroupMessageError::BadField { .. }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 1 2 - extra"),
            GroupMessageError::BadField { field: "epoch", .. }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 1 2 - 3 extra"),
            GroupMessageError::BadField {
                field: "view digest",
                ..
            }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 1 2 - 3 0a extra"),
            GroupMessageError::Trailing { .. }
        ));
        assert!(matches!(
            bad(b"gradlane-group/1 1 2 - -1"),
            GroupMessageError::BadField { field: "epoch", .. }
        ));
        assert_eq!(
            bad(b"gradlane-group/1 2 2 -"),
            GroupMessageError::Rank { rank: 2, world: 2 }
        );
        assert_eq!(
            bad(b"gradlane-group/1 0 0 -"),
            GroupMessageError::World {
                world: 0,
                max: MAX_WORLD
            }
        );
        // A world that would make the table's reader allocate without bound.
        assert_eq!(
            bad(format!("gradlane-group/1 1 {} -", usize::MAX).as_bytes()),
            GroupMessageError::World {
                world: usize::MAX,
                max: MAX_WORLD
            }
        );
        let long = vec![b'a'; MAX_HELLO_BYTES + 1];
        assert!(matches!(bad(&long), GroupMessageError::TooLong { .. }));
    }

    #[test]
    fn hellos_without_an_epoch_are_for_the_first_mesh() {
        assert_eq!(
            MeshHello::decode(b"gradlane-group/1 1 2 127.0.0.1:9"),
            Ok(MeshHello {
                rank: 1,
                world: 2,
                listen: Some("127.0.0.1:9".parse().unwrap()),
                epoch: 0,
                view: None,
            })
        );
        assert_eq!(
            MeshHello::decode(b"gradlane-group/1 1 2 -").map(|h| h.epoch),
            Ok(0)
        );
    }

    #[test]
    fn tables_of_another_size_or_too_long_are_refused_before_reading() {
        let table = AddressTable(vec!["127.0.0.1:1".parse().unwrap()]);
        assert_eq!(
            AddressTable::decode(&table.encode(), 3),
            Err(GroupMessageError::WorldMismatch {
                message: "address table",
                got: 1,
                world: 3
            })
        );
        assert!(matches!(
            AddressTable::decode(b"gradlane-group/1 table x", 1),
            Err(GroupMessageError::BadField { .. })
        ));
        assert!(matches!(
            AddressTable::decode(b"gradlane-group/1 tables 127.0.0.1:1", 1),
            Err(GroupMessageError::WrongKind { .. })
        ));
        assert!(matches!(
            AddressTable::decode(b"gradlane-group/1 table", 1),
            Err(GroupMessageError::WorldMismatch { got: 0, .. })
        ));
        // Two ranks' worth of addresses, and then a megabyte.
        let mut long = table.encode();
        long.extend(std::iter::repeat_n(b' ', 1 << 20));
        assert!(matches!(
            AddressTable::decode(&long, 2),
            Err(GroupMessageError::TooLong { .. })
        ));
        assert!(matches!(
            AddressTable::decode(&table.encode(), MAX_WORLD + 1),
            Err(GroupMessageError::World { .. })
        ));
    }
}
