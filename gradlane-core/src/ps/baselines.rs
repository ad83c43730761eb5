//! Baselines with the same pull/push shape, for comparison with OrMo and the
//! straggler filter.
//!
//! * [`Asgd`]: `w -= eta g` for every gradient as it arrives.
//! * [`NaiveMomentumAsgd`]: `u = beta u + g; w -= eta u` for every gradient as
//!   it arrives — momentum applied in arrival order, ignoring staleness, which
//!   is what OrMo improves on.
//! * [`SyncMomentum`]: synchronous SGD with momentum over K workers; waits for
//!   K gradients of the current round, averages them, `u = beta u + mean;
//!   w -= eta u`.
//!
//! The asynchronous baselines index tickets by their update count and accept
//! any index not ahead of it (they don't need per-worker bookkeeping).

use super::{
    check_gradient, check_initial, check_momentum, check_rate, ConfigError, Disposition,
    ParameterServer, PullError, PushError, PushOutcome, ReleaseError, Ticket,
};

/// Plain asynchronous SGD: a [`NaiveMomentumAsgd`] with momentum 0, whose
/// update `u = g; w -= eta u` is exactly `w -= eta g`.
#[derive(Debug, Clone)]
pub struct Asgd(NaiveMomentumAsgd);

impl Asgd {
    /// Start from `w0` with learning rate `learning_rate`.
    pub fn new(learning_rate: f64, w0: Vec<f32>) -> Result<Self, ConfigError> {
        Ok(Self(NaiveMomentumAsgd::new(learning_rate, 0.0, w0)?))
    }
}

impl ParameterServer for Asgd {
    fn params(&self) -> &[f32] {
        self.0.params()
    }

    fn steps(&self) -> u64 {
        self.0.steps()
    }

    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError> {
        self.0.pull()
    }

    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError> {
        self.0.push(grad, index)
    }
}

/// Asynchronous SGD with momentum applied in arrival order.
#[derive(Debug, Clone)]
pub struct NaiveMomentumAsgd {
    lr: f32,
    beta: f32,
    w: Vec<f32>,
    u: Vec<f32>,
    t: u64,
}

impl NaiveMomentumAsgd {
    /// Start from `w0` with zero momentum.
    pub fn new(learning_rate: f64, momentum: f64, w0: Vec<f32>) -> Result<Self, ConfigError> {
        check_initial(&w0)?;
        check_rate(learning_rate)?;
        check_momentum(momentum)?;
        let u = vec![0.0; w0.len()];
        Ok(Self {
            lr: learning_rate as f32,
            beta: momentum as f32,
            w: w0,
            u,
            t: 0,
        })
    }
}

impl ParameterServer for NaiveMomentumAsgd {
    fn params(&self) -> &[f32] {
        &self.w
    }

    fn steps(&self) -> u64 {
        self.t
    }

    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError> {
        Ok(Some(Ticket {
            index: self.t,
            params: &self.w,
        }))
    }

    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError> {
        check_gradient(grad, self.w.len())?;
        if index > self.t {
            return Err(PushError::UnknownIndex(index));
        }
        for ((w, u), g) in self.w.iter_mut().zip(self.u.iter_mut()).zip(grad) {
            *u = self.beta * *u + g;
            *w -= self.lr * *u;
        }
        let staleness = self.t - index;
        self.t += 1;
        Ok(PushOutcome {
            disposition: Disposition::Applied { staleness },
            reply: Some(Ticket {
                index: self.t,
                params: &self.w,
            }),
        })
    }
}

/// Synchronous SGD with momentum over K workers.
///
/// Round r hands out at most K tickets with index r; further pulls get
/// `Ok(None)` until the round completes. The K-th push of the round applies
/// the step and the pusher gets the first ticket of round r+1; the others
/// pull it.
#[derive(Debug, Clone)]
pub struct SyncMomentum {
    workers: usize,
    lr: f32,
    beta: f32,
    w: Vec<f32>,
    u: Vec<f32>,
    /// Sum of this round's gradients (f64 so the mean doesn't depend on
    /// arrival order beyond rounding of the inputs).
    acc: Vec<f64>,
    round: u64,
    issued: usize,
    received: usize,
}

impl SyncMomentum {
    /// Start from `w0` with zero momentum, round 0.
    pub fn new(
        workers: usize,
        learning_rate: f64,
        momentum: f64,
        w0: Vec<f32>,
    ) -> Result<Self, ConfigError> {
        check_initial(&w0)?;
        check_rate(learning_rate)?;
        check_momentum(momentum)?;
        if workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        let n = w0.len();
        Ok(Self {
            workers,
            lr: learning_rate as f32,
            beta: momentum as f32,
            w: w0,
            u: vec![0.0; n],
            acc: vec![0.0; n],
            round: 0,
            issued: 0,
            received: 0,
        })
    }

    /// Current round.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Workers the current round waits for.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Applies the mean of the received gradients and opens the next round
    /// with no tickets out.
    fn step(&mut self) {
        let inv_k = 1.0 / self.received as f64;
        for ((w, u), a) in self
            .w
            .iter_mut()
            .zip(self.u.iter_mut())
            .zip(self.acc.iter_mut())
        {
            *u = self.beta * *u + (*a * inv_k) as f32;
            *w -= self.lr * *u;
            *a = 0.0;
        }
        self.round += 1;
        self.received = 0;
        self.issued = 0;
    }
}

impl ParameterServer for SyncMomentum {
    fn params(&self) -> &[f32] {
        &self.w
    }

    fn steps(&self) -> u64 {
        self.round
    }

    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError> {
        if self.issued >= self.workers {
            return Ok(None);
        }
        self.issued += 1;
        Ok(Some(Ticket {
            index: self.round,
            params: &self.w,
        }))
    }

    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError> {
        check_gradient(grad, self.w.len())?;
        if index != self.round || self.received >= self.issued {
            return Err(PushError::UnknownIndex(index));
        }
        for (a, g) in self.acc.iter_mut().zip(grad) {
            *a += f64::from(*g);
        }
        self.received += 1;
        if self.received < self.workers {
            return Ok(PushOutcome {
                disposition: Disposition::Buffered,
                reply: None,
            });
        }
        self.step();
        // The pusher goes on at once with the first ticket of the new round.
        self.issued = 1;
        Ok(PushOutcome {
            disposition: Disposition::Applied { staleness: 0 },
            reply: Some(Ticket {
                index: self.round,
                params: &self.w,
            }),
        })
    }

    /// The round shrinks to the workers left (synchronous SGD cannot wait
    /// for a worker that is gone); if everyone left has already pushed, the
    /// round completes now with their mean.
    fn leave(&mut self, ticket: Option<u64>) -> Result<(), ReleaseError> {
        if let Some(index) = ticket {
            if index != self.round || self.issued <= self.received {
                return Err(ReleaseError::UnknownIndex(index));
            }
            self.issued -= 1;
        }
        self.workers = self.workers.saturating_sub(1);
        if self.received > 0 && self.received >= self.workers {
            self.step();
        }
        Ok(())
    }
}
