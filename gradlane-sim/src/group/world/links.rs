//! The links: a message sent, delivered and read; a link failed, closed
//! and noticed at each end.

use super::*;

impl World<'_, Grouping<'_>> {
    pub(super) fn new_link(&mut self, a: usize, b: usize) -> usize {
        self.m.links.push(Link {
            ends: [a, b],
            incs: [self.m.ranks[a].inc, self.m.ranks[b].inc],
            failed: false,
            lanes: [Lane::new(), Lane::new()],
        });
        self.m.links.len() - 1
    }

    /// Sends `msg` from `from` on `link`; `false` where the send fails at
    /// once (the rank then knows the link failed).
    pub(super) fn send(&mut self, from: usize, link: usize, msg: Msg) -> bool {
        let end = usize::from(self.m.links[link].ends[0] == from);
        let peer = self.m.links[link].ends[end];
        if self.m.links[link].failed {
            let knows = self.m.ranks[from].failed.contains_key(&peer)
                || self.m.ranks[from].next_failed.contains_key(&peer);
            let finds_out = self.send_finds_out();
            return !(knows || finds_out);
        }
        self.m.messages += 1;
        let bound = self.m.link_bound;
        let m = &mut self.m;
        m.links[link].lanes[end].count((from, peer, bound), &mut m.violations);
        let (extra, until) = self.m.slow[from * self.m.n + peer];
        let extra = if self.now < until { extra } else { 0 };
        let earliest = self.now + self.delay() + extra;
        let at = self.m.links[link].lanes[end].push(earliest, msg);
        self.m.in_flight += 1;
        if self.m.in_flight == self.m.flight_bound + 1 {
            self.m.violations.push(Violation::Flooded {
                bound: self.m.flight_bound,
            });
        }
        self.schedule(at, Ev::Deliver { link, end });
        true
    }

    /// The link fails. Of what was on its way each way, what arrives is
    /// a prefix; each live end notices a while after the last of it.
    pub(super) fn fail_link(&mut self, link: usize) {
        if self.m.links[link].failed {
            return;
        }
        self.m.links[link].failed = true;
        for end in 0..2 {
            let (r, inc) = (self.m.links[link].ends[end], self.m.links[link].incs[end]);
            let len = self.m.links[link].lanes[end].queue.len();
            let keep = match self.is(r, inc) {
                true => self.rng.below(len + 1),
                false => 0,
            };
            let (dropped, after) = self.m.links[link].lanes[end].cut_to(keep, self.now);
            self.m.in_flight -= dropped;
            if self.is(r, inc) {
                let at = self.notice_at(after);
                self.schedule(at, Ev::Notice { link, end });
            }
        }
    }

    /// `by` closes `link`: what it sent arrives, then the close (saying
    /// the peer was removed, or not); nothing more is read at `by`.
    pub(super) fn close(&mut self, by: usize, link: usize, removed: bool) {
        if self.m.links[link].failed {
            return;
        }
        let end = usize::from(self.m.links[link].ends[0] == by);
        self.m.links[link].failed = true;
        let (dropped, _) = self.m.links[link].lanes[1 - end].cut_to(0, self.now);
        self.m.in_flight -= dropped;
        let earliest = self.now + self.delay();
        let at = self.m.links[link].lanes[end].push(earliest, Msg::Close { removed });
        self.m.in_flight += 1;
        self.schedule(at, Ev::Deliver { link, end });
    }

    /// `rank` closes every link it has (its process ends or gives up).
    pub(super) fn close_all(&mut self, rank: usize) {
        let r = &mut self.m.ranks[rank];
        let links: Vec<usize> = r
            .links
            .values()
            .chain(r.next_links.values())
            .copied()
            .collect();
        r.links.clear();
        r.next_links.clear();
        r.pending.clear();
        r.next_pending.clear();
        for l in links {
            self.close(rank, l, false);
        }
    }

    pub(super) fn deliver(&mut self, link: usize, end: usize) {
        let Some((_, msg)) = self.m.links[link].lanes[end].queue.pop_front() else {
            return;
        };
        self.m.in_flight -= 1;
        let (r, inc) = (self.m.links[link].ends[end], self.m.links[link].incs[end]);
        if !self.is(r, inc) {
            return;
        }
        let peer = self.m.links[link].ends[1 - end];
        if let Msg::Close { removed } = msg {
            self.note(|| format!("rank {r} <- {peer}: close (removed: {removed})"));
            self.lose(r, peer, link, removed);
            return;
        }
        let rank = &mut self.m.ranks[r];
        let queue = if rank.links.get(&peer) == Some(&link) {
            rank.pending.entry(peer).or_default()
        } else if rank.next_links.get(&peer) == Some(&link) {
            rank.next_pending.entry(peer).or_default()
        } else {
            // A link this rank no longer reads.
            return;
        };
        let line = self
            .trace
            .is_some()
            .then(|| format!("rank {r} <- {peer}: {msg:?}"));
        queue.push_back(msg);
        if let Some(line) = line {
            self.note(|| line);
        }
        self.poke(r);
    }

    /// `r` learns its link to `peer` failed (closed saying removed).
    pub(super) fn lose(&mut self, r: usize, peer: usize, link: usize, removed: bool) {
        let rank = &mut self.m.ranks[r];
        if rank.links.get(&peer) == Some(&link) {
            rank.failed.entry(peer).or_insert(removed);
        } else if rank.next_links.get(&peer) == Some(&link) {
            rank.next_failed.entry(peer).or_insert(removed);
        } else {
            return;
        }
        self.poke(r);
    }
}
