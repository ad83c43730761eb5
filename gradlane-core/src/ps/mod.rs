//! Parameter server core: deterministic state machines, no sockets, no clock.
//!
//! Workers *pull* a [`Ticket`] (an index and a view of the parameters), compute a
//! gradient on those parameters, and *push* the gradient back with the ticket's
//! index. Every server here implements [`ParameterServer`], so the networked
//! runtime (and the event simulation of the tools crate) can drive any of
//! them the same way:
//!
//! * [`OrderedMomentum`] — asynchronous SGD with ordered momentum
//!   (docs/DESIGN.md §5.1).
//! * [`StragglerFilter`] — asynchronous SGD that drops updates whose staleness
//!   ranks high in a sample of recent staleness values (CN108446770B; docs/DESIGN.md §5.2).
//! * [`baselines`] — plain ASGD, naive ASGD with momentum, synchronous SGD with
//!   momentum, for comparison.
//! * [`messages`] — the requests and replies a worker and the server
//!   exchange over the network (pure encoding and decoding).
//!
//! The index in a ticket means "the server state these parameters came from":
//! the iteration index for OrMo and ASGD, the logical clock for the filter, the
//! round for synchronous SGD. A push must present an index the server handed out;
//! the server uses it to work out how stale the gradient is.

pub mod baselines;
mod error;
pub mod messages;
pub mod ordered_momentum;
pub mod straggler;

pub use error::{ConfigError, PullError, PushError, ReleaseError};
pub use ordered_momentum::{OrderedMomentum, OrderedMomentumConfig};
pub use straggler::{SamplePolicy, StragglerConfig, StragglerFilter, StragglerStats};

/// Parameters handed to a worker together with the index it must push back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ticket<'a> {
    /// The index to send back with the gradient computed on `params`.
    pub index: u64,
    /// The parameters to compute the gradient on (copy them out; the server
    /// keeps moving).
    pub params: &'a [f32],
}

/// What the server did with a pushed gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The gradient changed the parameters. `staleness` counts the updates the
    /// server applied between handing out the ticket and this push (0 = fresh).
    Applied {
        /// Updates applied since the ticket was issued.
        staleness: u64,
    },
    /// The gradient was judged too stale and discarded (straggler filter).
    Dropped {
        /// Updates applied since the ticket was issued.
        staleness: u64,
    },
    /// The gradient was stored and will be applied later (synchronous SGD
    /// applies a round only once every worker has pushed).
    Buffered,
}

/// Result of a successful push.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PushOutcome<'a> {
    /// What happened to the gradient.
    pub disposition: Disposition,
    /// Fresh parameters for the pushing worker, if it may continue at once.
    /// `None` means the worker must wait and [`ParameterServer::pull`] later
    /// (synchronous SGD between rounds).
    pub reply: Option<Ticket<'a>>,
}

/// The pull/push shape shared by every server in this module.
pub trait ParameterServer {
    /// Current parameters.
    fn params(&self) -> &[f32];

    /// Number of times the parameters have changed.
    fn steps(&self) -> u64;

    /// Hand a worker parameters to compute on. `Ok(None)` means "not now":
    /// retry after the next push (a synchronous round is full).
    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError>;

    /// Deliver a gradient computed on the parameters of ticket `index`.
    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError>;

    /// A worker is gone for good (its connection dropped); `ticket` is the
    /// index it held and never pushed, if any. Servers that count workers or
    /// tickets must not wait for it any more. The default does nothing: the
    /// asynchronous baselines and the filter keep no per-worker state.
    fn leave(&mut self, ticket: Option<u64>) -> Result<(), ReleaseError> {
        let _ = ticket;
        Ok(())
    }
}

/// Shared input check: right length and all finite. Done before any state
/// changes so a rejected push leaves the server untouched.
fn check_gradient(grad: &[f32], dim: usize) -> Result<(), PushError> {
    if grad.len() != dim {
        return Err(PushError::WrongLength {
            expected: dim,
            got: grad.len(),
        });
    }
    if let Some(position) = grad.iter().position(|x| !x.is_finite()) {
        return Err(PushError::NonFinite { position });
    }
    Ok(())
}

/// Shared constructor check for initial parameters.
fn check_initial(w0: &[f32]) -> Result<(), ConfigError> {
    if w0.is_empty() {
        return Err(ConfigError::EmptyParams);
    }
    if let Some(position) = w0.iter().position(|x| !x.is_finite()) {
        return Err(ConfigError::NonFiniteParams { position });
    }
    Ok(())
}

/// Shared learning-rate check.
fn check_rate(rate: f64) -> Result<(), ConfigError> {
    if rate.is_finite() && rate > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::LearningRate(rate))
    }
}

/// Shared momentum check: `[0, 1)`; 1 would make OrMo's catch-up weight 0/0.
fn check_momentum(beta: f64) -> Result<(), ConfigError> {
    if beta.is_finite() && (0.0..1.0).contains(&beta) {
        Ok(())
    } else {
        Err(ConfigError::Momentum(beta))
    }
}
