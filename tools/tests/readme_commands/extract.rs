//! README.md as the pieces a user may type: the lines of code blocks and the
//! code spans of the prose, each with its line number, its section and its
//! paragraph, so that the check can name the line that failed and tell
//! which commands belong together.

/// One piece of README that may be a command.
#[derive(Debug, Clone)]
pub struct Snippet {
    /// 1-based line of README where it starts.
    pub line: usize,
    /// The `##` heading it is under.
    pub section: String,
    /// Index of its paragraph (blank-line separated block; a fenced block is
    /// one), counted over the whole file.
    pub paragraph: usize,
    /// What kind of text it is.
    pub kind: Kind,
    /// The text, with a span's line breaks made spaces.
    pub text: String,
}

/// Where a snippet stands in the Markdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// One line of an indented code block, or of a fenced block of shell
    /// (no language, `sh`, `bash`, `shell`, `console`).
    CodeLine,
    /// A whole fenced block of another language (`python`, `rust,ignore`).
    Fenced(String),
    /// A `code span` in prose (a paragraph, a list item, a table cell).
    Span,
}

/// Fence languages whose lines are shell commands.
const SHELL_FENCES: [&str; 5] = ["", "sh", "bash", "shell", "console"];

/// The snippets of `markdown`, in document order.
pub fn snippets(markdown: &str) -> Vec<Snippet> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut paragraph = 0;
    // Column where the current list item's text starts (0 outside a list):
    // a code block inside an item is indented 4 past it.
    let mut list_indent = 0;
    // Prose of the current paragraph: (line number, text).
    let mut prose: Vec<(usize, &str)> = Vec::new();
    let mut in_code_block = false;
    let mut fence: Option<(String, usize, Vec<&str>)> = None;
    let mut after_blank = true;

    for (index, raw) in markdown.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim_start();
        let indent = raw.len() - trimmed.len();
        if let Some((lang, start, body)) = fence.as_mut() {
            if trimmed.starts_with("```") {
                let lang = std::mem::take(lang);
                if SHELL_FENCES.contains(&lang.as_str()) {
                    for (i, l) in body.iter().enumerate() {
                        let l = l.trim().trim_start_matches("$ ");
                        if !l.is_empty() && !l.starts_with('#') {
                            out.push(snippet(*start + i, &section, paragraph, Kind::CodeLine, l));
                        }
                    }
                } else {
                    out.push(snippet(
                        *start,
                        &section,
                        paragraph,
                        Kind::Fenced(lang),
                        &body.join("\n"),
                    ));
                }
                fence = None;
                paragraph += 1;
                after_blank = true;
            } else {
                body.push(raw);
            }
            continue;
        }
        if trimmed.is_empty() {
            flush_prose(&mut prose, &section, paragraph, &mut out);
            if !after_blank {
                paragraph += 1;
            }
            in_code_block = false;
            after_blank = true;
            continue;
        }
        if let Some(lang) = trimmed.strip_prefix("```") {
            flush_prose(&mut prose, &section, paragraph, &mut out);
            if !after_blank {
                paragraph += 1;
            }
            fence = Some((lang.trim().to_string(), line + 1, Vec::new()));
            continue;
        }
        let starts_block = after_blank;
        after_blank = false;
        if starts_block {
            if let Some(text_column) = list_item_text_column(raw) {
                list_indent = text_column;
            } else if indent == 0 {
                list_indent = 0;
            }
            in_code_block = indent >= list_indent + 4;
        }
        if in_code_block {
            out.push(snippet(
                line,
                &section,
                paragraph,
                Kind::CodeLine,
                raw.trim(),
            ));
            continue;
        }
        if let Some(title) = trimmed.strip_prefix('#') {
            flush_prose(&mut prose, &section, paragraph, &mut out);
            section = title.trim_start_matches('#').trim().to_string();
            paragraph += 1;
            after_blank = true;
            continue;
        }
        prose.push((line, raw));
    }
    flush_prose(&mut prose, &section, paragraph, &mut out);
    out
}

fn snippet(line: usize, section: &str, paragraph: usize, kind: Kind, text: &str) -> Snippet {
    Snippet {
        line,
        section: section.to_string(),
        paragraph,
        kind,
        text: text.to_string(),
    }
}

/// The column where a list item's text starts, if `raw` opens one
/// (`- `, `* `, `1. `).
fn list_item_text_column(raw: &str) -> Option<usize> {
    let trimmed = raw.trim_start();
    let indent = raw.len() - trimmed.len();
    let marker = if trimmed.starts_with("- ") || trimmed.starts_with("* ") {
        1
    } else {
        let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 || !trimmed[digits..].starts_with(". ") {
            return None;
        }
        digits + 1
    };
    let spaces = trimmed[marker..].len() - trimmed[marker..].trim_start().len();
    Some(indent + marker + spaces)
}

/// The code spans of a paragraph's lines; a span may run across a line
/// break, which becomes a space.
fn flush_prose(
    prose: &mut Vec<(usize, &str)>,
    section: &str,
    paragraph: usize,
    out: &mut Vec<Snippet>,
) {
    // (line number, character) over the whole paragraph, breaks as '\n'.
    let chars: Vec<(usize, char)> = prose
        .iter()
        .flat_map(|(line, text)| text.chars().chain(['\n']).map(move |c| (*line, c)))
        .collect();
    prose.clear();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1 != '`' {
            i += 1;
            continue;
        }
        let ticks = chars[i..].iter().take_while(|c| c.1 == '`').count();
        let start = i + ticks;
        // The span closes at the next run of exactly as many backticks.
        let mut j = start;
        let mut close = None;
        while j < chars.len() {
            if chars[j].1 == '`' {
                let run = chars[j..].iter().take_while(|c| c.1 == '`').count();
                if run == ticks {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        let Some(end) = close else {
            // An unmatched run is literal text.
            i = start;
            continue;
        };
        let text: String = chars[start..end]
            .iter()
            .map(|c| if c.1 == '\n' { ' ' } else { c.1 })
            .collect();
        let line = chars.get(start).map_or(chars[i].0, |c| c.0);
        out.push(snippet(line, section, paragraph, Kind::Span, text.trim()));
        i = end + ticks;
    }
}

/// Splits a command line into words as a POSIX shell does for the plain
/// commands README holds: blanks separate, '...' and "..." quote, a
/// backslash escapes the next character outside single quotes. No
/// expansion, no operators.
pub fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(format!("unterminated ' in {line:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => word.push(c),
                            None => return Err(format!("trailing \\ in {line:?}")),
                        },
                        Some(c) => word.push(c),
                        None => return Err(format!("unterminated \" in {line:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err(format!("trailing \\ in {line:?}")),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_blocks_spans_and_their_lines() {
        let md = "\
# t

## A

Run:

    bash scripts/demo.sh

1. Make them:

       cargo run --bin certs -- --san 10.0.0.2

2. Start (`--model` refuses):

A span `cargo run --bin x --`
across lines, then `server --y 1`.

```python
import x
```

```
echo hi
```
";
        let s = snippets(md);
        let got: Vec<(usize, &str, &Kind)> = s
            .iter()
            .map(|s| (s.line, s.text.as_str(), &s.kind))
            .collect();
        assert_eq!(
            got,
            [
                (7, "bash scripts/demo.sh", &Kind::CodeLine),
                (
                    11,
                    "cargo run --bin certs -- --san 10.0.0.2",
                    &Kind::CodeLine
                ),
                (13, "--model", &Kind::Span),
                (15, "cargo run --bin x --", &Kind::Span),
                (16, "server --y 1", &Kind::Span),
                (19, "import x", &Kind::Fenced("python".into())),
                (23, "echo hi", &Kind::CodeLine),
            ]
        );
        assert!(s.iter().all(|s| s.section == "A"));
        assert_eq!(s[3].paragraph, s[4].paragraph);
        assert!(s[2].paragraph < s[3].paragraph);
    }

    #[test]
    fn splits_words_like_a_shell() {
        assert_eq!(
            words(r#"pip install "./python[torch]" a\ b 'c d'"#).unwrap(),
            ["pip", "install", "./python[torch]", "a b", "c d"]
        );
        assert!(words("echo 'open").is_err());
    }
}
