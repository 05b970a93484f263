"""CONTRIBUTING.md stays true: its set-up command is CI's, and its architecture map names every module of the
package and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "modelshrink"
TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
MODULE = re.compile(r"(?<![\w/.`])(\w+\.py)\b")


def test_the_set_up_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install = [line for line in ci if line.startswith("pip install torch==")]
    assert len(install) == 2 and install[1] == f"{install[0]} && python -m pytest -q -n 2"
    assert f"```bash\n{install[0]}\npython -m pytest -q -n 2\n```" in TEXT


def map_entries() -> dict[str, str]:
    """{entry of src/modelshrink/ (a module or a folder/): the text of its lines} from the map's code block: an entry
    is indented two spaces, everything indented deeper below it is its text."""
    block = TEXT[TEXT.index("```\nsrc/modelshrink/\n") + 4:]
    lines = block[:block.index("```")].splitlines()[1:]
    entries: dict[str, str] = {}
    name = None
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:  # tests/, benchmarks/, ...: past the package
            break
        if indent == 2:
            name = line.split()[0]
            entries[name] = line
        else:
            entries[name] += "\n" + line
    return entries


def test_the_architecture_map_names_every_module_and_only_those():
    entries = map_entries()
    modules = {p.name for p in PACKAGE.glob("*.py")}
    folders = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    listed = set(entries)
    assert not (modules | folders) - listed, (
        f"CONTRIBUTING.md's architecture map lacks {sorted((modules | folders) - listed)}: add a line each")
    gone = {name for name in listed if not (PACKAGE / name.split("/")[0]).exists()}
    assert not gone, f"CONTRIBUTING.md's architecture map names {sorted(gone)}, which src/modelshrink has no more"
    for folder in sorted(folders):
        named = set(MODULE.findall(entries[folder]))
        inside = {p.name for p in (PACKAGE / folder).rglob("*.py")}  # a folder inside names its own
        assert not (inside - {"__init__.py"}) - named, (
            f"CONTRIBUTING.md's map of {folder} lacks {sorted(inside - {'__init__.py'} - named)}")
        assert not named - inside, f"CONTRIBUTING.md's map of {folder} names {sorted(named - inside)}, not there"
