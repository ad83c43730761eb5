//! The failure policy: what a group does when a rank dies or stays silent,
//! decided here and only here. The shell asks these questions at each
//! point where a failure changes what it does; it never matches on the
//! policy itself.

use std::time::Duration;

/// What a group does when one of its ranks dies (its connections close,
/// or are silent past the failure timeout) or stays away from a
/// collective past the collective timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRankFailure {
    /// Every collective fails from then on with an error naming the rank
    /// (as gloo and NCCL do): restart the job from a checkpoint.
    #[default]
    Fail,
    /// The survivors agree on who is left and go on: the collective in
    /// flight either counts (every survivor already holds its result) or
    /// runs again among them, its mean divided by the ranks that took
    /// part. Replicas stay bit-identical. Costs one small message per
    /// collective (no rank returns before every rank holds the result) and
    /// a copy of each buffer while its collective runs.
    Continue,
}

/// What a collective that ran past its timeout does to the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Close every link with the timeout as the reason: every rank's next
    /// call fails with it, as after any failure under [`OnRankFailure::Fail`].
    CloseEveryLink,
    /// Close the links to the ranks not heard from and count them lost:
    /// the view agreement then removes them, as dead ones.
    RemoveTheSilent,
}

impl OnRankFailure {
    /// Whether a collective that failed goes to the view agreement (and
    /// counts, or runs again among the survivors) rather than returning
    /// its error. With it, every collective ends in an exchange that says
    /// every member holds the result, and keeps a copy of its input.
    pub fn recovers(self) -> bool {
        self == Self::Continue
    }

    /// Whether an exchange with several peers waits for every one of them
    /// after one failed, rather than ending at the first failure. Going
    /// on, no message may be left half written on a link the survivors
    /// keep for their agreement, and every peer's failure is noted for it.
    pub fn exchange_waits_for_every_peer(self) -> bool {
        self.recovers()
    }

    /// Whether a collective may run as a pipeline, many messages a link
    /// that wait on each other: only where the first failure ends it.
    /// Going on, the survivors' pipelines would wait for the parts of the
    /// rank that died, and cutting them could leave a message half read on
    /// a link they keep for their agreement.
    pub fn pipelines_collectives(self) -> bool {
        !self.exchange_waits_for_every_peer()
    }

    /// What a collective's timeout does.
    pub fn on_timeout(self) -> OnTimeout {
        match self {
            Self::Fail => OnTimeout::CloseEveryLink,
            Self::Continue => OnTimeout::RemoveTheSilent,
        }
    }

    /// The place that stands in for a broadcast's root: its own where it
    /// is a member (`root`), else, going on, the lowest member (every
    /// survivor holds the same replicas, and DDP broadcasts its buffers
    /// from rank 0 every step); else none, an error.
    pub fn broadcast_root(self, root: Option<usize>) -> Option<usize> {
        match root {
            Some(place) => Some(place),
            None if self.recovers() => Some(0),
            None => None,
        }
    }

    /// Whether a rerun of a differentiated allreduce starts from the
    /// error-feedback residual its first attempt started from (the failed
    /// attempt may have consumed part of it).
    pub fn reruns_restore_residuals(self) -> bool {
        self.recovers()
    }

    /// Whether ranks that rejoin are admitted: only a group that goes on
    /// after a death has a place for them.
    pub fn admits_rejoiners(self) -> bool {
        self.recovers()
    }

    /// How long a monitored barrier's member at `place` waits, for a
    /// barrier whose bound is `timeout`. The lowest (place 0) waits the
    /// bound and names the ranks that did not come. Going on, the others
    /// wait twice as long: the lowest's call for a new view must find them
    /// still waiting, not timed out on the lowest.
    pub fn monitored_barrier_wait(self, place: usize, timeout: Duration) -> Duration {
        match place != 0 && self.recovers() {
            true => timeout.saturating_mul(2),
            false => timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_never_recovers_and_closes_everything_on_a_timeout() {
        let p = OnRankFailure::Fail;
        assert!(!p.recovers());
        assert!(!p.exchange_waits_for_every_peer());
        assert!(!p.reruns_restore_residuals());
        assert!(!p.admits_rejoiners());
        assert!(p.pipelines_collectives());
        assert_eq!(p.on_timeout(), OnTimeout::CloseEveryLink);
        assert_eq!(p.broadcast_root(None), None);
        assert_eq!(p.broadcast_root(Some(2)), Some(2));
        let t = Duration::from_secs(3);
        assert_eq!(p.monitored_barrier_wait(0, t), t);
        assert_eq!(p.monitored_barrier_wait(1, t), t);
    }

    #[test]
    fn continue_recovers_removes_the_silent_and_lets_the_lowest_stand_in() {
        let p = OnRankFailure::Continue;
        assert!(p.recovers());
        assert!(p.exchange_waits_for_every_peer());
        assert!(p.reruns_restore_residuals());
        assert!(p.admits_rejoiners());
        assert!(!p.pipelines_collectives());
        assert_eq!(p.on_timeout(), OnTimeout::RemoveTheSilent);
        assert_eq!(p.broadcast_root(None), Some(0));
        assert_eq!(p.broadcast_root(Some(2)), Some(2));
        let t = Duration::from_secs(3);
        assert_eq!(p.monitored_barrier_wait(0, t), t);
        assert_eq!(p.monitored_barrier_wait(2, t), 2 * t);
    }

    #[test]
    fn the_default_is_fail_as_gloo_and_nccl() {
        assert_eq!(OnRankFailure::default(), OnRankFailure::Fail);
    }
}
