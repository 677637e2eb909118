"""Refresh the tables embedded in a Markdown document from the tables `geolens table` and
spectral.py wrote, so that the document shows what results/ holds.

A block in the document

    <!-- table: results/tables/table1.md | lr 0.0006 -->
    ...
    <!-- /table -->

is replaced by the header of that Markdown table and its rows containing "lr 0.0006" (every row
when nothing follows the path). Paths are relative to the repository root.

    python analyses/reproduction/embed_tables.py docs/reproduction.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from geolens.runs.storage import atomic_write_bytes

ROOT = Path(__file__).resolve().parent.parent.parent
BLOCK = re.compile(r"(<!-- table: (?P<path>[^|>]+?)(?: \| (?P<filter>[^>]*?))? -->\n)(?P<body>.*?)(?P<end><!-- /table -->)", re.S)


def table_rows(path: Path, keep: str | None) -> str:
    """The Markdown table in `path`: its header and separator, then the rows containing `keep`."""
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist; build it first (geolens table / spectral.py)")
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    if len(lines) < 2:
        raise SystemExit(f"error: {path} holds no Markdown table")
    rows = [line for line in lines[2:] if keep is None or keep in line]
    return "\n".join(lines[:2] + rows) + "\n"


def embed(text: str, root: Path = ROOT) -> tuple[str, int]:
    """`text` with every table block refreshed, and how many blocks there were."""
    count = 0

    def refresh(m: re.Match) -> str:
        nonlocal count
        count += 1
        return m.group(1) + table_rows(root / m.group("path").strip(), m.group("filter")) + m.group("end")

    return BLOCK.sub(refresh, text), count


def main(doc: str) -> None:
    path = Path(doc)
    text, count = embed(path.read_text())
    if count == 0:
        raise SystemExit(f"error: {path} has no '<!-- table: PATH -->' block")
    atomic_write_bytes(path, text.encode())
    print(f"{path}: {count} table(s) refreshed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
