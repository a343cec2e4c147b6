"""The docs say what the code does: every gpuvs command in a README or docs shell block parses with gpuvs's own
parser, every relative link and heading it points to exists, and every page keeps its size and short sentences."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import prose as prose_check
import pytest

from gpuvs.cli import commands, parser
from gpuvs.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *DOCS]
SHELL = ("bash", "sh", "shell", "console")
# a synopsis, not a command: [optional] parts, a|b choices, a WORKLOAD or experiments/X.yaml placeholder
SYNOPSIS = re.compile(r"\[-|\w\|\w|\bWORKLOAD\b|/X\.yaml")
CUT = ("|", "&&", ";", ">", "2>&1", "&")  # where the shell ends gpuvs's words


def shell_lines(path: Path):
    """(line number, command) for each command in the page's shell blocks, continuation lines joined."""
    in_block, shell, joined, first = False, False, "", None
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block, shell = not in_block, line[3:].strip() in SHELL
            continue
        if not (in_block and shell):
            continue
        first = first or i
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        yield first, (joined + line).strip().removeprefix("$ ")
        joined, first = "", None


def gpuvs_commands():
    for page in PAGES:
        for line, text in shell_lines(page):
            if text.startswith(("gpuvs ", "kubectl gpuvs ")) and not SYNOPSIS.search(text):
                yield pytest.param(text, id=f"{page.name}:{line}")


def parse(words: list[str]) -> None:
    """What `gpuvs WORDS` does before it runs anything: find the command, parse and check its options."""
    path, cmd, rest = "gpuvs", None, words
    while cmd is None or cmd.subcommands:
        if cmd is not None and cmd.run is not None and not (rest and cmd.subcommand(rest[0])):
            break
        if not rest or rest[0] in (*parser.HELP, parser.HELP_ALL):
            return
        found = commands.get(rest[0]) if cmd is None else cmd.subcommand(rest[0])
        if found is None:
            raise UsageError(f"no such command {rest[0]!r}")
        cmd, path, rest = found, f"{path} {rest[0]}", rest[1:]
    try:
        parser.parse(cmd, rest, path)
    except parser.HelpWanted:
        pass


@pytest.mark.parametrize("text", list(gpuvs_commands()))
def test_every_documented_command_parses(text, monkeypatch):
    monkeypatch.chdir(ROOT)  # experiment files are named from the checkout's root
    words = shlex.split(text, comments=True)
    for stop in CUT:
        words = words[:words.index(stop)] if stop in words else words
    try:
        parse(words[2:] if words[0] == "kubectl" else words[1:])
    except UsageError as exc:
        pytest.fail(f"{text}\n  gpuvs says: {exc}", pytrace=False)


def test_the_command_list_is_not_empty():
    assert len(list(gpuvs_commands())) > 80  # a block syntax change that hid them all would pass the test above


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs make it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def without_blocks(path: Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)


def prose(path: Path) -> str:
    """The page without its code blocks and code spans, where a `](x)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", without_blocks(path))


def test_every_relative_link_and_heading_exists():
    bad, seen = [], 0
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            seen += 1
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif fragment and file.suffix == ".md":
                headings = {slug(h) for h in re.findall(r"^#+\s+(.*)$", without_blocks(file), re.M)}
                if fragment not in headings:
                    bad.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert seen > 50 and bad == [], bad


@pytest.mark.parametrize("name, limit", [("README.md", 12_000), ("BENCHMARKS.md", 20_000)])
def test_the_readme_and_the_benchmarks_keep_their_size(name, limit):
    assert (ROOT / name).stat().st_size <= limit  # issue 47: read in ten minutes; history lives in git


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_a_page_is_5_to_15_kb(page):
    size = page.stat().st_size
    assert 5_000 <= size <= 15_000, f"{page.name}: {size:,} B (a page by task is 5-15 KB: split it or merge it)"


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_sentence_runs_over_25_words(page):
    over = prose_check.long_sentences(page.read_text())
    assert over == [], "\n".join(f"[{prose_check.words(x)} words] {x}" for x in over)


def test_the_sentence_counter_splits_sentences_and_skips_code():
    text = "# A heading of many words that are not a sentence at all\n\nOne two three. Four five, e.g. six!\n\n" \
           "```bash\n" + "word " * 40 + "\n```\n\n| " + "cell " * 40 + "|\n\n- " + "item " * 26 + "\n"
    assert [prose_check.words(x) for x in prose_check.sentences(text)] == [3, 4, 26]
    assert len(prose_check.long_sentences(text)) == 1
