//! The tip added to clap's error for an option given to a role that does
//! not take it, naming the role that does: the roles share many flag names
//! but not all.

use clap::CommandFactory;
use std::ffi::OsString;

use crate::Cli;

/// The roles' flag names, for [`with_placement_tip`]: `None` is the
/// loopback comparison (no subcommand).
pub(crate) fn roles_and_flags() -> Vec<(Option<String>, Vec<String>)> {
    let cli = Cli::command();
    let longs = |c: &clap::Command| -> Vec<String> {
        c.get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    };
    let mut roles = vec![(None, longs(&cli))];
    for sub in cli.get_subcommands() {
        roles.push((Some(sub.get_name().to_string()), longs(sub)));
    }
    roles
}

/// How a role is named in a tip.
pub(crate) fn role_name(role: Option<&str>) -> String {
    match role {
        Some(r) => format!("`ps_train {r}`"),
        None => "`ps_train` without a subcommand (the loopback comparison)".to_string(),
    }
}

/// clap's error for a flag in `args` given where ps_train does not take it,
/// with a tip naming where it goes. The roles share many flag names but not
/// all (`--algo` is the server's, `--id` a worker's), and clap alone only
/// says that the flag is unexpected there.
pub(crate) fn with_placement_tip(mut e: clap::Error, args: &[OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let first_string = |v: Option<&ContextValue>| match v {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(s)) => s.first().cloned(),
        _ => None,
    };
    let roles = roles_and_flags();
    let takes = |role: Option<&str>, flag: &str| {
        roles
            .iter()
            .any(|(r, flags)| r.as_deref() == role && flags.iter().any(|f| f == flag))
    };
    let tip = match e.kind() {
        // A flag after a subcommand that does not take it, or a role's flag
        // with no subcommand.
        ErrorKind::UnknownArgument => {
            let Some(given) = first_string(e.get(ContextKind::InvalidArg)) else {
                return e;
            };
            let flag = given.split('=').next().unwrap_or(&given).to_string();
            let subcommands: Vec<&str> = roles.iter().filter_map(|(r, _)| r.as_deref()).collect();
            let role = args
                .iter()
                .skip(1)
                .map(|a| a.to_string_lossy())
                .find(|a| subcommands.contains(&a.as_ref()))
                .map(|a| a.into_owned());
            let owners: Vec<String> = roles
                .iter()
                .filter(|(r, flags)| *r != role && flags.contains(&flag))
                .map(|(r, _)| role_name(r.as_deref()))
                .collect();
            if owners.is_empty() {
                return e;
            }
            format!(
                "{flag} is an option of {}, not of {}",
                owners.join(" and of "),
                role_name(role.as_deref())
            )
        }
        // A flag of the loopback comparison before a subcommand.
        ErrorKind::ArgumentConflict => {
            let (Some(role), Some(given)) = (
                first_string(e.get(ContextKind::InvalidSubcommand)),
                first_string(e.get(ContextKind::PriorArg)),
            ) else {
                return e;
            };
            let flag = given.split(' ').next().unwrap_or(&given).to_string();
            if takes(Some(&role), &flag) {
                format!(
                    "put {flag} after `{role}`: options before a subcommand are those of {}",
                    role_name(None)
                )
            } else {
                format!(
                    "{flag} is an option of {} only; {} does not take it",
                    role_name(None),
                    role_name(Some(&role))
                )
            }
        }
        _ => return e,
    };
    let mut tips = match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(s)) => s.clone(),
        _ => Vec::new(),
    };
    tips.push(tip.into());
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    e
}
