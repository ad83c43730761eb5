//! What each event does to a group's ranks.

use super::*;

impl World<'_, Grouping<'_>> {
    pub(super) fn take(&mut self, ev: Ev) {
        match ev {
            Ev::Begin(r) => {
                if self.is(r, 0) && matches!(self.m.ranks[r].stage, Stage::Idle) {
                    self.note(|| format!("rank {r} begins its program"));
                    self.next_call(r);
                    self.step(r, None);
                }
            }
            Ev::Next { rank, inc } => {
                if self.is(rank, inc) && matches!(self.m.ranks[rank].stage, Stage::Idle) {
                    self.next_call(rank);
                    self.step(rank, None);
                }
            }
            Ev::Deliver { link, end } => self.deliver(link, end),
            Ev::Notice { link, end } => {
                let (r, inc) = (self.m.links[link].ends[end], self.m.links[link].incs[end]);
                if self.is(r, inc) {
                    let peer = self.m.links[link].ends[1 - end];
                    self.note(|| format!("rank {r} notices its link to {peer} failed"));
                    self.lose(r, peer, link, false);
                }
            }
            Ev::Dial {
                from,
                inc,
                to,
                digest,
            } => self.dialed(from, inc, to, digest),
            Ev::Check { rank, inc } => {
                if self.is(rank, inc) {
                    self.poke(rank);
                }
            }
            Ev::FormDeadline { rank, inc, digest } => {
                if !self.is(rank, inc) {
                    return;
                }
                if matches!(&self.m.ranks[rank].stage, Stage::Form { digest: d, .. } if *d == digest)
                {
                    let poke = self.finish_form(rank);
                    self.act_on(rank, poke);
                }
            }
            Ev::Post { to, inc, post } => self.posted(to, inc, post),
            Ev::JoinTimeout { rank, inc, attempt } => {
                if self.is(rank, inc)
                    && matches!(self.m.ranks[rank].stage, Stage::Joining { attempt: a } if a == attempt)
                {
                    self.ask(rank);
                }
            }
            Ev::Fault(i) => self.fault(i),
            Ev::Heal(i) => {
                if let Fault::Partition { sides, .. } = &self.plan.faults[i].1 {
                    self.note(|| format!("partition {sides:?} heals"));
                    for a in 0..self.m.n {
                        for b in 0..self.m.n {
                            if sides[a] != sides[b] {
                                self.m.blocked[a * self.m.n + b] = false;
                            }
                        }
                    }
                }
            }
            Ev::Quiet => {
                self.note(|| "the network goes quiet".into());
                self.m.blocked.iter_mut().for_each(|b| *b = false);
                self.m.slow.iter_mut().for_each(|s| *s = (0, 0));
            }
            Ev::Restart(r) => self.restart(r),
            Ev::Linger { rank, inc } => {
                if self.is(rank, inc) && matches!(self.m.ranks[rank].stage, Stage::Finished) {
                    self.note(|| format!("rank {rank} closes its links"));
                    self.close_all(rank);
                }
            }
        }
    }
}
