//! CPU time of this process, the figure a benchmark reports per byte moved.
//!
//! Wall-clock time on a shared machine says as much about the neighbours
//! as about the code; the CPU seconds a process spends per gigabyte it
//! moves do not depend on how busy the machine is (as long as it does not
//! swap), so benchmarks print them beside their times.

use nix::sys::resource::{getrusage, UsageWho};
use std::time::Duration;

/// User and system CPU time used by this process (all its threads) so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// Time spent in user space.
    pub user: Duration,
    /// Time spent in the kernel on the process's behalf (syscalls, the
    /// network stack's work done in them).
    pub system: Duration,
}

impl CpuTime {
    /// This process's CPU time now (zero if the kernel refuses to say).
    pub fn now() -> Self {
        match getrusage(UsageWho::RUSAGE_SELF) {
            Ok(u) => {
                let d = |t: nix::sys::time::TimeVal| {
                    Duration::from_secs(t.tv_sec().max(0) as u64)
                        + Duration::from_micros(t.tv_usec().max(0) as u64)
                };
                Self {
                    user: d(u.user_time()),
                    system: d(u.system_time()),
                }
            }
            Err(_) => Self::default(),
        }
    }

    /// User plus system time.
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// The CPU time spent since `earlier`.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    /// Adds `other` into this one.
    pub fn add(&mut self, other: &CpuTime) {
        self.user += other.user;
        self.system += other.system;
    }

    /// CPU seconds per gigabyte (10^9 bytes) of `bytes` moved; `None`
    /// for no bytes.
    pub fn per_gb(&self, bytes: u64) -> Option<f64> {
        (bytes > 0).then(|| self.total().as_secs_f64() / (bytes as f64 / 1e9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_costs_cpu_time_and_per_gb_divides() {
        let before = CpuTime::now();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let spent = CpuTime::now().since(&before);
        // getrusage counts in microseconds at worst in scheduler ticks:
        // 30 ms of spinning shows as at least one tick.
        assert!(spent.total() >= Duration::from_millis(4), "{spent:?}");
        let two_s = CpuTime {
            user: Duration::from_secs(1),
            system: Duration::from_secs(1),
        };
        assert_eq!(two_s.per_gb(500_000_000), Some(4.0));
        assert_eq!(two_s.per_gb(0), None);
    }
}
