//! Attempts that overlap: a new one each window while the earlier ones go
//! on, the first to succeed winning. How [`Endpoint::connect`] gets a
//! QUIC handshake through heavy loss, and how a rank of a group reaches
//! another (`group::rendezvous::dial`).
//!
//! quinn backs off a handshake's retransmissions exponentially, doubling
//! the wait after every probe that went unanswered, so an unlucky run of
//! lost handshake packets can outlast the idle timeout. A fresh attempt
//! starts its backoff from the beginning; an earlier one that is getting
//! through may still finish first, so it is kept rather than replaced.
//!
//! [`Endpoint::connect`]: crate::Endpoint::connect

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::time::Duration;

/// When a new attempt starts beside the earlier ones: after `first`, then
/// after windows twice as long each time, up to `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windows {
    /// How long the first attempt runs alone.
    pub(crate) first: Duration,
    /// The longest window.
    pub(crate) last: Duration,
}

impl Windows {
    /// The windows of a QUIC handshake: 2 s, 4 s, 8 s, then 16 s. quinn's
    /// first probe comes about a second after the first packet (with no
    /// round trip measured yet), so an attempt silent for 2 s has lost at
    /// least one exchange; the windows grow as the earlier attempts'
    /// backoffs do, so that attempts are not started faster than they
    /// could be told apart from ones still getting through.
    pub(crate) const HANDSHAKE: Windows = Windows {
        first: Duration::from_secs(2),
        last: Duration::from_secs(16),
    };

    /// The window after one of `length`.
    fn after(&self, length: Duration) -> Duration {
        (length * 2).min(self.last)
    }
}

/// Starts `attempt()` now and again at the end of each window, the
/// earlier attempts going on beside each new one, until one succeeds
/// (its value) or one fails in a way `fatal` keeps (the error `fatal`
/// makes of it). Any other failure ends only its own attempt. It never
/// ends otherwise: the caller bounds it (a timeout, its own deadline).
/// The attempts still running when it returns are dropped.
///
/// `retrying(window, running)` hears of each window that ended without a
/// winner: how long it was, and how many attempts are still running.
pub(crate) async fn overlapping<T, E, G, Fut>(
    windows: Windows,
    mut attempt: impl FnMut() -> Fut,
    mut fatal: impl FnMut(E) -> Option<G>,
    mut retrying: impl FnMut(Duration, usize),
) -> Result<T, G>
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempts = FuturesUnordered::new();
    let mut window = windows.first;
    loop {
        attempts.push(attempt());
        let ends = tokio::time::sleep(window);
        tokio::pin!(ends);
        loop {
            tokio::select! {
                Some(done) = attempts.next() => match done {
                    Ok(value) => return Ok(value),
                    Err(e) => {
                        if let Some(e) = fatal(e) {
                            return Err(e);
                        }
                    }
                },
                () = &mut ends => break,
            }
        }
        retrying(window, attempts.len());
        window = windows.after(window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::sync::{mpsc, oneshot};

    /// Windows short enough that attempts pile up at once.
    const SHORT: Windows = Windows {
        first: Duration::from_millis(1),
        last: Duration::from_millis(1),
    };

    /// Attempts that each end when the test says so: `attempt()` makes
    /// one and reports its number on `started`; the test ends attempt
    /// `i` through `enders[i]`.
    type Ender = oneshot::Sender<Result<usize, &'static str>>;

    /// One attempt: its number, or why it failed.
    type Attempt = std::pin::Pin<Box<dyn Future<Output = Result<usize, &'static str>> + Send>>;

    fn controlled() -> (
        impl FnMut() -> Attempt,
        mpsc::UnboundedReceiver<usize>,
        Arc<Mutex<Vec<Ender>>>,
    ) {
        let (tx, started) = mpsc::unbounded_channel();
        let enders = Arc::new(Mutex::new(Vec::new()));
        let held = enders.clone();
        let attempt = move || {
            let (end, ended) = oneshot::channel();
            let mut enders = held.lock().unwrap();
            enders.push(end);
            tx.send(enders.len() - 1).unwrap();
            Box::pin(async move { ended.await.unwrap_or(Err("abandoned")) }) as Attempt
        };
        (attempt, started, enders)
    }

    /// Waits until attempt `n` has started.
    async fn until_started(started: &mut mpsc::UnboundedReceiver<usize>, n: usize) {
        while started.recv().await.unwrap() < n {}
    }

    #[test]
    fn windows_double_up_to_the_last() {
        let w = Windows::HANDSHAKE;
        let mut lengths = vec![w.first];
        for _ in 0..5 {
            lengths.push(w.after(*lengths.last().unwrap()));
        }
        let secs: Vec<u64> = lengths.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [2, 4, 8, 16, 16, 16]);
    }

    #[tokio::test]
    async fn an_earlier_attempt_finishing_after_later_ones_started_wins() {
        let (attempt, mut started, enders) = controlled();
        let never_fatal = |_: &'static str| None::<&'static str>;
        let race = overlapping(SHORT, attempt, never_fatal, |_, _| {});
        let control = async {
            until_started(&mut started, 3).await;
            let first = enders.lock().unwrap().remove(0);
            first.send(Ok(0)).unwrap();
        };
        let (won, ()) = tokio::join!(race, control);
        assert_eq!(won, Ok(0));
        // The others were dropped with the race: nobody waits on them.
        let rest = enders.lock().unwrap();
        assert!(rest.len() >= 3);
        assert!(rest.iter().all(|e| e.is_closed()));
    }

    #[tokio::test]
    async fn a_failure_that_is_not_fatal_ends_only_its_own_attempt() {
        let (attempt, mut started, enders) = controlled();
        let mut windows_ended = 0;
        let race = overlapping(
            SHORT,
            attempt,
            |e: &'static str| (e == "refused").then_some(e),
            |_, _| windows_ended += 1,
        );
        let control = async {
            until_started(&mut started, 1).await;
            let mut enders = enders.lock().unwrap();
            // The first times out; the second is the link.
            enders.remove(0).send(Err("timed out")).unwrap();
            enders.remove(0).send(Ok(1)).unwrap();
        };
        let (won, ()) = tokio::join!(race, control);
        assert_eq!(won, Ok(1));
        assert!(windows_ended >= 1);
    }

    #[tokio::test]
    async fn a_fatal_failure_ends_every_attempt() {
        let (attempt, mut started, enders) = controlled();
        let race = overlapping(
            SHORT,
            attempt,
            |e: &'static str| (e == "refused").then_some(e),
            |_, _| {},
        );
        let control = async {
            until_started(&mut started, 2).await;
            let ender = enders.lock().unwrap().remove(1);
            ender.send(Err("refused")).unwrap();
        };
        let (lost, ()) = tokio::join!(race, control);
        assert_eq!(lost, Err("refused"));
        assert!(enders.lock().unwrap().iter().all(|e| e.is_closed()));
    }
}
