//! Ordered momentum (OrMo) for asynchronous SGD (docs/DESIGN.md §5.1).
//!
//! Gradients are grouped into *buckets* by the iteration index of the
//! parameters they were computed on: bucket 0 holds index 0, bucket i >= 1
//! holds indices (i-1)K+1 ..= iK. At the start every one of the K workers
//! receives index 0 (seed step 103), and afterwards each push hands the next
//! index to the pusher (step 111), so every bucket holds exactly K gradients.
//! The momentum is the bucket-ordered weighted sum of those gradients, which is
//! why, fed in order, OrMo reproduces synchronous SGD with momentum over K
//! workers: every gradient ends up with the weight SSGDm gives it. One
//! nuance: the first push of bucket i hands out an index of bucket i+1, so
//! the server advances during bucket i and, once bucket i is complete, holds
//! SSGDm's state after step i+1 *plus* the gradient-free momentum half of step
//! i+2 (`w - eta*beta*u`, `beta*u`). `tests/behaviour/ps_core.rs` checks exactly that.
//!
//! # When the server advances (step 104)
//! "If a gradient of the next bucket (b+1) is being computed by some worker,
//! advance." The server knows which indices are outstanding (handed out, not
//! yet pushed); the check runs at the start of a push, *before* the gradient is
//! taken, so the index being pushed still counts as "being computed" — that is
//! what keeps d = b - bucket(j) from going negative when a worker pushes the
//! first gradient of bucket b+1.
//!
//! In a normal run at most one bucket separates b from the newest outstanding
//! index, so the check fires at most once per push, exactly as in the published method.
//! If the runtime [`release`](OrderedMomentum::release)s a ticket (a worker
//! died), a bucket can end up with nobody computing it; the server then keeps
//! advancing while some outstanding index lies beyond b, which treats the
//! abandoned bucket as a momentum step with a zero gradient rather than
//! letting d go negative.

use std::collections::BTreeMap;

use super::{
    check_gradient, check_initial, check_momentum, check_rate, ConfigError, Disposition,
    ParameterServer, PullError, PushError, PushOutcome, ReleaseError, Ticket,
};

/// Hyper-parameters of [`OrderedMomentum`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderedMomentumConfig {
    /// Number of workers K (bucket size).
    pub workers: usize,
    /// Momentum coefficient beta in `[0, 1)`.
    pub momentum: f64,
    /// Learning rate eta.
    pub learning_rate: f64,
}

/// The OrMo server state: parameters w, momentum u, latest bucket b,
/// iteration t, and the outstanding tickets.
#[derive(Debug, Clone)]
pub struct OrderedMomentum {
    cfg: OrderedMomentumConfig,
    w: Vec<f32>,
    u: Vec<f32>,
    bucket: u64,
    iteration: u64,
    /// Outstanding indices with multiplicity (index 0 goes to all K workers).
    outstanding: BTreeMap<u64, usize>,
    outstanding_total: usize,
}

/// Bucket of iteration index `t`: 0 for 0, `ceil(t / K)` otherwise.
pub fn bucket(t: u64, workers: usize) -> u64 {
    // usize -> u64 never truncates on supported targets.
    t.div_ceil(workers as u64)
}

impl OrderedMomentum {
    /// A server starting from parameters `w0` with zero momentum, b = 0, t = 0.
    pub fn new(cfg: OrderedMomentumConfig, w0: Vec<f32>) -> Result<Self, ConfigError> {
        check_initial(&w0)?;
        check_rate(cfg.learning_rate)?;
        check_momentum(cfg.momentum)?;
        if cfg.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        let u = vec![0.0; w0.len()];
        Ok(Self {
            cfg,
            w: w0,
            u,
            bucket: 0,
            iteration: 0,
            outstanding: BTreeMap::new(),
            outstanding_total: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OrderedMomentumConfig {
        &self.cfg
    }

    /// Momentum vector u.
    pub fn momentum(&self) -> &[f32] {
        &self.u
    }

    /// Latest bucket b.
    pub fn latest_bucket(&self) -> u64 {
        self.bucket
    }

    /// Iteration index t (gradients taken so far).
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Number of tickets handed out and not yet pushed or released.
    pub fn outstanding(&self) -> usize {
        self.outstanding_total
    }

    /// Forget an outstanding ticket (its worker is gone). The next pull hands
    /// the slot out again with the current index.
    pub fn release(&mut self, index: u64) -> Result<(), ReleaseError> {
        if self.take_ticket(index) {
            Ok(())
        } else {
            Err(ReleaseError::UnknownIndex(index))
        }
    }

    fn give_ticket(&mut self, index: u64) {
        *self.outstanding.entry(index).or_insert(0) += 1;
        self.outstanding_total += 1;
    }

    /// Remove one ticket with `index`; false if there is none.
    fn take_ticket(&mut self, index: u64) -> bool {
        match self.outstanding.get_mut(&index) {
            None => false,
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.outstanding.remove(&index);
                }
                self.outstanding_total -= 1;
                true
            }
        }
    }

    /// Step 104-106: while some outstanding index lies beyond the latest
    /// bucket, fold the momentum into w and move b on.
    fn advance(&mut self) {
        let k = self.cfg.workers;
        while let Some((&newest, _)) = self.outstanding.last_key_value() {
            if bucket(newest, k) <= self.bucket {
                break;
            }
            let step = (self.cfg.learning_rate * self.cfg.momentum) as f32;
            let beta = self.cfg.momentum as f32;
            for (w, u) in self.w.iter_mut().zip(self.u.iter_mut()) {
                *w -= step * *u;
                *u *= beta;
            }
            self.bucket += 1;
        }
    }
}

/// beta^d without overflowing the exponent (beta < 1, so huge d is just 0).
fn powu(beta: f64, d: u64) -> f64 {
    beta.powi(i32::try_from(d).unwrap_or(i32::MAX))
}

impl ParameterServer for OrderedMomentum {
    fn params(&self) -> &[f32] {
        &self.w
    }

    fn steps(&self) -> u64 {
        self.iteration
    }

    /// Join: hands out the current iteration index. At the start this gives
    /// index 0 to each of the K workers, as seed step 103 does. At most K
    /// tickets are out at once.
    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError> {
        if self.outstanding_total >= self.cfg.workers {
            return Err(PullError::TicketsExhausted {
                workers: self.cfg.workers,
            });
        }
        let index = self.iteration;
        self.give_ticket(index);
        Ok(Some(Ticket {
            index,
            params: &self.w,
        }))
    }

    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError> {
        check_gradient(grad, self.w.len())?;
        if !self.outstanding.contains_key(&index) {
            return Err(PushError::UnknownIndex(index));
        }
        // The pusher's own index still counts as "being computed" here.
        self.advance();
        let k = self.cfg.workers;
        let gb = bucket(index, k);
        let Some(d) = self.bucket.checked_sub(gb) else {
            return Err(PushError::AheadOfBucket {
                index,
                bucket: gb,
                latest: self.bucket,
            });
        };
        self.take_ticket(index);

        let beta = self.cfg.momentum;
        let inv_k = 1.0 / k as f64;
        let bd = powu(beta, d);
        // u += beta^d g / K
        let u_coef = (bd * inv_k) as f32;
        // w -= eta (1 - beta^(d+1)) / (1 - beta) g / K: the weight the gradient
        // would have accumulated had it arrived with its own bucket.
        let w_coef = (self.cfg.learning_rate * (1.0 - bd * beta) / (1.0 - beta) * inv_k) as f32;
        for ((w, u), g) in self.w.iter_mut().zip(self.u.iter_mut()).zip(grad) {
            *u += u_coef * g;
            *w -= w_coef * g;
        }
        let staleness = self.iteration - index;
        self.iteration += 1;
        let next = self.iteration;
        self.give_ticket(next);
        Ok(PushOutcome {
            disposition: Disposition::Applied { staleness },
            reply: Some(Ticket {
                index: next,
                params: &self.w,
            }),
        })
    }

    /// Frees the departed worker's slot (see [`OrderedMomentum::release`]);
    /// a new worker may take it.
    fn leave(&mut self, ticket: Option<u64>) -> Result<(), ReleaseError> {
        match ticket {
            Some(index) => self.release(index),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        let b: Vec<u64> = (0..=9).map(|t| bucket(t, 4)).collect();
        assert_eq!(b, [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]);
    }

    #[test]
    fn release_frees_the_slot() {
        // K = 1: one ticket at a time. Releasing it lets a new worker join
        // with the current index, and its push advances b as usual.
        let cfg = OrderedMomentumConfig {
            workers: 1,
            momentum: 0.5,
            learning_rate: 0.1,
        };
        let mut s = OrderedMomentum::new(cfg, vec![0.0]).unwrap();
        s.pull().unwrap();
        assert!(s.pull().is_err());
        let i = s.push(&[1.0], 0).unwrap().reply.unwrap().index;
        assert_eq!(i, 1);
        s.release(1).unwrap();
        assert_eq!(s.release(1), Err(ReleaseError::UnknownIndex(1)));
        let j = s.pull().unwrap().unwrap().index;
        assert_eq!(j, 1);
        s.push(&[1.0], 1).unwrap();
        assert_eq!(s.latest_bucket(), 1);
    }
}
