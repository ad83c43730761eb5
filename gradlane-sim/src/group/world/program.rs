//! Each rank's program of collectives and its keeper, driven as the shell
//! drives it: the actions carried out, the exchange and its `Done` read
//! from the links, the agreement fed.

use super::*;

impl World<'_, Grouping<'_>> {
    /// The next call of `r`'s program, or its end.
    pub(super) fn next_call(&mut self, r: usize) {
        let calls = self.m.setup.calls;
        let rank = &mut self.m.ranks[r];
        let Some(keeper) = rank.keeper.as_mut() else {
            return;
        };
        if keeper.calls() >= calls {
            rank.stage = Stage::Finished;
            let inc = rank.inc;
            self.note(|| format!("rank {r} finished its program"));
            let linger = self.m.setup.linger;
            self.schedule(self.now + linger, Ev::Linger { rank: r, inc });
            return;
        }
        if let Err(e) = keeper.begin_call() {
            self.failed(r, e);
        }
    }

    /// `r` computes its next step (the time between two collectives),
    /// then begins its next call.
    pub(super) fn compute(&mut self, r: usize) {
        let rank = &mut self.m.ranks[r];
        rank.stage = Stage::Idle;
        let inc = rank.inc;
        let at = self.now + self.rng.below(self.m.setup.compute as usize + 1) as u64;
        self.schedule(at, Ev::Next { rank: r, inc });
    }

    /// `r`'s program stopped with `error`.
    pub(super) fn failed(&mut self, r: usize, error: KeeperError) {
        self.note(|| format!("rank {r} fails: {error}"));
        match &error {
            KeeperError::Removed { .. } | KeeperError::NoQuorum { .. } => {
                self.m.counts.removed += 1;
                self.m.ranks[r].removed = true;
            }
            KeeperError::OutOfStep { .. } => self.m.counts.out_of_step += 1,
            KeeperError::Fatal => self.m.counts.fatal += 1,
        }
        self.m.ranks[r].stage = Stage::Failed;
        self.close_all(r);
        let removed = matches!(
            error,
            KeeperError::Removed { .. } | KeeperError::NoQuorum { .. }
        );
        if removed && self.m.setup.restart_removed && self.m.ranks[r].restarts < MAX_RESTARTS {
            let after = 20 + self.rng.below(4 * self.m.setup.join_wait as usize) as u64;
            self.schedule(self.now + after, Ev::Restart(r));
        }
    }

    /// Looks at what `r` waits for again, and acts on it.
    pub(super) fn poke(&mut self, r: usize) {
        let poke = self.settle(r);
        self.act_on(r, poke);
    }

    pub(super) fn act_on(&mut self, r: usize, poke: Poke) {
        match poke {
            Poke::Wait => {}
            Poke::Hand(e) => self.step(r, Some(e)),
            Poke::Poll => self.step(r, None),
        }
    }

    /// Hands `event` to `r`'s keeper, then carries out every action it
    /// polls until it waits for something.
    pub(super) fn step(&mut self, r: usize, mut event: Option<Event>) {
        loop {
            let Some(keeper) = self.m.ranks[r].keeper.as_mut() else {
                return;
            };
            if let Some(e) = event.take() {
                keeper.handle(e);
            }
            let Some(action) = keeper.poll() else {
                return;
            };
            match self.act(r, action) {
                Poke::Wait => return,
                Poke::Hand(e) => event = Some(e),
                Poke::Poll => {}
            }
        }
    }

    /// Carries out `action` of `r`'s keeper (as the shell does).
    pub(super) fn act(&mut self, r: usize, action: Action) -> Poke {
        self.note(|| format!("rank {r} acts: {}", describe(&action)));
        let keeper = self.m.ranks[r].keeper.as_ref().expect("a keeper acts");
        let (epoch, members) = (keeper.epoch(), keeper.members().to_vec());
        match action {
            Action::Exchange { rerun } => {
                if rerun {
                    self.m.counts.reruns += 1;
                }
                let call = keeper.calls();
                let value = self.m.setup.value(r, call);
                let rank = &mut self.m.ranks[r];
                rank.held = None;
                rank.stage = Stage::Exchange {
                    call,
                    got: BTreeMap::new(),
                };
                self.send_all(r, &members, |_| Msg::Exch { epoch, call, value });
                self.settle(r)
            }
            Action::Done => {
                let call = keeper.calls();
                let world = self.m.n;
                // As the shell's announcement: refuse those that cannot
                // rejoin, name the rest.
                let mut refused = Vec::new();
                let rank = &mut self.m.ranks[r];
                rank.waiting.retain(|&(j, addr)| {
                    let request = JoinRequest {
                        rank: j,
                        world,
                        listen: addr,
                        member_of: None,
                    };
                    let ok = admission::screen(&request, &members, world).is_ok();
                    if !ok {
                        refused.push((j, process_of(&addr)));
                    }
                    ok
                });
                let mut joiners = rank.waiting.clone();
                joiners.sort_unstable_by_key(|j| j.0);
                rank.stage = Stage::Done {
                    call,
                    got: BTreeMap::new(),
                };
                for (j, inc) in refused {
                    let at = self.now + self.delay();
                    self.schedule(
                        at,
                        Ev::Post {
                            to: j,
                            inc,
                            post: Post::Refused,
                        },
                    );
                }
                let mine = joiners.clone();
                self.send_all(r, &members, |_| Msg::Done {
                    epoch,
                    call,
                    joiners: mine.clone(),
                });
                if let Stage::Done { got, .. } = &mut self.m.ranks[r].stage {
                    got.insert(r, joiners);
                }
                self.settle(r)
            }
            Action::Agree(machine) => {
                self.m.counts.agreements += 1;
                self.m.ranks[r].stage = Stage::Agree {
                    machine,
                    told: BTreeSet::new(),
                };
                self.settle(r)
            }
            Action::Admit { decision, joiners } => {
                for (j, addr) in joiners.iter().copied() {
                    let rank = &mut self.m.ranks[r];
                    if let Some(i) = rank.waiting.iter().position(|w| *w == (j, addr)) {
                        rank.waiting.remove(i);
                        let joiners = joiners.iter().map(|j| j.0).collect();
                        let at = self.now + self.delay();
                        self.schedule(
                            at,
                            Ev::Post {
                                to: j,
                                inc: process_of(&addr),
                                post: Post::Admission {
                                    decision: decision.clone(),
                                    joiners,
                                },
                            },
                        );
                    }
                }
                Poke::Poll
            }
            Action::FormMesh(decision) => {
                self.form(r, decision, None);
                self.settle(r)
            }
            Action::Return => {
                self.m.counts.returned += 1;
                let rank = &self.m.ranks[r];
                let keeper = rank.keeper.as_ref().expect("a keeper returns");
                let call = keeper.calls();
                match rank.held.clone() {
                    Some(held) if held.call == call => {
                        self.m.returns.push(Returned {
                            rank: r,
                            inc: rank.inc,
                            call,
                            bits: held.bits,
                            epoch: held.epoch,
                            members: held.members,
                            members_now: keeper.members().to_vec(),
                            after_removal: rank.removed,
                        });
                    }
                    _ => self
                        .m
                        .violations
                        .push(Violation::NoResult { rank: r, call }),
                }
                let keeper = self.m.ranks[r].keeper.as_mut().expect("a keeper");
                match keeper.admit(OnRankFailure::Continue) {
                    Ok(true) => {
                        self.m.counts.admissions += 1;
                        Poke::Poll
                    }
                    Ok(false) => {
                        self.compute(r);
                        Poke::Wait
                    }
                    Err(e) => {
                        self.failed(r, e);
                        Poke::Wait
                    }
                }
            }
            Action::Admitted(joined) => {
                self.note(|| format!("rank {r}: the admission took in {joined:?}"));
                self.compute(r);
                Poke::Wait
            }
            Action::Fail(e) => {
                self.failed(r, e);
                Poke::Wait
            }
        }
    }

    /// Sends `msg(peer)` to every other member of `members` on `r`'s
    /// current links; a send that fails at once counts as the link's
    /// failure, known.
    pub(super) fn send_all(&mut self, r: usize, members: &[usize], msg: impl Fn(usize) -> Msg) {
        for &m in members.iter().filter(|&&m| m != r) {
            match self.m.ranks[r].links.get(&m).copied() {
                Some(l) => {
                    if !self.send(r, l, msg(m)) {
                        self.m.ranks[r].failed.entry(m).or_insert(false);
                    }
                }
                None => {
                    self.m.ranks[r].failed.entry(m).or_insert(false);
                }
            }
        }
    }

    /// What `r` does with what came, for the stage it is in.
    pub(super) fn settle(&mut self, r: usize) -> Poke {
        match self.m.ranks[r].stage {
            Stage::Exchange { .. } | Stage::Done { .. } => self.settle_call(r),
            Stage::Agree { .. } => self.settle_agreement(r),
            Stage::Form { ref mesh, .. } => match mesh.is_settled() {
                true => self.finish_form(r),
                false => Poke::Wait,
            },
            _ => Poke::Wait,
        }
    }

    /// In an exchange or its `Done`: reads each member it still waits for,
    /// in order, as the shell's collective does (a proposal where a
    /// message was due is an alarm; another message is out of step).
    pub(super) fn settle_call(&mut self, r: usize) -> Poke {
        let rank = &mut self.m.ranks[r];
        let keeper = rank.keeper.as_ref().expect("a member has a keeper");
        let members = keeper.members().to_vec();
        let epoch = keeper.epoch();
        let (done, call) = match &rank.stage {
            Stage::Exchange { call, .. } => (false, *call),
            Stage::Done { call, .. } => (true, *call),
            _ => return Poke::Wait,
        };
        let mut terminal: Option<Failure> = None;
        let mut lost = Vec::new();
        let mut alarms = Vec::new();
        for (place, &peer) in members.iter().enumerate() {
            if peer == r {
                continue;
            }
            let have = match &rank.stage {
                Stage::Exchange { got, .. } => got.contains_key(&peer),
                Stage::Done { got, .. } => got.contains_key(&peer),
                _ => true,
            };
            if have {
                continue;
            }
            let queue = rank.pending.entry(peer).or_default();
            match queue.pop_front() {
                Some(Msg::Exch {
                    epoch: e,
                    call: c,
                    value,
                }) if !done && e == epoch && c == call => {
                    if let Stage::Exchange { got, .. } = &mut rank.stage {
                        got.insert(peer, value);
                    }
                }
                Some(Msg::Done {
                    epoch: e,
                    call: c,
                    joiners,
                }) if done && e == epoch && c == call => {
                    if let Stage::Done { got, .. } = &mut rank.stage {
                        got.insert(peer, joiners);
                    }
                }
                Some(Msg::View {
                    kind: MessageKind::Proposal,
                    body,
                    ..
                }) => alarms.push((place, body.to_vec())),
                Some(other) => {
                    // Not what was due: the shell's reader fails the call
                    // (out of step), which is not about membership.
                    if let Some(trace) = &mut self.trace {
                        let line = format!("rank {r} reads {other:?} from {peer}: out of step");
                        trace.push(line);
                    }
                    terminal.get_or_insert(Failure::Fatal);
                }
                None => match rank.failed.get(&peer) {
                    Some(true) => {
                        terminal.get_or_insert(Failure::Removed(format!(
                            "rank {peer} closed its link: removed"
                        )));
                    }
                    Some(false) => lost.push(place),
                    None => {}
                },
            }
        }
        let whole = match &rank.stage {
            Stage::Exchange { got, .. } => got.len() + 1 == members.len(),
            Stage::Done { got, .. } => got.len() == members.len(),
            _ => false,
        };
        if terminal.is_none() && alarms.is_empty() && lost.is_empty() {
            if !whole {
                // At most one message is due from each member: nothing
                // more to read until another comes.
                return Poke::Wait;
            }
            let stage = std::mem::replace(&mut rank.stage, Stage::Idle);
            return match stage {
                Stage::Exchange { call, mut got } => {
                    got.insert(r, self.m.setup.value(r, call));
                    let bits = fold_values(call, members.iter().map(|m| (*m, got[m])));
                    rank.held = Some(Held {
                        call,
                        bits,
                        epoch,
                        members,
                    });
                    Poke::Hand(Event::Exchanged)
                }
                Stage::Done { got, .. } => {
                    // In place order, as the shell builds it.
                    let announced = members
                        .iter()
                        .flat_map(|m| got[m].iter().copied())
                        .collect();
                    Poke::Hand(Event::DoneExchanged(announced))
                }
                _ => unreachable!("the stage was a collective's"),
            };
        }
        // The exchange failed: the first failure ends it, the others are
        // noted for the agreement, as the shell notes them.
        let terminal = match terminal {
            Some(t) => {
                for &p in &lost {
                    keeper_of(rank).note_lost(p);
                }
                for (p, body) in alarms {
                    keeper_of(rank).note_alarm(p, body);
                }
                t
            }
            None if !alarms.is_empty() => {
                let (p, body) = alarms.remove(0);
                for &l in &lost {
                    keeper_of(rank).note_lost(l);
                }
                for (q, b) in alarms {
                    keeper_of(rank).note_alarm(q, b);
                }
                Failure::Alarm(p, body)
            }
            None => {
                for &l in &lost[1..] {
                    keeper_of(rank).note_lost(l);
                }
                Failure::Lost(lost[0])
            }
        };
        rank.stage = Stage::Idle;
        Poke::Hand(Event::ExchangeFailed(terminal))
    }

    /// In an agreement: feeds it what came on the view's links and the
    /// links lost (as the shell's reader does), sends what it has, and
    /// hands in its outcome once there is one.
    pub(super) fn settle_agreement(&mut self, r: usize) -> Poke {
        let Stage::Agree {
            mut machine,
            mut told,
        } = std::mem::replace(&mut self.m.ranks[r].stage, Stage::Idle)
        else {
            return Poke::Wait;
        };
        let x = machine.seat().epoch();
        let me = machine.seat().place();
        let members = machine.seat().members().to_vec();
        let rank = &mut self.m.ranks[r];
        for (p, &peer) in members.iter().enumerate() {
            if p == me {
                continue;
            }
            if let Some(queue) = rank.pending.get_mut(&peer) {
                while let Some(msg) = queue.pop_front() {
                    // Everything but this view's proposals and decisions
                    // is dropped, as the shell's reader drops it.
                    if let Msg::View { epoch, kind, body } = msg {
                        if epoch == x {
                            let event = match kind {
                                MessageKind::Proposal => Heard::Proposal {
                                    from: p,
                                    body: &body,
                                },
                                MessageKind::Decision => Heard::Decision {
                                    from: p,
                                    body: &body,
                                },
                            };
                            machine.handle(event);
                        }
                    }
                }
            }
            let unlinked = !rank.links.contains_key(&peer);
            if (rank.failed.contains_key(&peer) || unlinked) && told.insert(p) {
                machine.handle(Heard::Lost { from: p });
            }
        }
        while let Some(t) = machine.poll_transmit() {
            let mut failed = Vec::new();
            for &p in &t.to {
                let peer = members[p];
                let link = self.m.ranks[r].links.get(&peer).copied();
                let ok = match link {
                    Some(l) if !self.m.ranks[r].failed.contains_key(&peer) => self.send(
                        r,
                        l,
                        Msg::View {
                            epoch: x,
                            kind: t.kind,
                            body: t.body.clone(),
                        },
                    ),
                    _ => false,
                };
                // The decision for the ranks left out: its failures are
                // not told.
                if !ok && !t.left_out {
                    failed.push(p);
                }
            }
            if self.trace.is_some() {
                let text = String::from_utf8_lossy(&t.body).to_string();
                self.note(|| format!("rank {r} -> places {:?}: {text}; failed {failed:?}", t.to));
            }
            for p in failed {
                self.m.ranks[r].failed.entry(members[p]).or_insert(false);
                told.insert(p);
                machine.send_failed(p);
            }
        }
        if let Some(outcome) = machine.outcome() {
            let outcome = outcome.clone();
            self.note(|| format!("rank {r} agrees: {outcome:?}"));
            return Poke::Hand(Event::Agreed(outcome));
        }
        if (0..members.len()).all(|p| p == me || machine.suspects().contains(&p)) {
            return Poke::Hand(Event::Stopped(format!(
                "no link left to hear view {x} from"
            )));
        }
        self.m.ranks[r].stage = Stage::Agree { machine, told };
        Poke::Wait
    }
}
