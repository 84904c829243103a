"""The README and ``docs/`` cite only files that are in the repository (issue 12, build
item 8: no ``DESIGN.md`` or ``papers/…`` outside the repo; paths spelled in full)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a repository path in prose: a top-level directory of ours, then path characters;
#: a ``{`` right after it makes it a family (``docs/results/x_{a,b}.json``).
_PATH = re.compile(r"(?<![\w/.-])((?:docs|infra|tests|shared|services|protos)/[\w./-]*)(\{?)")


def _cited(text: str) -> list[tuple[str, bool]]:
    return [(m.group(1).rstrip(".,:;"), bool(m.group(2))) for m in _PATH.finditer(text)]


def _exists(path: str, family: bool) -> bool:
    if family:  # some file starts with the spelled prefix
        parent, _, stem = path.rpartition("/")
        return any(p.name.startswith(stem) for p in (ROOT / parent).glob("*"))
    return (ROOT / path.rstrip("/")).exists()


def _docs() -> list[Path]:
    """The README, the user guide (``docs/``) and the lab notebooks (``docs/lab/``)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "docs" / "lab").glob("*.md"))]


def test_readme_and_docs_cite_only_files_in_the_repo() -> None:
    docs = _docs()
    missing = [f"{d.relative_to(ROOT)}: {p}" for d in docs
               for p, family in _cited(d.read_text()) if not _exists(p, family)]
    assert missing == []


def test_no_doc_points_outside_the_repo_for_the_design_or_the_papers() -> None:
    for d in _docs():
        text = "\n".join(line for line in d.read_text().splitlines()
                         if not line.startswith("<!--"))  # design.md's provenance note
        assert "DESIGN.md" not in text, d
        assert not re.search(r"(?<![\w/])papers/", text), d


def test_a_missing_path_is_caught() -> None:
    assert not _exists("docs/no-such-file.md", False)
    assert _exists("docs/results/ascendra_2l1h_9rps_", True)
    assert _cited("see `docs/design.md`.") == [("docs/design.md", False)]


_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)")


def test_relative_links_resolve_from_where_each_doc_sits() -> None:
    """A Markdown link or image relative to its doc (``](../results/x.png)``) names a file,
    so a doc moved into ``docs/lab/`` keeps its pictures (issue 32)."""
    broken = [f"{d.relative_to(ROOT)}: {m.group(1)}" for d in _docs()
              for m in _LINK.finditer(d.read_text()) if not (d.parent / m.group(1)).exists()]
    assert broken == []
