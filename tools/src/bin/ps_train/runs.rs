//! The loopback comparison's runs and what each reported: the list of
//! server runs the flags ask for, and the outcome the orchestrator fills
//! from a run's lines and the report prints.

use common::Policy;
use gradlane_tools::cli as common;

use crate::args::{Algo, AllArgs};
use crate::settings::FilterChoice;

/// One server run of the comparison: an algorithm, and for the filter its
/// policy and threshold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) algo: Algo,
    pub(crate) filter: FilterChoice,
}

impl Run {
    /// Every run the flags ask for, in order: each algorithm once, the
    /// straggler filter once per `--policies` x `--thresholds`.
    pub(crate) fn all(a: &AllArgs) -> Vec<Run> {
        let mut runs = Vec::new();
        for &algo in &a.algos {
            let mut filter = FilterChoice {
                sample: a.sample,
                threshold: 1.0,
                policy: Policy::SlidingWindow,
            };
            if algo != Algo::Filter {
                runs.push(Run { algo, filter });
                continue;
            }
            for &policy in &a.policies {
                for &threshold in &a.thresholds {
                    filter.policy = policy;
                    filter.threshold = threshold;
                    runs.push(Run { algo, filter });
                }
            }
        }
        runs
    }

    pub(crate) fn label(&self) -> String {
        match self.algo {
            Algo::Filter => format!(
                "filter {} {}",
                self.filter.policy.name(),
                self.filter.threshold
            ),
            a => a.name().to_string(),
        }
    }
}

/// What one run's server and workers reported.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The server's evaluations: (seconds, steps, loss, accuracy).
    pub(crate) evals: Vec<(f64, u64, f64, f64)>,
    /// The server's closing `done` line, its `key=value` fields.
    pub(crate) done: String,
    /// Per worker: (pushes answered, of them dropped).
    pub(crate) worker_pushes: Vec<Option<(u64, u64)>>,
}

impl Outcome {
    /// Takes in one line of the server's output: an `eval` line or the
    /// `done` line; any other line (or a malformed eval) is passed over.
    pub(crate) fn take_line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("eval ") {
            let f: Vec<&str> = rest.split(' ').collect();
            if let [t, steps, loss, acc] = f[..] {
                if let (Ok(t), Ok(steps), Ok(loss), Ok(acc)) =
                    (t.parse(), steps.parse(), loss.parse(), acc.parse())
                {
                    self.evals.push((t, steps, loss, acc));
                }
            }
        } else if let Some(rest) = line.strip_prefix("done ") {
            self.done = rest.to_string();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_lines_fill_the_outcome() {
        let mut o = Outcome::default();
        for line in [
            "listening 127.0.0.1:4433",
            "eval 0.5 10 0.75 0.5",
            "eval 1.0 x 0.5 0.6",
            "eval 1.5 30 0.25 0.875",
            "done applied=30 dropped=2",
        ] {
            o.take_line(line);
        }
        assert_eq!(o.evals, [(0.5, 10, 0.75, 0.5), (1.5, 30, 0.25, 0.875)]);
        assert_eq!(o.done, "applied=30 dropped=2");
    }
}
