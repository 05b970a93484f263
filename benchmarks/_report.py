"""Writing a benchmark's table into BENCHMARKS.md between its own markers (rerunning replaces it)."""

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def write_section(name: str, title: str, text: str, intro: str = "") -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    current = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in current:
        before, rest = current.split(begin, 1)
        current = before + block + rest.split(end, 1)[1]
    else:
        current = current.rstrip() + f"\n\n## {title}\n\n" + (intro + "\n\n" if intro else "") + block + "\n"
    BENCHMARKS.write_text(current)


def publish(name: str, title: str, text: str, write: bool = True, intro: str = "") -> None:
    """Print a benchmark's table, and put it into BENCHMARKS.md unless the run says not to."""
    print(text)
    if write:
        write_section(name, title, text, intro)
