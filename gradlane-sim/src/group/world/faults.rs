//! The plan's faults as they come (kills, freezes, cuts, partitions, slow
//! links) and the processes that start again and ask to rejoin.

use super::*;

impl World<'_, Grouping<'_>> {
    pub(super) fn fault(&mut self, i: usize) {
        let plan = self.plan;
        let fault = &plan.faults[i].1;
        self.note(|| format!("fault: {fault:?}"));
        match fault {
            Fault::Kill {
                rank,
                restart_after,
            } => {
                let k = *rank;
                if !self.m.ranks[k].alive {
                    return;
                }
                self.m.counts.killed += 1;
                let r = &mut self.m.ranks[k];
                let inc = r.inc;
                for l in 0..self.m.links.len() {
                    let link = &self.m.links[l];
                    if link
                        .ends
                        .iter()
                        .zip(link.incs)
                        .any(|(&e, i)| e == k && i == inc)
                    {
                        self.fail_link(l);
                    }
                }
                let r = &mut self.m.ranks[k];
                r.alive = false;
                r.frozen_until = 0;
                r.stage = Stage::Dead;
                if let Some(after) = restart_after {
                    self.schedule(self.now + after, Ev::Restart(k));
                }
            }
            Fault::Cut(a, b) => self.cut(*a, *b),
            Fault::Partition { sides, until } => {
                for a in 0..self.m.n {
                    for b in 0..self.m.n {
                        if sides[a] != sides[b] {
                            self.m.blocked[a * self.m.n + b] = true;
                            if a < b {
                                self.cut(a, b);
                            }
                        }
                    }
                }
                self.schedule(*until, Ev::Heal(i));
            }
            Fault::Freeze { rank, until } => {
                let r = &mut self.m.ranks[*rank];
                if r.alive {
                    r.frozen_until = r.frozen_until.max(*until);
                }
            }
            Fault::Slow { a, b, extra, until } => {
                self.m.slow[a * self.m.n + b] = (*extra, *until);
                self.m.slow[b * self.m.n + a] = (*extra, *until);
            }
        }
    }

    /// Every live link between `a` and `b` fails.
    pub(super) fn cut(&mut self, a: usize, b: usize) {
        for l in 0..self.m.links.len() {
            let ends = self.m.links[l].ends;
            if ends == [a, b] || ends == [b, a] {
                self.fail_link(l);
            }
        }
    }

    /// A fresh process of rank `r` starts, and asks to rejoin.
    pub(super) fn restart(&mut self, r: usize) {
        let rank = &mut self.m.ranks[r];
        if rank.alive && !matches!(rank.stage, Stage::Failed) {
            return;
        }
        if rank.restarts >= MAX_RESTARTS {
            return;
        }
        rank.restarts += 1;
        rank.inc += 1;
        rank.alive = true;
        rank.frozen_until = 0;
        rank.keeper = None;
        rank.links.clear();
        rank.pending.clear();
        rank.failed.clear();
        rank.next_links.clear();
        rank.next_pending.clear();
        rank.next_failed.clear();
        rank.held = None;
        rank.waiting.clear();
        rank.removed = false;
        rank.stage = Stage::Joining { attempt: 0 };
        self.m.counts.restarts += 1;
        self.note(|| format!("rank {r} restarts, to rejoin"));
        self.ask(r);
    }

    /// A restarted rank asks a contact (any other rank, as it cannot
    /// know who is alive) to admit it, or gives up after enough tries.
    pub(super) fn ask(&mut self, r: usize) {
        let Stage::Joining { attempt } = self.m.ranks[r].stage else {
            return;
        };
        if attempt >= MAX_ATTEMPTS {
            self.note(|| format!("rank {r} gives up rejoining"));
            self.m.counts.gave_up += 1;
            self.m.ranks[r].stage = Stage::GaveUp;
            return;
        }
        let attempt = attempt + 1;
        self.m.ranks[r].stage = Stage::Joining { attempt };
        let contact = (r + 1 + self.rng.below(self.m.n - 1)) % self.m.n;
        let inc = self.m.ranks[r].inc;
        self.note(|| format!("rank {r} asks rank {contact} to admit it (try {attempt})"));
        let at = self.now + self.delay();
        self.schedule(
            at,
            Ev::Post {
                to: contact,
                inc: u64::MAX,
                post: Post::Join { from: r, inc },
            },
        );
        let wait = self.m.setup.join_wait;
        self.schedule(
            self.now + wait,
            Ev::JoinTimeout {
                rank: r,
                inc,
                attempt,
            },
        );
    }

    /// Something sent outside the mesh reaches `to` (if its path is open
    /// and its process is the one meant).
    pub(super) fn posted(&mut self, to: usize, inc: u64, post: Post) {
        if !self.m.ranks[to].alive || (inc != u64::MAX && self.m.ranks[to].inc != inc) {
            return;
        }
        match post {
            Post::Join {
                from,
                inc: from_inc,
            } => {
                if self.m.blocked[from * self.m.n + to] || !self.is(from, from_inc) {
                    return;
                }
                let rank = &self.m.ranks[to];
                let member = matches!(
                    rank.stage,
                    Stage::Idle
                        | Stage::Exchange { .. }
                        | Stage::Done { .. }
                        | Stage::Agree { .. }
                        | Stage::Form { joiners: None, .. }
                );
                let Some(keeper) = rank
                    .keeper
                    .as_ref()
                    .filter(|k| member && k.removed().is_none())
                else {
                    return;
                };
                let request = JoinRequest {
                    rank: from,
                    world: self.m.n,
                    listen: address(from, from_inc),
                    member_of: None,
                };
                match admission::screen(&request, keeper.members(), self.m.n) {
                    Ok(()) => {
                        self.note(|| format!("rank {to} keeps rank {from} waiting to rejoin"));
                        let waiting = &mut self.m.ranks[to].waiting;
                        waiting.retain(|w| w.0 != from);
                        waiting.push((from, request.listen));
                    }
                    Err(why) => {
                        self.note(|| format!("rank {to} refuses rank {from}: {why}"));
                        let at = self.now + self.delay();
                        self.schedule(
                            at,
                            Ev::Post {
                                to: from,
                                inc: from_inc,
                                post: Post::Refused,
                            },
                        );
                    }
                }
            }
            Post::Refused => {
                if let Stage::Joining { attempt } = self.m.ranks[to].stage {
                    // Ask again a while later: the members may not have
                    // lost it yet.
                    let wait = 4 * self.plan.max_delay + 60;
                    let inc = self.m.ranks[to].inc;
                    self.schedule(
                        self.now + wait,
                        Ev::JoinTimeout {
                            rank: to,
                            inc,
                            attempt,
                        },
                    );
                }
            }
            Post::Admission { decision, joiners } => {
                if matches!(self.m.ranks[to].stage, Stage::Joining { .. }) {
                    self.note(|| format!("rank {to} is admitted to {decision:?}"));
                    self.form(to, decision, Some(joiners));
                    self.poke(to);
                }
            }
        }
    }
}
