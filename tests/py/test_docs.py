"""The repository's documents stay true to the code and to each other:

- docs/design.md's "Source folders" table has one row per src/ folder (and none for a folder that is gone), and
  every src/ path it names exists;
- no comment or text in the tree cites a document outside the repository (the old DESIGN.md, "spec §N",
  shared/spec/...) — everything the code relies on is in docs/;
- every citation of a repository document (docs/X.md, docs/X.md §anchor, docs/X.md "Section") names a file that
  exists and a section that is a heading of it; links and § references inside docs/ resolve the same way.

A section's anchor is its heading as GitHub slugs it ("## Engine contract" -> engine-contract); citations compare
case-insensitively (docs/model.md §MLA)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Where comments and notes live; data folders (fixtures, models) are skipped except their README files.
SCANNED = ["src", "tests", "bench", "tools", "scripts", "fuzz", "cmake"]
TOP_FILES = ["README.md", "CMakeLists.txt", "CMakePresets.json"]
DATA_DIRS = {"tests/golden", "tests/models", "tests/data"}
TEXT_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc", ".py", ".md", ".txt", ".cmake", ".sh", ".json",
                 ".toml", ".cfg", ".in", ""}


def scanned_files():
    files = [ROOT / f for f in TOP_FILES if (ROOT / f).exists()]
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            if not p.is_file() or "__pycache__" in p.parts:
                continue
            rel = p.relative_to(ROOT).as_posix()
            if any(rel.startswith(d + "/") for d in DATA_DIRS) and p.name != "README.md":
                continue
            if p.suffix not in TEXT_SUFFIXES or p.stat().st_size > 2_000_000:
                continue
            files.append(p)
    return files


def read(p):
    return p.read_text(encoding="utf-8", errors="replace")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(doc):
    """Heading slugs of a markdown file (fenced code blocks skipped)."""
    out, fenced = [], False
    for line in read(doc).splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            out.append(slug(m.group(2)))
    return out


def src_folders():
    """Every folder under src/ that holds files itself (src/kernels holds only folders)."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*")
                  if p.is_dir() and any(c.is_file() for c in p.iterdir()))


def folder_table():
    """Rows of design.md's "Source folders" table: {folder: (what, main files)}."""
    text = read(DOCS / "design.md")
    m = re.search(r"^## Source folders\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "docs/design.md has no '## Source folders' section"
    rows = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 3 and cells[0].startswith("`src/"):
            folder = cells[0].strip("`").rstrip("/")
            assert folder not in rows, f"design.md: two rows for {folder}"
            rows[folder] = (cells[1], cells[2])
    return rows


def test_every_src_folder_has_a_row_in_design_md():
    rows = folder_table()
    missing = [f for f in src_folders() if f not in rows]
    assert not missing, f"docs/design.md 'Source folders' has no row for {missing}"
    stale = [f for f in rows if not (ROOT / f).is_dir()]
    assert not stale, f"docs/design.md 'Source folders' lists folders that do not exist: {stale}"
    for folder, (what, main) in rows.items():
        assert what, f"design.md: the row of {folder} says nothing"
        names = re.findall(r"`([^`]+)`", main)
        assert names, f"design.md: the row of {folder} names no main file"
        for n in names:
            assert (ROOT / folder / n).is_file(), f"design.md: {folder}/{n} (main files of {folder}) does not exist"


def test_paths_named_in_design_md_exist():
    text = read(DOCS / "design.md")
    bad = []
    for path in sorted(set(re.findall(r"(?<![\w/.])((?:src|tests|tools|scripts|bench|cmake|fuzz)/[\w./-]*[\w/])",
                                      text))):
        if "*" in path or "<" in path:
            continue
        if not (ROOT / path).exists():
            bad.append(path)
    assert not bad, f"docs/design.md names paths that do not exist: {bad}"
    assert "being written" not in text


# Citations of documents that are not in the repository.
OUTSIDE = [
    (re.compile(r"\bDESIGN(?:\.md)?\b"), "the old DESIGN.md (use docs/design.md)"),
    (re.compile(r"shared/(?:spec|DESIGN|reference)"), "a shared/ document"),
    (re.compile(r"(?<![\w/])spec/[\w-]+\.md"), "a spec/ document"),
    (re.compile(r"\bspec(?:'s)?\s+(?:§|\d|[\w-]+\.md\b|section\b)", re.I), "the old spec"),
    (re.compile(r"\btokenizer-and-chat\.md\b"), "the old spec"),
    (re.compile(r"§\s*\d"), "a numbered section of the old spec (cite docs/X.md §anchor)"),
]
DOC_NAMES = r"(?:model|quantization|api|cuda|tokenizer|design|fidelity|multi-host)\.md"
BARE_DOC = re.compile(r"(?<![\w/.-])" + DOC_NAMES + r"\b")
CITE = re.compile(r"docs/([\w.-]+\.md)((?:(?:,\s*|\s+|\s+and\s+|\s*/\s*)§[\w-]+)*)")
QUOTED = re.compile(r"docs/([\w.-]+\.md),?\s+\"([^\"]+)\"")


def test_no_comment_cites_a_document_outside_the_repository():
    bad = []
    for p in scanned_files():
        if p.resolve() == Path(__file__).resolve():
            continue
        rel = p.relative_to(ROOT).as_posix()
        for i, line in enumerate(read(p).splitlines(), 1):
            for rx, what in OUTSIDE:
                if rx.search(line):
                    bad.append(f"{rel}:{i}: cites {what}: {line.strip()[:140]}")
            if BARE_DOC.search(line) and p.suffix != ".md":
                bad.append(f"{rel}:{i}: names a document without its docs/ path: {line.strip()[:140]}")
    assert not bad, "\n".join(bad)


def test_citations_of_repository_documents_resolve():
    cache = {}

    def heads(name):
        if name not in cache:
            cache[name] = anchors(DOCS / name) if (DOCS / name).is_file() else None
        return cache[name]

    bad = []
    for p in scanned_files():
        if p.resolve() == Path(__file__).resolve():
            continue
        rel = p.relative_to(ROOT).as_posix()
        text = read(p)
        for i, line in enumerate(text.splitlines(), 1):
            rest = line
            for m in CITE.finditer(line):
                name = m.group(1)
                if heads(name) is None:
                    bad.append(f"{rel}:{i}: docs/{name} does not exist")
                    continue
                for a in re.findall(r"§([\w-]+)", m.group(2)):
                    if a.lower() not in heads(name):
                        bad.append(f"{rel}:{i}: docs/{name} has no section §{a}")
                rest = rest.replace(m.group(0), "")
            for m in QUOTED.finditer(line):
                if heads(m.group(1)) is not None and slug(m.group(2)) not in heads(m.group(1)):
                    bad.append(f"{rel}:{i}: docs/{m.group(1)} has no section \"{m.group(2)}\"")
            if "§" in rest:
                bad.append(f"{rel}:{i}: a § reference without its document (docs/X.md §anchor): {line.strip()[:140]}")
    assert not bad, "\n".join(bad)


def test_references_inside_docs_resolve():
    bad = []
    for doc in sorted(DOCS.glob("*.md")):
        own = anchors(doc)
        assert len(own) == len(set(own)), f"{doc.name}: two headings with the same anchor"
        text = read(doc)
        for i, line in enumerate(text.splitlines(), 1):
            for m in re.finditer(r"\]\(([\w./-]*\.md)?(?:#([\w-]+))?\)", line):
                target, anchor = m.group(1), m.group(2)
                if target:
                    path = (doc.parent / target).resolve()
                    if not path.is_file():
                        bad.append(f"{doc.name}:{i}: link to {target}, which does not exist")
                        continue
                    if anchor and path.suffix == ".md" and path.parent == DOCS and anchor not in anchors(path):
                        bad.append(f"{doc.name}:{i}: {target} has no section #{anchor}")
                elif anchor and anchor not in own:
                    bad.append(f"{doc.name}:{i}: no section #{anchor} in this file")
            for m in re.finditer(r"(?:(?<![\w.-])(?:docs/)?(" + DOC_NAMES + r"),?\s)?§([\w-]+)", line):
                name = m.group(1) or doc.name
                target = DOCS / name
                if not target.is_file() or m.group(2).lower() not in anchors(target):
                    bad.append(f"{doc.name}:{i}: §{m.group(2)} is not a section of {name}")
    assert not bad, "\n".join(bad)
