"""README's figures are docs/RESULTS.md's: every number in README's
headline table, and in every README sentence that names a RESULTS
section, appears as written in that section.

README carries a figure in two ways. A headline-table row names its
section in its last column, as a link to the heading's anchor; every
number of its "what" and "figure" cells must be in that section. A
sentence elsewhere ends its figures with "(RESULTS: <heading>)"; every
number between the start of its paragraph (or list item), or the end of
the previous such note, and the note must be in that section. A section
runs from its heading to the next heading of the same or a higher level,
its subsections included.

A number is written as in the documents: digits with an optional
decimal part and thousands commas, an optional range ("1.54-1.66x"),
and an optional "x" or "%". Digits inside a name (ResNet-18, bf16,
tail1.5, H100, a commit hash) are not numbers. "As written" means the
same token: 83.1 is not 83, and 1.873 not 1.87. So a README number that
is edited, or a section that is renamed or loses the figure, fails here
with the README line and what is missing.

Pure Python: no gradlane import, no torch.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "RESULTS.md"

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
NUMBERS = re.compile(rf"(?<![\w.\-]){_NUMBER}(?:-{_NUMBER})?[x%]?(?![\w.]\d|\w)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *$")
LINK = re.compile(r"^\[([^\]]+)\]\(docs/RESULTS\.md#([^)\s]+)\)$")
NOTE = "RESULTS: "
# The headline table and the figure sentences hold at least this many
# figures: fewer means the check no longer finds them (a changed form).
LEAST_ROWS = 10
LEAST_NOTES = 4


def numbers(text):
    """The numbers written in `text`, in order."""
    return NUMBERS.findall(text)


def github_anchor(heading):
    """The anchor GitHub gives `heading`: lower case, punctuation but
    hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def results_sections():
    """{heading: the section's text, heading line included} of RESULTS."""
    lines = RESULTS.read_text().splitlines()
    heads, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            heads.append((i, len(m.group(1)), m.group(2)))
    sections = {}
    for k, (start, level, title) in enumerate(heads):
        end = next((i for i, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        assert title not in sections, f"RESULTS has two sections headed {title!r}"
        sections[title] = "\n".join(lines[start:end])
    return sections


def readme_lines():
    """(line number, text) of README, fenced blocks left out."""
    kept, fenced = [], False
    for i, line in enumerate(README.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append((i, line))
    return kept


def headline_rows():
    """(line number, what, figure, RESULTS cell) of README's headline
    table: the table under "## Headline figures"."""
    rows, inside = [], False
    for number, line in readme_lines():
        if line.startswith("## "):
            inside = line.strip() == "## Headline figures"
        elif inside and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "what" or set(cells[0]) <= {"-", ":"}:
                continue
            assert len(cells) == 4, f"README.md:{number}: a headline row of {len(cells)} cells, not 4"
            rows.append((number, cells[0], cells[1], cells[3]))
    return rows


def blocks():
    """(first line number, text with whitespace collapsed) of README's
    paragraphs and list items outside tables, code and headings."""
    found, current, start = [], [], None

    def flush():
        if current:
            found.append((start, " ".join(" ".join(current).split())))
        current.clear()

    for number, line in readme_lines():
        stripped = line.strip()
        if (
            not stripped
            or stripped.startswith(("|", "#", "!["))
            or line.startswith("    ")
        ):
            flush()
            continue
        if re.match(r"(?:[-*]|\d+\.) ", stripped):
            flush()
        if not current:
            start = number
        current.append(stripped)
    flush()
    return found


def noted_figures(sections):
    """(README line, the figure text, heading named or None) for each
    "RESULTS: <heading>)" note in README's prose; None where no RESULTS
    heading and its closing bracket follow the note's start."""
    headings = sorted(sections, key=len, reverse=True)
    found = []
    for number, text in blocks():
        begin = 0
        while (at := text.find(NOTE, begin)) >= 0:
            after = text[at + len(NOTE) :]
            named = next((h for h in headings if after.startswith(h + ")")), None)
            found.append((number, text[begin:at], named))
            begin = at + len(NOTE) + (len(named) if named else 0)
    return found


def missing(text, section):
    """The numbers of `text` that `section` does not have as written."""
    have = set(numbers(section))
    return [n for n in numbers(text) if n not in have]


def test_numbers_are_read_as_written():
    """What counts as a number, so that a figure cannot slip by as a name
    or be matched by a rounder one."""
    assert numbers("83.1 / 120.3 / 26.1 ms; 1.47 / 1.00 / 0.39") == [
        "83.1", "120.3", "26.1", "1.47", "1.00", "0.39",
    ]
    assert numbers("1.54-1.66x; 11.80%, 9.7 (8-11), 1,000,000 runs.") == [
        "1.54-1.66x", "11.80%", "9.7", "8-11", "1,000,000",
    ]
    assert numbers("ResNet-18 bf16+log8 tail1.5 H100 build 24c43de 4-rank") == ["4"]
    assert "83" not in numbers("83.1 ms") and "1.87" not in numbers("1.873")
    assert github_anchor("Rounds behind a 1 Gbit/s bottleneck") == "rounds-behind-a-1-gbits-bottleneck"
    assert (
        github_anchor("The race on a GPU host (NVIDIA H100 80GB HBM3)")
        == "the-race-on-a-gpu-host-nvidia-h100-80gb-hbm3"
    )


def test_every_headline_row_is_in_the_results_section_it_names():
    sections = results_sections()
    by_anchor = {github_anchor(h): h for h in sections}
    rows = headline_rows()
    assert len(rows) >= LEAST_ROWS, f"README's headline table has {len(rows)} rows: did its form change?"
    failures = []
    for number, what, figure, cell in rows:
        link = LINK.match(cell)
        if not link:
            failures.append(f"README.md:{number}: no [heading](docs/RESULTS.md#anchor) in {cell!r}")
            continue
        text, anchor = link.groups()
        heading = by_anchor.get(anchor)
        if heading is None:
            failures.append(f"README.md:{number}: RESULTS has no section #{anchor}")
            continue
        if text != heading:
            failures.append(f"README.md:{number}: the link says {text!r}, the section is {heading!r}")
        gone = missing(f"{what} {figure}", sections[heading])
        if gone:
            failures.append(f"README.md:{number}: RESULTS, {heading!r}, lacks {gone}")
    assert not failures, "\n".join(failures)


def test_every_figure_sentence_is_in_the_results_section_it_names():
    sections = results_sections()
    notes = noted_figures(sections)
    assert len(notes) >= LEAST_NOTES, f"README has {len(notes)} RESULTS notes: did their form change?"
    failures = []
    for number, text, heading in notes:
        if heading is None:
            failures.append(f"README.md:{number}: a {NOTE!r} note names no RESULTS heading")
            continue
        if not numbers(text):
            failures.append(f"README.md:{number}: the note for {heading!r} follows no figure")
        gone = missing(text, sections[heading])
        if gone:
            failures.append(f"README.md:{number}: RESULTS, {heading!r}, lacks {gone}")
    assert not failures, "\n".join(failures)
