"""Tables with aligned columns (for the terminal and for Markdown), the machine a run happened
on, and recording a run into a Markdown file."""

from __future__ import annotations

import os
import platform
import subprocess
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # One letter per column, "l" or "r"; default: first column left, the others right.
    align: str = ""
    # Wrap the last column's text at this width in the terminal rendering (0: never).
    wrap_last: int = 0

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def _aligns(self) -> str:
        return self.align or "l" + "r" * (len(self.columns) - 1)

    def render(self) -> str:
        rows: list[list[str]] = []
        for row in self.rows:
            pieces = textwrap.wrap(row[-1], self.wrap_last) if self.wrap_last else [row[-1]]
            rows.append([*row[:-1], pieces[0] if pieces else ""])
            rows += [[""] * (len(row) - 1) + [piece] for piece in pieces[1:]]
        widths = [len(c) for c in self.columns]
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        aligns = self._aligns()

        def line(cells: list[str]) -> str:
            return "  ".join(
                cell.ljust(w) if a == "l" else cell.rjust(w)
                for cell, w, a in zip(cells, widths, aligns, strict=True)
            ).rstrip()

        out = [self.title, line(self.columns), "  ".join("-" * w for w in widths)]
        out += [line(row) for row in rows]
        out += [f"  * {note}" for note in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        aligns = self._aligns()
        out = [f"#### {self.title}", ""]
        out.append("| " + " | ".join(self.columns) + " |")
        out.append("|" + "|".join("---:" if a == "r" else "---" for a in aligns) + "|")
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        if self.notes:
            out.append("")
            out += [f"- {note}" for note in self.notes]
        return "\n".join(out)


def _first_line(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return ((result.stdout or result.stderr).strip().splitlines() or ["unknown"])[0]


def machine_table() -> Table:
    """The machine: cores, memory, kernel, Slurm and OpenSSH versions, load at this moment."""
    with open("/proc/meminfo") as handle:
        mem_kb = next(int(line.split()[1]) for line in handle if line.startswith("MemTotal:"))
    cpu_model = "unknown"
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    table = Table("Machine", ["what", "value"], align="ll")
    table.add("date (UTC)", datetime.now(UTC).strftime("%Y-%m-%d %H:%M"))
    table.add("nproc", _first_line(["nproc"]))
    table.add("CPU", cpu_model)
    table.add("memory", f"{mem_kb / 1024 / 1024:.1f} GiB")
    table.add("kernel", f"{platform.system()} {platform.release()}")
    table.add("OS", _first_line(["bash", "-c", ". /etc/os-release && echo $PRETTY_NAME"]))
    table.add("Python", platform.python_version())
    table.add("Slurm", _first_line(["sbatch", "--version"]))
    table.add("OpenSSH", _first_line(["ssh", "-V"]))
    table.add("PostgreSQL", _first_line(["psql", "--version"]))
    table.add("Redis", _first_line(["redis-server", "--version"]))
    table.add("load average (1, 5, 15 min)", load)
    return table


def write_section(path: Path, marker: str, text: str) -> None:
    """Replace what follows ``marker`` in ``path`` (up to the next marker) with ``text``."""
    tag = f"<!-- {marker} -->"
    content = path.read_text() if path.exists() else ""
    if tag not in content:
        content = content.rstrip("\n") + f"\n\n{tag}\n"
    head, _, rest = content.partition(tag)
    following = rest.find("<!-- recorded")
    tail = rest[following:] if following >= 0 else ""
    body = f"{tag}\n\n{text.strip()}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + body + (f"\n{tail}" if tail else ""))
