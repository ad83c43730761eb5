//! The scripts README names: how each is checked (run, or its arguments
//! parsed where it needs root), and the checks every one gets (it exists,
//! `bash -n` passes, the programs it builds exist).

use super::{
    command_line, expanded, on_loopback, with_short_limits, Build, Outcome, Program, PYTHON_HALF,
    RUN_LIMIT,
};
use crate::process::Running;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// How the check treats each script README names.
#[derive(Debug, Clone, Copy)]
pub enum ScriptCheck {
    /// Runs on loopback from a copy in the section's directory, with this
    /// build's programs (BIN_DIR) instead of a release build; it must leave
    /// nothing behind there, where the user's next commands run.
    Run,
    /// Needs root (or a capture); its arguments go to this program, whose
    /// parser checks them.
    ArgumentsTo(&'static str),
    /// Needs root; takes no arguments (its settings come from the
    /// environment).
    NoArguments,
    /// Needs root; `--dry-run` checks its options.
    DryRun,
    /// Needs the venv with torch.
    PythonHalf,
    /// The test command that runs this check.
    ThisCheck,
}

/// Every script README names: how the check treats it, and why it is not
/// run here where it is not.
pub const SCRIPTS: &[(&str, ScriptCheck, &str)] = &[
    ("scripts/demo.sh", ScriptCheck::Run, ""),
    ("scripts/test.sh", ScriptCheck::ThisCheck, ""),
    ("scripts/ddp_step_bench.sh", ScriptCheck::PythonHalf, ""),
    (
        "scripts/dscp_wire.sh",
        ScriptCheck::ArgumentsTo("sender"),
        "captures with tshark: needs root or the capture capability",
    ),
    (
        "scripts/bottleneck_bench.sh",
        ScriptCheck::ArgumentsTo("round_bench"),
        "needs root: a network namespace and tc",
    ),
    (
        "scripts/allreduce_bottleneck.sh",
        ScriptCheck::ArgumentsTo("allreduce_bench"),
        "needs root: the testbed",
    ),
    (
        "scripts/netns_bench.sh",
        ScriptCheck::NoArguments,
        "needs root: network namespaces and tc",
    ),
    (
        "scripts/tta_bench.sh",
        ScriptCheck::NoArguments,
        "needs root: the testbed",
    ),
    (
        "scripts/testbed.sh",
        ScriptCheck::DryRun,
        "needs root: network namespaces, tc and iptables",
    ),
    (
        "scripts/two_host_walkthrough.sh",
        ScriptCheck::DryRun,
        "needs root: the testbed (python/tests/test_two_host_walkthrough.py runs its lines on loopback)",
    ),
];

/// Checks the script at `path` (relative to the repository) as README gives
/// it, with `args`; `mention` when the prose only names it.
pub fn run_script(
    path: &str,
    args: &[String],
    mention: bool,
    build: &Build,
    dir: &Path,
) -> Result<Outcome, String> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {path}: {e}"))?;
    let (check, why) = SCRIPTS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, c, why)| (*c, *why))
        .ok_or_else(|| {
            format!("{path} is not in the check's SCRIPTS: add it, with how to check it")
        })?;
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    if !syntax.status.success() {
        return Err(format!(
            "bash -n {path}: {}",
            String::from_utf8_lossy(&syntax.stderr)
        ));
    }
    for bin in programs_named(&text) {
        build
            .path(&bin)
            .map_err(|e| format!("{path} builds or runs {bin}: {e}"))?;
    }
    let checked = "`bash -n` passes and the programs it builds exist";
    if mention {
        return Ok(Outcome::Elsewhere(format!(
            "named, not run here: {path} exists, {checked}"
        )));
    }
    let args = expanded(&on_loopback(args))?
        .into_iter()
        .next()
        .unwrap_or_default();
    match check {
        ScriptCheck::Run => {
            let copy = dir.join(path);
            copy.parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::copy(&file, &copy).map(drop))
                .map_err(|e| format!("cannot copy {path} to {}: {e}", copy.display()))?;
            let args = with_short_limits(path, args);
            let shown = command_line(&format!("bash {path}"), &args);
            let t = Instant::now();
            let mut running = Running::spawn(
                Command::new("bash")
                    .arg(path)
                    .args(&args)
                    .current_dir(dir)
                    .env("BIN_DIR", &build.dir),
            )?;
            let before = entries(dir)?;
            running
                .finish(RUN_LIMIT)
                .map_err(|e| format!("{shown} {e}:\n{}", running.tail()))?;
            let left: Vec<String> = entries(dir)?
                .into_iter()
                .filter(|e| !before.contains(e))
                .collect();
            if !left.is_empty() {
                return Err(format!(
                    "{shown} ran, but left {} in the checkout: a command after it that \
                     makes them (`certs`) finds them taken",
                    left.join(", ")
                ));
            }
            Ok(Outcome::Ran(format!(
                "{shown} from a copy, with this build's programs (BIN_DIR), leaving nothing \
                 behind ({:.1} s)",
                t.elapsed().as_secs_f64()
            )))
        }
        ScriptCheck::ArgumentsTo(program) => {
            if !text.contains("\"$@\"") || !text.contains(program) {
                return Err(format!(
                    "the check's SCRIPTS says {path} hands its arguments to {program}, \
                     but it has no {program} and no \"$@\""
                ));
            }
            if args.is_empty() {
                return Ok(Outcome::Parsed(format!("{why}; none given, {checked}")));
            }
            let mut with_help = args.clone();
            with_help.push("--help".into());
            build.run(&Program::new(program, &args), &with_help, dir)?;
            Ok(Outcome::Parsed(format!(
                "{why}; {program}, which gets them, parses `{}`, and {checked}",
                args.join(" ")
            )))
        }
        ScriptCheck::NoArguments if args.is_empty() => Ok(Outcome::Parsed(format!(
            "{why}; it takes none, and {checked}"
        ))),
        ScriptCheck::NoArguments => Err(format!(
            "{path} takes no arguments (its settings come from the environment), yet README gives `{}`",
            args.join(" ")
        )),
        ScriptCheck::DryRun => {
            let shown = command_line(&format!("bash {path} --dry-run"), &args);
            let mut running = Running::spawn(
                Command::new("bash")
                    .arg(&file)
                    .arg("--dry-run")
                    .args(&args)
                    .current_dir(dir),
            )?;
            running
                .finish(RUN_LIMIT)
                .map_err(|e| format!("{shown} {e}:\n{}", running.tail()))?;
            Ok(Outcome::Parsed(format!("{why}; {shown} accepts them")))
        }
        ScriptCheck::PythonHalf => Ok(Outcome::Elsewhere(PYTHON_HALF.to_string())),
        ScriptCheck::ThisCheck => Ok(Outcome::Elsewhere(
            "not run: the test command that runs this check".to_string(),
        )),
    }
}

/// The names in `dir`.
fn entries(dir: &Path) -> Result<Vec<String>, String> {
    let list = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    Ok(list
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect())
}

/// The tools programs a script builds or runs: `--bin NAME`,
/// `target/release/NAME`, `$BIN/NAME`.
fn programs_named(script: &str) -> Vec<String> {
    let mut names = Vec::new();
    for marker in ["--bin ", "target/release/", "$BIN/"] {
        for (at, _) in script.match_indices(marker) {
            let name: String = script[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}
