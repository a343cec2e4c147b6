"""Sentence lengths of a Markdown page's prose (not its code, tables or headings), for tests/project/test_docs.py.

Run `python tests/prose.py FILE...` to see each page's size, median sentence and the sentences over 25 words.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

LONGEST = 25  # words in a sentence (issue 47; the anchors write 10-23)
# a sentence ends at . ! ? followed by a space or the end; "e.g." and "i.e." and a number like 1.5 do not end one
_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\betc)[.!?](?=\s|$)")


def prose(text: str) -> list[str]:
    """The page's prose paragraphs (list items one each), without code blocks, tables, headings or HTML."""
    out, para, fenced = [], [], False

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```") or s.startswith("~~~"):
            fenced = not fenced
            flush()
            continue
        if fenced or line.startswith("    ") and not para:
            continue
        if not s or s.startswith(("#", "|", "<", "!!!", "---")):
            flush()
            continue
        if re.match(r"([-*+]|\d+\.)\s", s):  # a list item starts its own paragraph
            flush()
            s = re.sub(r"^([-*+]|\d+\.)\s+", "", s)
        para.append(s)
    flush()
    return out


def sentences(text: str) -> list[str]:
    """Each sentence of the prose, with inline code, links' targets and emphasis taken out."""
    got = []
    for para in prose(text):
        para = re.sub(r"`[^`]*`", "CODE", para)  # a command or name counts as one word
        para = re.sub(r"\]\([^)]*\)", "]", para)
        para = re.sub(r"[*_\[\]]", "", para)
        got += [s.strip() for s in _END.split(para) if s.strip()]
    return got


def words(sentence: str) -> int:
    return len(sentence.split())


def long_sentences(text: str, longest: int = LONGEST) -> list[str]:
    return [s for s in sentences(text) if words(s) > longest]


def median_words(text: str) -> float:
    n = [words(s) for s in sentences(text)]
    return statistics.median(n) if n else 0.0


if __name__ == "__main__":
    for name in sys.argv[1:]:
        text = Path(name).read_text()
        over = long_sentences(text)
        print(f"{name}: {len(text.encode()):,} B, {len(sentences(text))} sentences, median {median_words(text):g} "
              f"words, {len(over)} over {LONGEST}")
        for s in over:
            print(f"  [{words(s)}] {s}")
