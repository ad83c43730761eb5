//! allreduce_bench as a user runs it: every rank in one process, and one
//! rank per process meeting through torchrun's environment variables.

use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_allreduce_bench");

/// The table's data rows: (variant, loss, ranks that differed), the
/// columns found by their headings; every row's CPU seconds per GB sent
/// must be a positive number.
fn rows(out: &Output) -> Vec<(String, String, String)> {
    let text = String::from_utf8_lossy(&out.stdout);
    let cells = |l: &str| -> Vec<String> {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let Some(head) = text.lines().find(|l| l.starts_with("| variant")).map(cells) else {
        return Vec::new();
    };
    let column = |name: &str| {
        head.iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name:?} in {head:?}"))
    };
    let (differ, cpu) = (column("ranks differ"), column("CPU s per GB sent"));
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| variant"))
        .map(|l| {
            let c = cells(l);
            let per_gb: f64 = c[cpu].parse().unwrap_or(0.0);
            assert!(per_gb > 0.0, "{}: CPU s per GB {:?}", c[0], c[cpu]);
            (c[0].clone(), c[1].clone(), c[differ].clone())
        })
        .collect()
}

fn assert_every_variant_agrees(out: &Output, losses: &[&str]) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(out);
    // Seven variants lossless, six (no TCP ring) at each loss.
    assert_eq!(rows.len(), 7 + 6 * (losses.len() - 1), "{rows:?}");
    for (variant, loss, differ) in &rows {
        assert!(losses.contains(&loss.as_str()), "{variant}: loss {loss}");
        assert_eq!(differ, "0", "{variant} at {loss}: ranks ended apart");
    }
}

#[test]
fn all_ranks_in_one_process() {
    let out = Command::new(BENCH)
        .args(["--ranks", "3", "--model", "tiny", "--rounds", "1"])
        .args(["--losses", "0,0.05", "--delay-ms", "0"])
        .output()
        .unwrap();
    assert_every_variant_agrees(&out, &["0%", "5%"]);
}

#[test]
fn another_congestion_controller_is_taken_and_an_unknown_one_refused() {
    let out = Command::new(BENCH)
        .args(["--ranks", "3", "--model", "tiny", "--rounds", "1"])
        .args(["--losses", "0,0.05", "--delay-ms", "0"])
        .args(["--congestion", "bbr"])
        .output()
        .unwrap();
    assert_every_variant_agrees(&out, &["0%", "5%"]);
    let out = Command::new(BENCH)
        .args(["--congestion", "vegas"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vegas") && err.contains("capped-bbr"), "{err}");
}

/// The first of the 201 ports a torchrun-style run takes (rank 0 binds
/// each variant's, the TCP ring those from +100): below the kernel's
/// ephemeral range (32768 and up by default), where no other test's
/// `bind(0)` or outgoing connection lands, and apart per attempt.
fn base_port(attempt: u32) -> u16 {
    let spread = (std::process::id() + attempt * 4099) % 40;
    20000 + 300 * spread as u16
}

/// Runs `world` ranks of allreduce_bench as torchrun would start them,
/// rank 0 at `port`; every rank's output.
fn run_ranks(world: usize, port: u16, certs: &std::path::Path) -> Vec<Output> {
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(BENCH)
                .args(["--model", "tiny", "--rounds", "1", "--losses", "0"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("GRADLANE_RANK_ADDR", "127.0.0.1")
                .env("GRADLANE_CERT_DIR", certs)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn one_rank_per_process_from_torchrun_variables() {
    let dir = std::env::temp_dir().join(format!("gl-arb-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    gradlane::generate_certs(&dir, &["127.0.0.1"]).unwrap();
    // Another process on the machine may hold one of the 201 fixed ports:
    // that run is retried on other ports, and only that failure is.
    let mut outs = Vec::new();
    for attempt in 0..3 {
        outs = run_ranks(3, base_port(attempt), &dir);
        let in_use = outs
            .iter()
            .any(|o| String::from_utf8_lossy(&o.stderr).contains("Address already in use"));
        if !in_use {
            break;
        }
    }
    assert_every_variant_agrees(&outs[0], &["0%"]);
    for other in &outs[1..] {
        assert!(
            other.status.success(),
            "{}",
            String::from_utf8_lossy(&other.stderr)
        );
        assert!(rows(other).is_empty(), "only rank 0 prints the table");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_outside_the_group_is_refused_with_a_message() {
    let out = Command::new(BENCH)
        .args(["--rank", "3", "--world", "2", "--master-addr", "127.0.0.1"])
        .args(["--listen-ip", "127.0.0.1", "--cert-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 3 of a group of 2"), "{err}");
    let out = Command::new(BENCH)
        .args(["--rank", "1", "--world", "2"])
        .env_remove("MASTER_ADDR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--master-addr"), "{err}");
}
