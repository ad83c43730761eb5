//! The deadline of a collective's lossy part: a budget from the call, set
//! from how long recent steps took, so that a step that meets a burst of
//! other traffic ends near its usual time and leaves what was late to the
//! next step (OptiReduce's adaptive timeout, NSDI'25).
//!
//! [`StepDeadline`] is the setting; [`DeadlineTracker`] keeps one bucket's
//! recent step times and gives each step its budget. Like the rest of the
//! core it reads no clock: the shell says how long each step took.

use std::collections::VecDeque;
use std::time::Duration;

/// How long a step's lossy part may run, counted from the call.
///
/// The important part is never cut: a step whose important part comes
/// after the deadline delivers as soon as it is in, with the lossy data
/// that is in by then.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum StepDeadline {
    /// No deadline (default): each round waits for its lossy part as its
    /// [`RoundTiming`](super::RoundTiming) says.
    #[default]
    Off,
    /// Every step's lossy part ends this long after the call.
    Fixed(Duration),
    /// The budget follows recent steps ([`AdaptiveDeadline`]).
    Adaptive(AdaptiveDeadline),
}

/// The adaptive deadline: `factor` times the median of the last `window`
/// steps' times (from the call until this rank's part was with its owners
/// and its own shard was in), at least `floor`.
///
/// A step cut at its deadline counts as taking its budget, and the budget
/// is more than the median: while steps are cut, the budget grows by
/// `factor` every half window, so a lasting slowdown (a link that got
/// slower for good) is soon followed, and a burst shorter than half the
/// window is cut.
///
/// **Tune** `factor`: nearer 1 cuts more often and bounds the tail more
/// tightly; each cut leaves that step's late values to the next.
/// **Leave** `window`, `warmup` and `floor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveDeadline {
    /// The budget over the median step (default 1.25; at least 1).
    pub factor: f64,
    /// How many recent steps the median is over (default 16).
    pub window: usize,
    /// Steps without a deadline before the first (default 3; at least 1,
    /// at most `window`): the first steps set up paths and windows.
    pub warmup: usize,
    /// The least budget (default 2 ms): below a few timer ticks a
    /// deadline only cuts.
    pub floor: Duration,
}

impl Default for AdaptiveDeadline {
    fn default() -> Self {
        Self {
            factor: 1.25,
            window: 16,
            warmup: 3,
            floor: Duration::from_millis(2),
        }
    }
}

/// A [`StepDeadline`] that cannot be followed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StepDeadlineError {
    /// The factor is not a finite number of at least 1.
    #[error("the deadline's factor must be a finite number of at least 1, not {0}")]
    Factor(f64),
    /// The window holds no step.
    #[error("the deadline's window must hold at least one step")]
    Window,
    /// The warm-up is 0 or longer than the window.
    #[error("the deadline's warm-up must be 1 to window ({window}) steps, not {warmup}")]
    Warmup {
        /// The warm-up asked for.
        warmup: usize,
        /// The window.
        window: usize,
    },
}

impl StepDeadline {
    /// Checks the setting.
    pub fn validate(&self) -> Result<(), StepDeadlineError> {
        let StepDeadline::Adaptive(a) = self else {
            return Ok(());
        };
        if !a.factor.is_finite() || a.factor < 1.0 {
            return Err(StepDeadlineError::Factor(a.factor));
        }
        if a.window == 0 {
            return Err(StepDeadlineError::Window);
        }
        if a.warmup == 0 || a.warmup > a.window {
            return Err(StepDeadlineError::Warmup {
                warmup: a.warmup,
                window: a.window,
            });
        }
        Ok(())
    }
}

/// One bucket's recent step times and the budget they give the next step.
#[derive(Debug, Clone, Default)]
pub struct DeadlineTracker {
    setting: StepDeadline,
    recent: VecDeque<Duration>,
}

impl DeadlineTracker {
    /// A tracker following a checked `setting`.
    pub fn new(setting: StepDeadline) -> Result<Self, StepDeadlineError> {
        setting.validate()?;
        Ok(Self {
            setting,
            recent: VecDeque::new(),
        })
    }

    /// The setting it follows.
    pub fn setting(&self) -> StepDeadline {
        self.setting
    }

    /// The next step's budget from its call, if it has one.
    pub fn budget(&self) -> Option<Duration> {
        match self.setting {
            StepDeadline::Off => None,
            StepDeadline::Fixed(d) => Some(d),
            StepDeadline::Adaptive(a) => {
                if self.recent.len() < a.warmup {
                    return None;
                }
                let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
                sorted.sort_unstable();
                // The lower median: an even window leans to the faster half.
                let median = sorted[(sorted.len() - 1) / 2];
                Some(median.mul_f64(a.factor).max(a.floor))
            }
        }
    }

    /// A step took `took`, from the call until this rank's part was with
    /// its owners and its own shard was in (its budget, or more, if it was
    /// cut).
    pub fn observe(&mut self, took: Duration) {
        let StepDeadline::Adaptive(a) = self.setting else {
            return;
        };
        if self.recent.len() == a.window {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn adaptive(factor: f64, window: usize, warmup: usize) -> DeadlineTracker {
        DeadlineTracker::new(StepDeadline::Adaptive(AdaptiveDeadline {
            factor,
            window,
            warmup,
            floor: ms(2),
        }))
        .unwrap()
    }

    #[test]
    fn off_and_fixed_ignore_what_steps_took() {
        let mut off = DeadlineTracker::new(StepDeadline::Off).unwrap();
        let mut fixed = DeadlineTracker::new(StepDeadline::Fixed(ms(40))).unwrap();
        for t in [10, 500, 3] {
            off.observe(ms(t));
            fixed.observe(ms(t));
            assert_eq!(off.budget(), None);
            assert_eq!(fixed.budget(), Some(ms(40)));
        }
    }

    #[test]
    fn no_budget_during_the_warm_up_then_the_median_times_the_factor() {
        let mut t = adaptive(1.5, 5, 3);
        t.observe(ms(100));
        t.observe(ms(300));
        assert_eq!(t.budget(), None);
        t.observe(ms(200));
        assert_eq!(t.budget(), Some(ms(300)));
        // The lower median of 100, 200, 300, 1000.
        t.observe(ms(1000));
        assert_eq!(t.budget(), Some(ms(300)));
    }

    #[test]
    fn a_short_burst_is_cut_and_forgotten() {
        let mut t = adaptive(1.25, 16, 3);
        for _ in 0..16 {
            t.observe(ms(80));
        }
        let calm = t.budget().unwrap();
        assert_eq!(calm, ms(100));
        // Three steps meet a burst and are cut at their budget.
        for _ in 0..3 {
            let b = t.budget().unwrap();
            t.observe(b);
        }
        assert_eq!(
            t.budget(),
            Some(calm),
            "a short burst does not move the median"
        );
    }

    #[test]
    fn a_lasting_slowdown_is_followed() {
        let mut t = adaptive(1.25, 16, 3);
        for _ in 0..16 {
            t.observe(ms(80));
        }
        // The path is now three times slower: steps are cut at their
        // budget until the budget covers them.
        let mut steps = 0;
        while t.budget().unwrap() < ms(240) {
            let b = t.budget().unwrap();
            t.observe(b.min(ms(240)));
            steps += 1;
            assert!(steps < 100, "the budget never caught up");
        }
        assert!(steps > 8, "a burst of half a window is cut ({steps} steps)");
    }

    #[test]
    fn the_floor_holds() {
        let mut t = adaptive(1.0, 4, 1);
        t.observe(Duration::from_micros(10));
        assert_eq!(t.budget(), Some(ms(2)));
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = |factor, window, warmup| {
            StepDeadline::Adaptive(AdaptiveDeadline {
                factor,
                window,
                warmup,
                floor: ms(1),
            })
            .validate()
        };
        assert_eq!(bad(0.9, 4, 1), Err(StepDeadlineError::Factor(0.9)));
        assert!(matches!(
            bad(f64::NAN, 4, 1),
            Err(StepDeadlineError::Factor(_))
        ));
        assert_eq!(bad(1.5, 0, 1), Err(StepDeadlineError::Window));
        assert_eq!(
            bad(1.5, 4, 5),
            Err(StepDeadlineError::Warmup {
                warmup: 5,
                window: 4
            })
        );
        assert_eq!(
            bad(1.5, 4, 0),
            Err(StepDeadlineError::Warmup {
                warmup: 0,
                window: 4
            })
        );
        assert!(DeadlineTracker::new(StepDeadline::Adaptive(AdaptiveDeadline::default())).is_ok());
    }

    proptest! {
        /// The budget is at least the floor, at most the factor times the
        /// slowest step in the window, and at least the factor times the
        /// fastest.
        #[test]
        fn the_budget_lies_between_the_window_s_extremes(
            steps in proptest::collection::vec(0u64..10_000, 1..64),
            factor in 1.0f64..3.0,
            window in 1usize..20,
        ) {
            let mut t = adaptive(factor, window, 1);
            for (i, &s) in steps.iter().enumerate() {
                t.observe(Duration::from_micros(s));
                let seen = &steps[(i + 1).saturating_sub(window)..=i];
                let lo = Duration::from_micros(*seen.iter().min().unwrap()).mul_f64(factor);
                let hi = Duration::from_micros(*seen.iter().max().unwrap()).mul_f64(factor);
                let b = t.budget().unwrap();
                prop_assert!(b >= ms(2));
                prop_assert!(b <= hi.max(ms(2)));
                prop_assert!(b >= lo.max(ms(2)));
            }
        }
    }
}
