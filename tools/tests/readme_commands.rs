//! README's commands, run as a user types them.
//!
//! README tells a new user what to type, and twice a command there failed
//! as written (the receiver's `--model`, then `--workers` after `ps_train
//! worker`), found only when someone happened to run it. This test reads
//! README.md and docs/MULTIHOST.md (where README's "Across two hosts"
//! sends readers, [`DOCUMENTS`]), takes every command in them (the lines of code blocks, and the
//! `cargo run`, `bash scripts/...` and `scripts/...` spans of the prose) and
//! runs each with this build's programs, in a scratch directory per
//! section, on loopback: host addresses become 127.0.0.1, a listening port
//! a free one, and rounds, steps and sizes short ([`SHORT`]). A server and
//! the clients after it in its section (a receiver and its sender, a
//! ps_train server and its workers) run together, the clients connected to
//! the port the server says it listens on. Commands that need root or the
//! network-namespace testbed are checked by argument parsing only
//! ([`scripts::SCRIPTS`]); the Python package's commands by
//! python/tests/test_readme.py in the Python half of scripts/test.sh.
//! Flags named in the prose (`--jumbo` on both sides) must be taken by the
//! programs they are about ([`flags`]).
//!
//! It prints one line per command saying what it did (see it with
//! `cargo test --test readme_commands -- --nocapture`), and fails naming
//! every line (document and line number) that did not run, with the end
//! of its output.

#[path = "readme_commands/extract.rs"]
mod extract;
#[path = "readme_commands/flags.rs"]
mod flags;
#[path = "readme_commands/process.rs"]
mod process;
#[path = "readme_commands/scripts.rs"]
mod scripts;

use extract::{Kind, Snippet};
use process::Running;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The documents whose commands are checked: README, and the walkthrough
/// across hosts it leaves the detail to (the Rust sender and receiver, the
/// parameter server, the torchrun job).
const DOCUMENTS: &[(&str, &str)] = &[
    ("README.md", include_str!("../../README.md")),
    ("docs/MULTIHOST.md", include_str!("../../docs/MULTIHOST.md")),
];

/// A command's limit: generous for a loaded 2-core machine and a debug
/// build; a hang ends here as a failure naming the line.
const RUN_LIMIT: Duration = Duration::from_secs(90);
/// How long a server may take to say where it listens.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// Flags that keep a run short, per program (and subcommand): README's
/// value is replaced, or the flag added. Rounds, steps and sizes (and for
/// round_bench one loss rate and one controller instead of 3 x 2, which
/// alone take 50 s in a debug build); everything else runs as written.
const SHORT: &[(&str, &[(&str, &str)])] = &[
    ("receiver", &[("--rounds", "2")]),
    ("sender", &[("--rounds", "2")]),
    (
        "ps_train worker",
        &[("--steps", "5"), ("--compute-ms", "0")],
    ),
    (
        "round_bench",
        &[
            ("--rounds", "1"),
            ("--losses", "0.05"),
            ("--controllers", "capped-bbr"),
            ("--model", "tiny"),
        ],
    ),
    ("codec_table", &[("--values", "200000"), ("--reps", "1")]),
    ("ps_sim", &[("--max-pushes", "4000")]),
    ("scripts/demo.sh", &[("--rounds", "2")]),
];

/// README's placeholders and what the check puts in their place (a
/// command with several values runs once for each).
const PLACEHOLDERS: &[(&str, &[&str])] = &[
    // "on each worker host (`I` = 0, 1, 2)"
    ("I", &["0", "1", "2"]),
    ("COMMAND", &["true"]),
];

/// Where the Python package's commands are checked.
const PYTHON_HALF: &str = "checked by python/tests/test_readme.py and \
     test_two_host_walkthrough.py (the Python half of scripts/test.sh)";

/// How a command line is shown in the report.
fn command_line(program: &str, args: &[String]) -> String {
    let mut words = vec![program.to_string()];
    words.extend(args.iter().cloned());
    format!("`{}`", words.join(" "))
}

/// One of tools' programs, with the subcommand its arguments start with.
#[derive(Debug, Clone, PartialEq)]
struct Program {
    bin: String,
    sub: Option<String>,
}

impl Program {
    fn new(bin: &str, args: &[String]) -> Self {
        let sub = args.first().filter(|a| !a.starts_with('-')).cloned();
        Self {
            bin: bin.to_string(),
            sub,
        }
    }

    fn name(&self) -> String {
        match &self.sub {
            Some(sub) => format!("{} {sub}", self.bin),
            None => self.bin.clone(),
        }
    }

    /// Its arguments before any flag: the subcommand.
    fn prefix(&self) -> Vec<String> {
        self.sub.iter().cloned().collect()
    }
}

/// What the check does with one README command.
#[derive(Debug, Clone)]
enum Plan {
    /// Run a program with these arguments.
    Run { program: Program, args: Vec<String> },
    /// `--help` of every program (`--bin NAME`).
    HelpOfEvery,
    /// A script under scripts/; `mention` when the prose only names it.
    Script {
        path: String,
        args: Vec<String>,
        mention: bool,
    },
    /// Flags named in the prose.
    Flags(Vec<String>),
    /// A file of the Python examples, named in the prose.
    PythonExample,
    /// Checked elsewhere, or not run, and why.
    Elsewhere(&'static str),
}

/// A README command and what the check makes of it (an error if it cannot
/// tell what the command is).
struct Item {
    snippet: Snippet,
    plan: Result<Plan, String>,
}

/// What became of a command, and what was done or went wrong.
enum Outcome {
    /// It ran, on loopback.
    Ran(String),
    /// Only its arguments were checked (it needs root, or is a flag named
    /// in prose).
    Parsed(String),
    /// Checked elsewhere, or not a command to run here.
    Elsewhere(String),
    Failed(String),
}

/// The programs of tools and where this build put them.
struct Build {
    dir: PathBuf,
    bins: Vec<String>,
}

impl Build {
    fn find() -> Self {
        let dir = Path::new(env!("CARGO_BIN_EXE_certs"))
            .parent()
            .expect("a binary lives in a directory")
            .to_path_buf();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
        let mut bins: Vec<String> = std::fs::read_dir(&src)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", src.display()))
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                // A program is src/bin/NAME.rs or src/bin/NAME/main.rs.
                match name.strip_suffix(".rs") {
                    Some(stem) => Some(stem.to_string()),
                    None => e.path().join("main.rs").is_file().then_some(name),
                }
            })
            .collect();
        bins.sort();
        Self { dir, bins }
    }

    fn path(&self, bin: &str) -> Result<PathBuf, String> {
        if !self.bins.iter().any(|b| b == bin) {
            return Err(format!(
                "tools has no program {bin:?} (it has {})",
                self.bins.join(", ")
            ));
        }
        let path = self.dir.join(bin);
        if path.exists() {
            Ok(path)
        } else {
            Err(format!("{} was not built", path.display()))
        }
    }

    /// The program's output for `args`, within the run limit.
    fn run(&self, program: &Program, args: &[String], dir: &Path) -> Result<Running, String> {
        let mut command = Command::new(self.path(&program.bin)?);
        command.args(args).current_dir(dir);
        let mut running = Running::spawn(&mut command)?;
        match running.finish(RUN_LIMIT) {
            Ok(()) => Ok(running),
            Err(e) => Err(format!(
                "{} {e}:\n{}",
                command_line(&program.bin, args),
                running.tail()
            )),
        }
    }
}

#[test]
fn readme_commands_run_as_written() {
    let started = Instant::now();
    let build = Build::find();
    let work = std::env::temp_dir().join(format!("gradlane-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let mut failures = Vec::new();
    let mut tally = Tally::default();
    for (name, text) in DOCUMENTS {
        // A scratch directory per document, so that sections of the same
        // name in two documents do not share one.
        let doc_work = work.join(name.replace(['/', '.'], "-"));
        check_document(name, text, &build, &doc_work, &mut tally, &mut failures);
    }
    let Tally {
        ran,
        parsed,
        elsewhere,
    } = tally;
    println!(
        "\n{} commands of {}: {ran} ran, {parsed} checked by argument parsing only, \
         {elsewhere} checked elsewhere or not run (each says why), {} failed; {:.1} s",
        ran + parsed + elsewhere + failures.len(),
        DOCUMENTS
            .iter()
            .map(|d| d.0)
            .collect::<Vec<_>>()
            .join(" and "),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&work);
    }
    assert!(
        failures.is_empty(),
        "{} command(s) did not run as written (their scratch directories are under {}):\n\n{}",
        failures.len(),
        work.display(),
        failures.join("\n")
    );
}

/// How many commands were run, parsed, or left to another check.
#[derive(Default)]
struct Tally {
    ran: usize,
    parsed: usize,
    elsewhere: usize,
}

/// Runs the commands of the document `name`, printing a line for each and
/// adding those that failed to `failures`.
fn check_document(
    name: &str,
    text: &str,
    build: &Build,
    work: &Path,
    tally: &mut Tally,
    failures: &mut Vec<String>,
) {
    let items = items(extract::snippets(text), build);
    let mut outcomes: BTreeMap<usize, Outcome> = BTreeMap::new();
    for step in steps(&items) {
        match step {
            Step::One(i) => {
                let outcome = run_one(&items, i, build, work);
                outcomes.insert(i, outcome);
            }
            Step::Pair(server, clients) => {
                for (i, outcome) in run_pair(&items, server, &clients, build, work) {
                    outcomes.insert(i, outcome);
                }
            }
        }
    }
    for (i, outcome) in &outcomes {
        let s = &items[*i].snippet;
        // A block of code shows its first line.
        let text = match s.text.split_once('\n') {
            Some((first, rest)) => format!("{first} ... ({} lines)", rest.lines().count() + 1),
            None => s.text.clone(),
        };
        let head = format!("{name}:{}: {text}", s.line);
        let what = match outcome {
            Outcome::Ran(what) => {
                tally.ran += 1;
                format!("ran {what}")
            }
            Outcome::Parsed(what) => {
                tally.parsed += 1;
                format!("arguments only: {what}")
            }
            Outcome::Elsewhere(what) => {
                tally.elsewhere += 1;
                what.clone()
            }
            Outcome::Failed(why) => {
                failures.push(format!("{head}\n    {why}"));
                format!("FAILED: {why}")
            }
        };
        println!("{head}\n    {what}");
    }
}

// ------------------------------------------------------------ reading README

/// README's commands, with a prose `cargo run ... --` span joined to the
/// argument spans that follow it in its paragraph ("`cargo run --bin
/// ps_train --` with `server --algo ormo` on one host, and `worker ...`").
fn items(snippets: Vec<Snippet>, build: &Build) -> Vec<Item> {
    let mut items = Vec::new();
    // A `cargo run ... --` span waiting for argument spans, and whether
    // one came.
    let mut prefix: Option<(Snippet, bool)> = None;
    for s in snippets {
        if let Some((p, joined)) = &mut prefix {
            if p.paragraph == s.paragraph && s.kind == Kind::Span && is_argument_list(&s.text) {
                *joined = true;
                let text = format!("{} {}", p.text, s.text);
                push_item(&mut items, Snippet { text, ..s }, build);
                continue;
            }
            if p.paragraph != s.paragraph {
                if let Some((p, false)) = prefix.take() {
                    push_item(&mut items, p, build);
                }
            }
        }
        if s.kind == Kind::Span && s.text.starts_with("cargo run ") && s.text.ends_with(" --") {
            if let Some((p, false)) = prefix.take() {
                push_item(&mut items, p, build);
            }
            prefix = Some((s, false));
            continue;
        }
        push_item(&mut items, s, build);
    }
    if let Some((p, false)) = prefix {
        push_item(&mut items, p, build);
    }
    items
}

fn push_item(items: &mut Vec<Item>, snippet: Snippet, build: &Build) {
    let plan = match plan(&snippet, build) {
        Ok(None) => return,
        Ok(Some(plan)) => Ok(plan),
        Err(e) => Err(e),
    };
    items.push(Item { snippet, plan });
}

/// `server --algo ormo`: a subcommand and its flags.
fn is_argument_list(text: &str) -> bool {
    let mut words = text.split(' ');
    let first_is_word = words.next().is_some_and(|w| {
        w.starts_with(|c: char| c.is_ascii_lowercase())
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '-')
    });
    first_is_word && words.next().is_some_and(|w| w.starts_with("--"))
}

/// Words that start a command a user types.
const COMMAND_WORDS: [&str; 10] = [
    "cargo", "bash", "sudo", "pip", "python", "python3", "torchrun", "export", "ping", "scp",
];

/// Whether a code span in prose is a command (or flags, or a script or
/// example named) rather than a name in the text (`loss_tolerance`).
fn is_command_span(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    COMMAND_WORDS.contains(&first)
        || is_assignment(first)
        || first.starts_with("--")
        || (first.starts_with("scripts/") && first.ends_with(".sh"))
        || (first.starts_with("examples/") && first.ends_with(".py"))
}

/// What the check does with a snippet: `Ok(None)` for a code span that is
/// no command, an error for a code line it cannot run.
fn plan(s: &Snippet, build: &Build) -> Result<Option<Plan>, String> {
    match &s.kind {
        Kind::Fenced(lang) if lang == "python" => return Ok(Some(Plan::Elsewhere(PYTHON_HALF))),
        Kind::Fenced(_) => return Ok(Some(Plan::Elsewhere("code, not a command"))),
        Kind::Span if !is_command_span(&s.text) => return Ok(None),
        _ => {}
    }
    let is_span = s.kind == Kind::Span;
    let words = extract::words(&with_placeholders_filled(&s.text)?)?;
    let mut rest: &[String] = &words;
    // Environment assignments and sudo before the command.
    while rest.first().is_some_and(|w| is_assignment(w)) {
        rest = &rest[1..];
    }
    if rest.first().is_some_and(|w| w == "sudo") {
        rest = &rest[1..];
        while rest.first().is_some_and(|w| w.starts_with('-')) {
            rest = &rest[1..];
        }
    }
    let Some(first) = rest.first() else {
        return Err("no command after the environment and sudo".into());
    };
    let plan = match first.as_str() {
        "cargo" => cargo_plan(&rest[1..], build)?,
        "bash" => match rest.get(1) {
            Some(path) => Plan::Script {
                path: path.clone(),
                args: rest[2..].to_vec(),
                mention: false,
            },
            None => return Err("`bash` without a script".into()),
        },
        w if w.starts_with("scripts/") && w.ends_with(".sh") => Plan::Script {
            path: w.to_string(),
            args: rest[1..].to_vec(),
            mention: is_span && rest.len() == 1,
        },
        w if w.starts_with("examples/") && w.ends_with(".py") => Plan::PythonExample,
        "pip" | "python" | "python3" | "torchrun" | "export" => Plan::Elsewhere(PYTHON_HALF),
        "ping" => Plan::Elsewhere("not run: a system tool, and its address is another host's"),
        "scp" => Plan::Elsewhere("not run: it copies to another host"),
        w if is_span && w.starts_with("--") => Plan::Flags(rest.to_vec()),
        w => {
            return Err(format!(
            "the check does not know how to run `{w}`: teach it (tools/tests/readme_commands.rs)"
        ))
        }
    };
    Ok(Some(plan))
}

/// `NAME=value`, as before a command.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// `<...>` placeholders replaced by their value (they hold blanks, so
/// before the words are split).
fn with_placeholders_filled(text: &str) -> Result<String, String> {
    let mut out = text.to_string();
    while let Some(start) = out.find('<') {
        let Some(len) = out[start..].find('>') else {
            break;
        };
        let end = start + len + 1;
        let value = PLACEHOLDERS
            .iter()
            .find(|(p, _)| *p == &out[start..end])
            .map(|(_, v)| v[0])
            .ok_or_else(|| {
                format!(
                    "placeholder {} is not in the check's PLACEHOLDERS",
                    &out[start..end]
                )
            })?;
        out.replace_range(start..end, value);
    }
    Ok(out)
}

fn cargo_plan(words: &[String], build: &Build) -> Result<Plan, String> {
    match words.first().map(String::as_str) {
        Some("run") => {}
        Some("doc") => return Ok(Plan::Elsewhere(
            "not run: .ci/run builds the same docs (`cargo doc --no-deps`); --open needs a browser",
        )),
        other => {
            return Err(format!(
                "the check does not run `cargo {}`",
                other.unwrap_or("")
            ))
        }
    }
    let mut bin = None;
    let mut i = 1;
    while i < words.len() {
        match words[i].as_str() {
            "--release" | "--quiet" | "-q" => i += 1,
            "--bin" => {
                bin = words.get(i + 1).cloned();
                i += 2;
            }
            "--" => break,
            other => {
                return Err(format!(
                    "cargo run option {other}: the check knows --release, --quiet and --bin"
                ))
            }
        }
    }
    let args: Vec<String> = words.get(i + 1..).unwrap_or_default().to_vec();
    let bin = bin.ok_or("`cargo run` without `--bin`: which program?")?;
    if bin == "NAME" {
        return if args == ["--help"] {
            Ok(Plan::HelpOfEvery)
        } else {
            Err("`--bin NAME` is checked with `-- --help` only".into())
        };
    }
    build.path(&bin)?;
    Ok(Plan::Run {
        program: Program::new(&bin, &args),
        args,
    })
}

// ------------------------------------------------------------ ordering

enum Step {
    One(usize),
    /// A server and the clients after it in its section.
    Pair(usize, Vec<usize>),
}

fn is_server(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--listen" || a.starts_with("--listen="))
}

fn is_client(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--connect" || a.starts_with("--connect="))
}

/// The command's program and arguments, if it runs one of tools'.
fn run_of(item: &Item) -> Option<(&Program, &[String])> {
    match &item.plan {
        Ok(Plan::Run { program, args }) => Some((program, args)),
        _ => None,
    }
}

/// The commands in README order, a server grouped with its clients (the
/// clients that follow it in its section, before the next server).
fn steps(items: &[Item]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut open: Option<(usize, Vec<usize>)> = None;
    for (i, item) in items.iter().enumerate() {
        let args = run_of(item).map(|(_, a)| a);
        if let Some((server, clients)) = &mut open {
            let same_section = items[*server].snippet.section == item.snippet.section;
            if same_section && args.is_some_and(is_client) {
                clients.push(i);
                continue;
            }
            // Flags in the prose are parsed alone: they do not end a pair.
            if same_section && matches!(item.plan, Ok(Plan::Flags(_))) {
                steps.push(Step::One(i));
                continue;
            }
            if let Some((server, clients)) = open.take() {
                steps.push(Step::Pair(server, clients));
            }
        }
        if args.is_some_and(is_server) {
            open = Some((i, Vec::new()));
        } else {
            steps.push(Step::One(i));
        }
    }
    if let Some((server, clients)) = open {
        steps.push(Step::Pair(server, clients));
    }
    steps
}

// ------------------------------------------------------------ running

/// A section's scratch directory (made on first use): its commands share
/// it, as in a user's shell (certs/ made by one, read by the next).
fn section_dir(work: &Path, section: &str) -> Result<PathBuf, String> {
    let slug: String = section
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let dir = work.join(if slug.is_empty() { "top" } else { &slug });
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    Ok(dir)
}

fn run_one(items: &[Item], i: usize, build: &Build, work: &Path) -> Outcome {
    let item = &items[i];
    let result = match &item.plan {
        Err(e) => Err(e.clone()),
        Ok(plan) => section_dir(work, &item.snippet.section)
            .and_then(|dir| run_plan(items, i, plan, build, &dir)),
    };
    result.unwrap_or_else(Outcome::Failed)
}

fn run_plan(
    items: &[Item],
    i: usize,
    plan: &Plan,
    build: &Build,
    dir: &Path,
) -> Result<Outcome, String> {
    match plan {
        Plan::Run { program, args } => {
            let mut done = Vec::new();
            for args in expanded(&on_loopback(args))? {
                let args = shortened(program, args);
                let t = Instant::now();
                build.run(program, &args, dir)?;
                done.push(format!(
                    "{} ({:.1} s)",
                    command_line(&program.bin, &args),
                    t.elapsed().as_secs_f64()
                ));
            }
            Ok(Outcome::Ran(done.join(", ")))
        }
        Plan::HelpOfEvery => {
            for bin in &build.bins {
                build.run(&Program::new(bin, &[]), &["--help".to_string()], dir)?;
            }
            Ok(Outcome::Ran(format!(
                "`--help` of each of {}",
                build.bins.join(", ")
            )))
        }
        Plan::Script {
            path,
            args,
            mention,
        } => scripts::run_script(path, args, *mention, build, dir),
        Plan::Flags(words) => flags::check_flags(items, i, words, build, dir),
        Plan::PythonExample => Ok(Outcome::Elsewhere(PYTHON_HALF.to_string())),
        Plan::Elsewhere(why) => Ok(Outcome::Elsewhere(why.to_string())),
    }
}

/// Runs a server, then its clients at once against the address it says it
/// listens on; each line's outcome.
fn run_pair(
    items: &[Item],
    server: usize,
    clients: &[usize],
    build: &Build,
    work: &Path,
) -> Vec<(usize, Outcome)> {
    let mut outcomes = Vec::new();
    let server_failed = |mut outcomes: Vec<(usize, Outcome)>, why: String| {
        outcomes.push((server, Outcome::Failed(why)));
        for &c in clients {
            outcomes.push((
                c,
                Outcome::Failed("not run: its server did not start".into()),
            ));
        }
        outcomes
    };
    let Some((program, server_args)) = run_of(&items[server]) else {
        return server_failed(outcomes, "not a program to run".into());
    };
    let started = (|| -> Result<_, String> {
        let dir = section_dir(work, &items[server].snippet.section)?;
        let args = shortened(
            program,
            with_value(&on_loopback(server_args), "--listen", "127.0.0.1:0"),
        );
        let mut command = Command::new(build.path(&program.bin)?);
        command.args(&args).current_dir(&dir);
        Ok((dir, args, Running::spawn(&mut command)?))
    })();
    let (dir, args, mut running) = match started {
        Ok(started) => started,
        Err(e) => return server_failed(outcomes, e),
    };
    let shown = command_line(&program.bin, &args);
    let addr = match running.wait_for(
        "a line saying where it listens",
        READY_LIMIT,
        listening_address,
    ) {
        Ok(addr) => addr,
        Err(e) => return server_failed(outcomes, format!("{shown} {e}:\n{}", running.tail())),
    };
    let t = Instant::now();

    // Every client instance at once: a synchronous server waits for all.
    let mut instances: Vec<(usize, String, Result<Running, String>)> = Vec::new();
    for &c in clients {
        let Some((program, args)) = run_of(&items[c]) else {
            continue;
        };
        let expansions = match expanded(&on_loopback(args)) {
            Ok(e) => e,
            Err(e) => {
                instances.push((c, String::new(), Err(e)));
                continue;
            }
        };
        for args in expansions {
            let args = shortened(program, with_value(&args, "--connect", &addr.to_string()));
            let shown = command_line(&program.bin, &args);
            let running = build
                .path(&program.bin)
                .and_then(|path| Running::spawn(Command::new(path).args(&args).current_dir(&dir)));
            instances.push((c, shown, running));
        }
    }
    let mut client_results: BTreeMap<usize, Result<Vec<String>, String>> = BTreeMap::new();
    for (c, shown, running) in &mut instances {
        let result = match running {
            Ok(r) => r
                .finish(RUN_LIMIT)
                .map(|()| shown.clone())
                .map_err(|e| format!("{shown} {e}:\n{}", r.tail())),
            Err(e) => Err(e.clone()),
        };
        let entry = client_results.entry(*c).or_insert(Ok(Vec::new()));
        match (entry.as_mut(), result) {
            (Ok(done), Ok(shown)) => done.push(shown),
            (Ok(_), Err(e)) => *entry = Err(e),
            (Err(_), _) => {}
        }
    }
    // A server whose clients failed may wait for them for ever: it is
    // stopped, and judged by what it did until then (it listened).
    let server_outcome = if client_results.values().any(Result::is_err) {
        drop(running);
        Outcome::Ran(format!(
            "{shown}: it listened on {addr}; stopped when a client below failed"
        ))
    } else {
        match running.finish(RUN_LIMIT) {
            Ok(()) => Outcome::Ran(format!(
                "{shown} on {addr}, with its clients below ({:.1} s)",
                t.elapsed().as_secs_f64()
            )),
            Err(e) => Outcome::Failed(format!("{shown} {e}:\n{}", running.tail())),
        }
    };
    outcomes.push((server, server_outcome));
    for (c, result) in client_results {
        outcomes.push((
            c,
            match result {
                Ok(done) => Outcome::Ran(format!("{} against the server above", done.join(", "))),
                Err(e) => Outcome::Failed(e),
            },
        ));
    }
    outcomes
}

/// The address in a line such as `receiver: listening on 127.0.0.1:4433`
/// or `listening 127.0.0.1:4433`.
fn listening_address(line: &str) -> Option<SocketAddr> {
    if !line.contains("listening") {
        return None;
    }
    line.split_whitespace().last()?.parse().ok()
}

/// Host addresses of other machines (`10.0.0.2`, `0.0.0.0:4433`) made
/// 127.0.0.1: the check never sends to anything but loopback.
fn on_loopback(args: &[String]) -> Vec<String> {
    args.iter()
        .map(|a| {
            let (host, port) = match a.rsplit_once(':') {
                Some((h, p)) if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) => {
                    (h, Some(p))
                }
                _ => (a.as_str(), None),
            };
            match host.parse::<Ipv4Addr>() {
                Ok(ip) if !ip.is_loopback() => match port {
                    Some(p) => format!("127.0.0.1:{p}"),
                    None => "127.0.0.1".to_string(),
                },
                _ => a.clone(),
            }
        })
        .collect()
}

/// `args` with `flag`'s value set to `value` (added if missing).
fn with_value(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut set = false;
    let mut i = 0;
    while i < args.len() {
        if args[i] == flag {
            out.extend([flag.to_string(), value.to_string()]);
            set = true;
            i += 2;
        } else if args[i].starts_with(&format!("{flag}=")) {
            out.push(format!("{flag}={value}"));
            set = true;
            i += 1;
        } else {
            out.push(args[i].clone());
            i += 1;
        }
    }
    if !set {
        out.extend([flag.to_string(), value.to_string()]);
    }
    out
}

/// `args` with the [`SHORT`] limits of `name`.
fn with_short_limits(name: &str, args: Vec<String>) -> Vec<String> {
    SHORT
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(&[][..], |(_, limits)| limits)
        .iter()
        .fold(args, |args, (flag, value)| with_value(&args, flag, value))
}

fn shortened(program: &Program, args: Vec<String>) -> Vec<String> {
    with_short_limits(&program.name(), args)
}

/// One argument list per value of the placeholders in `args` (`I` runs
/// once per worker); an error for a placeholder the check does not know.
fn expanded(args: &[String]) -> Result<Vec<Vec<String>>, String> {
    let mut lists = vec![Vec::new()];
    for a in args {
        let is_placeholder = !a.is_empty() && a.chars().all(|c| c.is_ascii_uppercase());
        let values: Vec<String> = if is_placeholder {
            PLACEHOLDERS
                .iter()
                .find(|(p, _)| p == a)
                .map(|(_, v)| v.iter().map(|s| s.to_string()).collect())
                .ok_or_else(|| format!("placeholder {a} is not in the check's PLACEHOLDERS"))?
        } else {
            vec![a.clone()]
        };
        lists = lists
            .into_iter()
            .flat_map(|l| {
                values.iter().map(move |v| {
                    let mut l = l.clone();
                    l.push(v.clone());
                    l
                })
            })
            .collect();
    }
    Ok(lists)
}
