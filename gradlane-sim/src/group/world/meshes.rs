//! The meshes of new views, formed with the core's `MeshForming`.

use super::*;

impl World<'_, Grouping<'_>> {
    /// `r` begins forming the mesh of `decision`'s view with the core's
    /// [`MeshForming`]: it dials the lower members it says, takes the
    /// higher members' hellos as it judges them, and waits up to the
    /// bound.
    pub(super) fn form(&mut self, r: usize, decision: ViewDecision, joiners: Option<Vec<usize>>) {
        let digest = view_digest(decision.epoch, &decision.members);
        let inc = self.m.ranks[r].inc;
        let place = decision
            .members
            .iter()
            .position(|&m| m == r)
            .expect("a view formed by one of its members");
        let mark = MeshMark {
            epoch: decision.epoch,
            digest: Some(digest),
        };
        let mut mesh = MeshForming::new(place, decision.members.len(), mark, Dials::EachAlone);
        let mut dials = Vec::new();
        while let Some(q) = mesh.poll_dial() {
            dials.push(decision.members[q]);
        }
        let rank = &mut self.m.ranks[r];
        rank.next_links.clear();
        rank.next_pending.clear();
        rank.next_failed.clear();
        rank.stage = Stage::Form {
            decision,
            digest,
            joiners,
            mesh,
        };
        for to in dials {
            let at = self.now + self.delay();
            self.schedule(
                at,
                Ev::Dial {
                    from: r,
                    inc,
                    to,
                    digest,
                },
            );
        }
        let wait = self.m.setup.form_wait;
        self.schedule(
            self.now + wait,
            Ev::FormDeadline {
                rank: r,
                inc,
                digest,
            },
        );
    }

    /// Whether `r` forms the mesh of the view with `digest`.
    pub(super) fn forming(&self, r: usize, digest: u64) -> bool {
        matches!(&self.m.ranks[r].stage, Stage::Form { digest: d, .. } if *d == digest)
    }

    /// A dial from `from` (a higher member) reaches `to`: a blocked path,
    /// or a rank not forming a mesh yet, is tried again while `from`
    /// forms (the shell's dial retries within its wait); else `to`'s
    /// machine judges `from`'s hello. Taken, the pair is linked; another
    /// view's, the connection is dropped and `from` goes without it;
    /// refused (the same epoch with other members), `to` stops as the
    /// shell's does.
    pub(super) fn dialed(&mut self, from: usize, inc: u64, to: usize, digest: u64) {
        if !self.is(from, inc) || !self.forming(from, digest) || !self.m.ranks[to].alive {
            return;
        }
        let to_forms = matches!(self.m.ranks[to].stage, Stage::Form { .. });
        if self.m.blocked[from * self.m.n + to] || !to_forms {
            let at = self.now + 2 * self.plan.max_delay + 10;
            self.schedule(
                at,
                Ev::Dial {
                    from,
                    inc,
                    to,
                    digest,
                },
            );
            return;
        }
        let Stage::Form {
            decision: theirs, ..
        } = &self.m.ranks[from].stage
        else {
            return;
        };
        let hello = MeshHello {
            view: Some(digest),
            rank: theirs.members.iter().position(|&m| m == from).unwrap_or(0),
            world: theirs.members.len(),
            listen: None,
            epoch: theirs.epoch,
        };
        let to_place = theirs.members.iter().position(|&m| m == to).unwrap_or(0);
        let Stage::Form { mesh, .. } = &mut self.m.ranks[to].stage else {
            return;
        };
        let verdict = mesh.hello(&hello);
        let linked = verdict == HelloVerdict::Take;
        if let Stage::Form { mesh, .. } = &mut self.m.ranks[from].stage {
            // A failed dial leaves that member out of a new view's mesh.
            let _ = mesh.dialed(to_place, linked);
        }
        match verdict {
            HelloVerdict::Take => {
                let l = self.new_link(from, to);
                self.m.ranks[from].next_links.insert(to, l);
                self.m.ranks[to].next_links.insert(from, l);
                self.note(|| format!("ranks {from} and {to} link up"));
                self.poke(to);
            }
            HelloVerdict::OtherView => {
                self.note(|| format!("rank {to} drops {from}'s hello for another view"));
            }
            HelloVerdict::Refuse(why) => {
                self.note(|| format!("rank {to} refuses {from}'s hello: {why}"));
                self.m.counts.refused_hellos += 1;
                let poke = self.form_failed(to, why.to_string());
                self.act_on(to, poke);
            }
        }
        let at = self.now + self.delay();
        self.schedule(at, Ev::Check { rank: from, inc });
    }

    /// `r`'s mesh cannot form (a hello it refused): a member's keeper
    /// hears it stopped; a rank being admitted fails, and may start
    /// again.
    pub(super) fn form_failed(&mut self, r: usize, why: String) -> Poke {
        let Stage::Form { joiners, .. } =
            std::mem::replace(&mut self.m.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        match joiners {
            None => Poke::Hand(Event::Stopped(why)),
            Some(_) => {
                self.m.counts.failed_admissions += 1;
                self.fail_admission(r);
                Poke::Wait
            }
        }
    }

    /// `r` stops forming: its old links close (saying removed to the ranks
    /// the view leaves out), the new mesh is its links, and its keeper
    /// hears which members did not link up (a rank admitted fails where
    /// any did not).
    pub(super) fn finish_form(&mut self, r: usize) -> Poke {
        let Stage::Form {
            decision,
            joiners,
            mesh,
            ..
        } = std::mem::replace(&mut self.m.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        let rank = &mut self.m.ranks[r];
        let old = std::mem::take(&mut rank.links);
        rank.links = std::mem::take(&mut rank.next_links);
        rank.pending = std::mem::take(&mut rank.next_pending);
        rank.failed = std::mem::take(&mut rank.next_failed);
        let unlinked = mesh.missing();
        for (peer, l) in old {
            let removed = !decision.members.contains(&peer);
            self.close(r, l, removed);
        }
        self.note(|| format!("rank {r} formed {decision:?}, unlinked places {unlinked:?}"));
        let install = Install {
            rank: r,
            epoch: decision.epoch,
            members: decision.members.clone(),
        };
        if unlinked.is_empty() {
            self.m.counts.views += 1;
            self.m.installs.push(install);
        } else {
            self.m.partial.push(install);
        }
        match joiners {
            None => Poke::Hand(Event::MeshFormed { unlinked }),
            Some(joiners) if unlinked.is_empty() => {
                self.m.counts.joined += 1;
                let keeper = self.keeper(ViewKeeper::admitted(r, self.m.n, &decision, joiners));
                self.m.ranks[r].keeper = Some(keeper);
                self.next_call(r);
                Poke::Poll
            }
            Some(_) => {
                // Its mesh is not whole: it fails, and may start again.
                self.note(|| format!("rank {r} failed to link up with its new view"));
                self.m.counts.failed_admissions += 1;
                self.fail_admission(r);
                Poke::Wait
            }
        }
    }

    /// A rank being admitted whose mesh did not form: it fails, closes
    /// what it linked, and may start again.
    pub(super) fn fail_admission(&mut self, r: usize) {
        self.m.ranks[r].stage = Stage::Failed;
        self.close_all(r);
        if self.m.ranks[r].restarts < MAX_RESTARTS {
            let after = 20 + self.rng.below(self.m.setup.join_wait as usize) as u64;
            self.schedule(self.now + after, Ev::Restart(r));
        }
    }
}
