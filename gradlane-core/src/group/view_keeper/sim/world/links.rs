//! The links: a message sent, delivered and read; a link failed, closed
//! and noticed at each end.

use super::*;

impl World<'_> {
    pub(super) fn new_link(&mut self, a: usize, b: usize) -> usize {
        self.links.push(Link {
            ends: [a, b],
            incs: [self.ranks[a].inc, self.ranks[b].inc],
            failed: false,
            queues: [VecDeque::new(), VecDeque::new()],
            last_at: [0, 0],
            sent: [0, 0],
        });
        self.links.len() - 1
    }

    /// Sends `msg` from `from` on `link`; `false` where the send fails at
    /// once (the rank then knows the link failed).
    pub(super) fn send(&mut self, from: usize, link: usize, msg: Msg) -> bool {
        let end = usize::from(self.links[link].ends[0] == from);
        let peer = self.links[link].ends[end];
        if self.links[link].failed {
            let knows = self.ranks[from].failed.contains_key(&peer)
                || self.ranks[from].next_failed.contains_key(&peer);
            let finds_out = self.rng.below(256) < self.plan.send_fails as usize;
            return !(knows || finds_out);
        }
        self.messages += 1;
        let l = &mut self.links[link];
        l.sent[end] += 1;
        if l.sent[end] == self.link_bound + 1 {
            self.violations.push(Violation::Unbounded {
                from,
                to: peer,
                bound: self.link_bound,
            });
        }
        let (extra, until) = self.slow[from * self.n + peer];
        let extra = if self.now < until { extra } else { 0 };
        let at = self.links[link].last_at[end].max(self.now + self.delay() + extra);
        let l = &mut self.links[link];
        l.last_at[end] = at;
        l.queues[end].push_back((at, msg));
        self.in_flight += 1;
        if self.in_flight == self.flight_bound + 1 {
            self.violations.push(Violation::Flooded {
                bound: self.flight_bound,
            });
        }
        self.schedule(at, Ev::Deliver { link, end });
        true
    }

    /// The link fails. Of what was on its way each way, what arrives is
    /// a prefix; each live end notices a while after the last of it.
    pub(super) fn fail_link(&mut self, link: usize) {
        if self.links[link].failed {
            return;
        }
        self.links[link].failed = true;
        for end in 0..2 {
            let (r, inc) = (self.links[link].ends[end], self.links[link].incs[end]);
            let len = self.links[link].queues[end].len();
            let keep = match self.is(r, inc) {
                true => self.rng.below(len + 1),
                false => 0,
            };
            self.in_flight -= len - keep;
            let queue = &mut self.links[link].queues[end];
            queue.truncate(keep);
            let after = queue.back().map_or(self.now, |m| m.0).max(self.now);
            if self.is(r, inc) {
                let (lo, hi) = self.plan.notice;
                let at = after + lo + self.rng.below((hi - lo + 1) as usize) as u64;
                self.schedule(at, Ev::Notice { link, end });
            }
        }
    }

    /// `by` closes `link`: what it sent arrives, then the close (saying
    /// the peer was removed, or not); nothing more is read at `by`.
    pub(super) fn close(&mut self, by: usize, link: usize, removed: bool) {
        if self.links[link].failed {
            return;
        }
        let end = usize::from(self.links[link].ends[0] == by);
        let l = &mut self.links[link];
        l.failed = true;
        let dropped = l.queues[1 - end].len();
        l.queues[1 - end].clear();
        self.in_flight -= dropped;
        let at = self.links[link].last_at[end].max(self.now + self.delay());
        let l = &mut self.links[link];
        l.last_at[end] = at;
        l.queues[end].push_back((at, Msg::Close { removed }));
        self.in_flight += 1;
        self.schedule(at, Ev::Deliver { link, end });
    }

    /// `rank` closes every link it has (its process ends or gives up).
    pub(super) fn close_all(&mut self, rank: usize) {
        let r = &mut self.ranks[rank];
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
        let Some((_, msg)) = self.links[link].queues[end].pop_front() else {
            return;
        };
        self.in_flight -= 1;
        let (r, inc) = (self.links[link].ends[end], self.links[link].incs[end]);
        if !self.is(r, inc) {
            return;
        }
        let peer = self.links[link].ends[1 - end];
        if let Msg::Close { removed } = msg {
            self.note(|| format!("rank {r} <- {peer}: close (removed: {removed})"));
            self.lose(r, peer, link, removed);
            return;
        }
        let rank = &mut self.ranks[r];
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
        let rank = &mut self.ranks[r];
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
