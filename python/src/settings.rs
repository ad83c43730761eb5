//! `gradlane.Settings`: every knob of a Group, of its buckets and of the
//! torch hook, in one object that crosses into Rust once. Each default is
//! the library's own ([`gradlane::Config::default`] and its kin), each
//! range is checked by the library's own validation, and a knob keeps its
//! name from Python to the core.

use crate::environment;
use crate::group_arguments::{loss_recovery, seconds};
use gradlane::{
    AdaptiveDeadline, BucketOptions, ClassFormats, Config, DscpMarks, Faults, GroupConfig,
    LossRecovery, LossyCarrier, OnRankFailure, Packets, StepDeadline, StepDeadlineError,
    ValueFormat,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::time::Duration;

/// A bucket's deadline as Python gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Deadline {
    /// None: the links' timing alone.
    Off,
    /// "adaptive": `deadline_factor` times the median of recent calls.
    Adaptive,
    /// A fixed number of seconds.
    Seconds(f64),
}

/// Settings of a Group, of its buckets and of the torch hook:
/// Settings(**knobs), every knob by keyword, the rest at their defaults.
///
/// The Group's: loss_tolerance (the share of each tensor's chunks, the
/// least important, that travel lossy, in [0, 1]), injected_loss,
/// injected_delay and seed (faults for tests and demos), idle_timeout,
/// dscp, lossy_carrier ("adaptive" or "datagrams"), important_format and
/// lossy_format ("f32", "bf16", "f16"; "log8" lossy only), sockets,
/// port_range ("lo-hi"), on_rank_failure ("fail" or "continue"),
/// join_timeout and collective_timeout (seconds).
///
/// The buckets': recovery ("zero_fill", "rescale", "error_feedback"),
/// compression_feedback (None: on for log8), lossy_return, deadline (None,
/// "adaptive" or seconds) and deadline_factor.
///
/// The hook's own: overlap, rotation (None or "hadamard").
///
/// Each knob reads back as an attribute; a bad value is a ValueError
/// naming it, an unknown knob a TypeError. gradlane.Group(settings=...)
/// and register_bucket(settings=...) take one, as does
/// gradlane.torch.HookState.
#[pyclass(module = "gradlane", name = "Settings", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    #[pyo3(get)]
    loss_tolerance: f64,
    #[pyo3(get)]
    injected_loss: f64,
    #[pyo3(get)]
    injected_delay: f64,
    #[pyo3(get)]
    seed: u64,
    #[pyo3(get)]
    idle_timeout: Option<f64>,
    #[pyo3(get)]
    dscp: bool,
    #[pyo3(get)]
    lossy_carrier: String,
    #[pyo3(get)]
    important_format: String,
    #[pyo3(get)]
    lossy_format: String,
    #[pyo3(get)]
    sockets: Option<i64>,
    #[pyo3(get)]
    port_range: Option<String>,
    #[pyo3(get)]
    on_rank_failure: String,
    #[pyo3(get)]
    join_timeout: f64,
    #[pyo3(get)]
    collective_timeout: Option<f64>,
    #[pyo3(get)]
    recovery: String,
    #[pyo3(get)]
    compression_feedback: Option<bool>,
    #[pyo3(get)]
    lossy_return: bool,
    deadline: Deadline,
    #[pyo3(get)]
    deadline_factor: f64,
    #[pyo3(get)]
    overlap: bool,
    #[pyo3(get)]
    rotation: Option<String>,
}

impl Default for Settings {
    /// The library's defaults.
    fn default() -> Self {
        let link = Config::default();
        let bucket = BucketOptions::default();
        Self {
            loss_tolerance: link.loss_tolerance,
            injected_loss: 0.0,
            injected_delay: 0.0,
            seed: 0,
            idle_timeout: None,
            dscp: false,
            lossy_carrier: carrier_name(link.timing.lossy_carrier).into(),
            important_format: link.formats.important.to_string(),
            lossy_format: link.formats.lossy.to_string(),
            sockets: None,
            port_range: None,
            on_rank_failure: "fail".into(),
            join_timeout: GroupConfig::DEFAULT_JOIN_TIMEOUT.as_secs_f64(),
            collective_timeout: None,
            recovery: recovery_name(bucket.recovery).into(),
            compression_feedback: bucket.compression_feedback,
            lossy_return: bucket.lossy_return,
            deadline: Deadline::Off,
            deadline_factor: AdaptiveDeadline::default().factor,
            overlap: false,
            rotation: None,
        }
    }
}

/// Python's name of a lossy carrier.
fn carrier_name(c: LossyCarrier) -> &'static str {
    match c {
        LossyCarrier::Adaptive => "adaptive",
        LossyCarrier::Datagrams => "datagrams",
    }
}

/// Python's name of a recovery.
fn recovery_name(r: LossRecovery) -> &'static str {
    match r {
        LossRecovery::ZeroFill => "zero_fill",
        LossRecovery::Rescale => "rescale",
        LossRecovery::ErrorFeedback => "error_feedback",
        LossRecovery::Drop => "drop",
    }
}

/// `value` of knob `key` as a `T`, or a TypeError naming the knob.
fn take<'py, T: for<'a> FromPyObject<'a, 'py>>(
    key: &str,
    value: &Bound<'py, PyAny>,
) -> PyResult<T> {
    value
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("Settings: {key}={value} has the wrong type")))
}

impl Settings {
    /// These settings with `options` (knob name to value) applied, each
    /// checked.
    fn with(mut self, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        for (key, value) in options.into_iter().flatten() {
            let key: String = key.extract()?;
            let v = &value;
            match key.as_str() {
                "loss_tolerance" => self.loss_tolerance = take(&key, v)?,
                "injected_loss" => self.injected_loss = take(&key, v)?,
                "injected_delay" => self.injected_delay = take(&key, v)?,
                "seed" => self.seed = take(&key, v)?,
                "idle_timeout" => self.idle_timeout = take(&key, v)?,
                "dscp" => self.dscp = take(&key, v)?,
                "lossy_carrier" => self.lossy_carrier = take(&key, v)?,
                "important_format" => self.important_format = take(&key, v)?,
                "lossy_format" => self.lossy_format = take(&key, v)?,
                "sockets" => self.sockets = take(&key, v)?,
                "port_range" => self.port_range = take(&key, v)?,
                "on_rank_failure" => self.on_rank_failure = take(&key, v)?,
                "join_timeout" => self.join_timeout = take(&key, v)?,
                "collective_timeout" => self.collective_timeout = take(&key, v)?,
                "recovery" => self.recovery = take(&key, v)?,
                "compression_feedback" => self.compression_feedback = take(&key, v)?,
                "lossy_return" => self.lossy_return = take(&key, v)?,
                "deadline" => self.deadline = deadline(v)?,
                "deadline_factor" => self.deadline_factor = take(&key, v)?,
                "overlap" => self.overlap = take(&key, v)?,
                "rotation" => self.rotation = take(&key, v)?,
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "Settings got an unexpected keyword argument '{key}'"
                    )))
                }
            }
        }
        self.check()?;
        Ok(self)
    }

    /// Checks every knob: each is parsed as the Group and its buckets will
    /// parse it, and the links' settings go through the library's own
    /// validation.
    fn check(&self) -> PyResult<()> {
        self.link()?;
        self.on_rank_failure()?;
        self.timeouts()?;
        self.bucket(ValueFormat::F32, None)?;
        if let Some(n) = self.sockets {
            environment::socket_count(n, "sockets")?;
        }
        if let Some(r) = &self.port_range {
            environment::port_range(r, "port_range")?;
        }
        if !matches!(self.rotation.as_deref(), None | Some("hadamard")) {
            return Err(PyValueError::new_err(format!(
                "unknown rotation '{}'; None or 'hadamard'",
                self.rotation.as_deref().unwrap_or_default()
            )));
        }
        if self.recovery == "drop" {
            return Err(PyValueError::new_err(
                "unknown recovery 'drop'; one of zero_fill, rescale, error_feedback \
                 (drop is the compressors' own, for register_bucket)",
            ));
        }
        Ok(())
    }

    /// The formats the important chunks and the lossy levels travel in.
    fn formats(&self) -> PyResult<ClassFormats> {
        let parse = |what: &str, name: &str| {
            name.parse::<ValueFormat>()
                .map_err(|e| PyValueError::new_err(format!("unknown {what} '{name}': {e}")))
        };
        let important = parse("important_format", &self.important_format)?;
        if important == ValueFormat::Log8 {
            return Err(PyValueError::new_err(
                "unknown important_format 'log8'; one of f32, bf16, f16 (log8 is for the \
                 lossy part only)",
            ));
        }
        let lossy = parse("lossy_format", &self.lossy_format)?;
        Ok(ClassFormats { important, lossy })
    }

    /// The links' settings, validated by the library.
    pub(crate) fn link(&self) -> PyResult<Config> {
        let mut link = Config {
            loss_tolerance: self.loss_tolerance,
            formats: self.formats()?,
            ..Config::default()
        };
        if !(0.0..1.0).contains(&self.injected_loss) {
            return Err(PyValueError::new_err(format!(
                "injected_loss {} is not in [0, 1)",
                self.injected_loss
            )));
        }
        let delay = match self.injected_delay {
            0.0 => Duration::ZERO,
            d => seconds("injected_delay", d)?,
        };
        if self.injected_loss > 0.0 {
            // Injected loss stands for a lossy path between hosts, whose
            // packets are Ethernet-sized: a lost 64 KB loopback packet
            // would stand for 45 lost there.
            link.packets = Packets::Ethernet;
        }
        if self.injected_loss > 0.0 || !delay.is_zero() {
            link.faults = Some(Faults {
                loss_out: self.injected_loss,
                delay,
                seed: self.seed,
                ..Faults::default()
            });
        }
        if self.dscp {
            link.dscp = Some(DscpMarks::authors(link.levels));
        }
        link.timing.lossy_carrier = match self.lossy_carrier.as_str() {
            "adaptive" => LossyCarrier::Adaptive,
            "datagrams" => LossyCarrier::Datagrams,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown lossy_carrier '{other}'; one of adaptive, datagrams"
                )))
            }
        };
        if let Some(idle) = self.idle_timeout {
            link.quic
                .fail_silent_peer_within(seconds("idle_timeout", idle)?);
        }
        link.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(link)
    }

    /// What a dead rank does to the group.
    fn on_rank_failure(&self) -> PyResult<OnRankFailure> {
        match self.on_rank_failure.as_str() {
            "fail" => Ok(OnRankFailure::Fail),
            "continue" => Ok(OnRankFailure::Continue),
            other => Err(PyValueError::new_err(format!(
                "unknown on_rank_failure '{other}'; one of fail, continue"
            ))),
        }
    }

    /// The join timeout and the collective timeout.
    fn timeouts(&self) -> PyResult<(Duration, Option<Duration>)> {
        let join = seconds("join_timeout", self.join_timeout)?;
        let collective = self
            .collective_timeout
            .map(|t| seconds("collective_timeout", t))
            .transpose()?;
        Ok((join, collective))
    }

    /// `config` (a rank's place and certificates) with these settings:
    /// its links', its failure policy, timeouts, sockets and ports (the
    /// environment's where these name none).
    pub(crate) fn group_config(&self, mut config: GroupConfig) -> PyResult<GroupConfig> {
        let (join, collective) = self.timeouts()?;
        config.link = self.link()?;
        config.on_rank_failure = self.on_rank_failure()?;
        config.join_timeout = join;
        config.collective_timeout = collective;
        config.sockets = environment::group_sockets(self.sockets)?;
        config.port_range = environment::group_port_range(self.port_range.as_deref())?;
        Ok(config)
    }

    /// A bucket's options from these settings: its buffer's `dtype`, and
    /// `recovery` where the caller names one of its own (a compressor's
    /// "drop").
    pub(crate) fn bucket(
        &self,
        dtype: ValueFormat,
        recovery: Option<LossRecovery>,
    ) -> PyResult<BucketOptions> {
        let recovery = match recovery {
            Some(r) => r,
            None => loss_recovery(&self.recovery)?,
        };
        let adaptive = StepDeadline::Adaptive(AdaptiveDeadline {
            factor: self.deadline_factor,
            ..AdaptiveDeadline::default()
        });
        adaptive.validate().map_err(|e| match e {
            StepDeadlineError::Factor(f) => PyValueError::new_err(format!(
                "deadline_factor {f} is below 1 (a finite number of at least 1)"
            )),
            other => PyValueError::new_err(other.to_string()),
        })?;
        let deadline = match self.deadline {
            Deadline::Off => StepDeadline::Off,
            Deadline::Adaptive => adaptive,
            Deadline::Seconds(s) => StepDeadline::Fixed(seconds("deadline", s)?),
        };
        Ok(BucketOptions {
            recovery,
            dtype,
            formats: Some(self.formats()?),
            lossy_return: self.lossy_return,
            compression_feedback: self.compression_feedback,
            deadline,
            gather: false,
        })
    }
}

/// A deadline from Python: None, "adaptive" or a positive number of
/// seconds.
fn deadline(value: &Bound<'_, PyAny>) -> PyResult<Deadline> {
    let bad = || {
        PyValueError::new_err(format!(
            "deadline {} is not None, \"adaptive\" or a positive number of seconds",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    if value.is_none() {
        return Ok(Deadline::Off);
    }
    if let Ok(word) = value.extract::<String>() {
        return match word.as_str() {
            "adaptive" => Ok(Deadline::Adaptive),
            _ => Err(bad()),
        };
    }
    match value.extract::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(Deadline::Seconds(s)),
        _ => Err(bad()),
    }
}

#[pymethods]
impl Settings {
    #[new]
    #[pyo3(signature = (**options))]
    pub(crate) fn new(options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::default().with(options)
    }

    /// A copy with the knobs given changed.
    #[pyo3(signature = (**options))]
    pub(crate) fn replace(&self, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        self.clone().with(options)
    }

    /// None, "adaptive" or seconds.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self.deadline {
            Deadline::Off => py.None(),
            Deadline::Adaptive => "adaptive".into_pyobject(py)?.into_any().unbind(),
            Deadline::Seconds(s) => s.into_pyobject(py)?.into_any().unbind(),
        })
    }

    /// Whether a Group made with `other` carries these settings' links:
    /// the same loss tolerance, faults, DSCP marks and lossy carrier (the
    /// torch hook shares the backend's Group where they match).
    fn links_match(&self, other: &Settings) -> bool {
        let faults = |s: &Settings| (s.injected_loss, s.injected_delay, s.seed);
        let seeded = self.injected_loss > 0.0 || self.injected_delay > 0.0;
        self.loss_tolerance == other.loss_tolerance
            && self.dscp == other.dscp
            && self.lossy_carrier == other.lossy_carrier
            && match seeded {
                true => faults(self) == faults(other),
                false => other.injected_loss == 0.0 && other.injected_delay == 0.0,
            }
    }

    /// Whether these settings ask for what only a Group of their own can
    /// carry: injected faults, DSCP marks, a lossy carrier other than the
    /// default.
    #[getter]
    fn needs_own_group(&self) -> bool {
        let base = Settings {
            loss_tolerance: self.loss_tolerance,
            ..Settings::default()
        };
        !base.links_match(self)
    }
}
