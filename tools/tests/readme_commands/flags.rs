//! Flags named in README's prose (`--jumbo` on both sides): which programs
//! each is about, and whether they take it.

use super::{is_client, is_server, run_of, Build, Item, Outcome, Plan, Program, PYTHON_HALF};
use crate::extract::Kind;
use std::path::Path;

/// What a flag named in prose is about.
enum FlagTarget {
    /// Every one of these programs must take it.
    Programs(Vec<Program>),
    /// A Python example's: checked there.
    Python,
}

/// The programs a flag span in prose is about, by the first rule that
/// finds one:
/// 1. the last of tools' programs (or a Python example) named before it in
///    its paragraph;
/// 2. both ends of a server and client whose code blocks end right before
///    its paragraph ("`--jumbo` on both sides");
/// 3. the program of the code block right after its paragraph ("Start the
///    receiver (`--model` refuses ...):").
fn flag_targets(items: &[Item], i: usize) -> Result<FlagTarget, String> {
    let s = &items[i].snippet;
    let earlier_in_paragraph = items[..i]
        .iter()
        .rev()
        .take_while(|it| it.snippet.paragraph == s.paragraph)
        .find_map(|it| match &it.plan {
            Ok(Plan::Run { program, .. }) => Some(FlagTarget::Programs(vec![program.clone()])),
            Ok(Plan::PythonExample) => Some(FlagTarget::Python),
            _ => None,
        });
    if let Some(target) = earlier_in_paragraph {
        return Ok(target);
    }
    let code_in = |paragraph: usize| {
        items.iter().enumerate().filter(move |(_, it)| {
            it.snippet.paragraph == paragraph && it.snippet.kind == Kind::CodeLine
        })
    };
    if let Some(previous) = s.paragraph.checked_sub(1) {
        for (j, item) in code_in(previous) {
            let Some((client, args)) = run_of(item) else {
                continue;
            };
            if !is_client(args) {
                continue;
            }
            // Its server: the last one before it in the section.
            let server = items[..j]
                .iter()
                .rev()
                .filter(|it| it.snippet.section == s.section)
                .find_map(|it| run_of(it).filter(|(_, a)| is_server(a)));
            if let Some((server, _)) = server {
                return Ok(FlagTarget::Programs(vec![server.clone(), client.clone()]));
            }
        }
    }
    let next: Vec<Program> = code_in(s.paragraph + 1)
        .filter_map(|(_, it)| run_of(it).map(|(p, _)| p.clone()))
        .collect();
    if !next.is_empty() {
        return Ok(FlagTarget::Programs(next));
    }
    Err(format!(
        "the check cannot tell which program `{}` is about (see flag_targets)",
        s.text
    ))
}

/// A flag span checked against the programs it is about: a bare flag
/// (`--jumbo`) must be in each program's `--help`; flags with values
/// (`--loss 0.05 --delay-ms 1`) must parse (`--help` after them).
pub fn check_flags(
    items: &[Item],
    i: usize,
    words: &[String],
    build: &Build,
    dir: &Path,
) -> Result<Outcome, String> {
    let programs = match flag_targets(items, i)? {
        FlagTarget::Python => return Ok(Outcome::Elsewhere(PYTHON_HALF.to_string())),
        FlagTarget::Programs(p) => p,
    };
    let bare = words.iter().all(|w| w.starts_with("--"));
    for program in &programs {
        let mut args = program.prefix();
        if bare {
            args.push("--help".into());
            let help = build.run(program, &args, dir)?.output_text();
            if let Some(missing) = words.iter().find(|w| !names_flag(&help, w)) {
                return Err(format!(
                    "{} does not take {missing} (not in its --help)",
                    program.name()
                ));
            }
        } else {
            args.extend(words.iter().cloned());
            args.push("--help".into());
            build.run(program, &args, dir)?;
        }
    }
    let names: Vec<String> = programs.iter().map(Program::name).collect();
    Ok(Outcome::Parsed(format!(
        "a flag named in prose, taken by {}",
        names.join(" and ")
    )))
}

/// Whether `help` documents `flag` (not merely a longer flag it begins).
fn names_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        help[at + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    })
}
