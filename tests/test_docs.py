"""The documentation: the site builds strictly, its command reference names every option of every command, every
`modelshrink …` command line in README.md and docs/ parses against the real command line, and every Python block
in docs/ runs or says why it does not.

How a command line is read (docs/contributing/index.md says the same to writers):

- fenced blocks marked bash, sh, shell or console, and inline code that starts with `modelshrink `;
- lines ending in a backslash continue; `#` starts a comment; a heredoc's body is not shell; a command ends at
  `|`, `>`, `;`, `&&` or the `)` closing its `$(`;
- a command is `modelshrink …`, `… -m modelshrink …` (accelerate launch, torchrun, python) or
  `python -m modelshrink.runtime …` (which is `modelshrink run`);
- `$name`, `${name}`, `$(…)` and an upper-case word (`COMMAND`, `RUN_FOLDER`) are placeholders: a number where the
  option takes one, a path otherwise (in the command's place, any command);
- `...` (or `…`) stands for arguments left out: such a line, one with `--config` (a recipe supplies the rest) and
  inline code are checked for unknown commands and options, option values and extra arguments; a complete line is
  parsed as the command parses it and then builds its options object, so ranges and the rules between options
  (`--top-p` needs `--do-sample`, …) hold for it too.

Nothing runs: parsing is enough, and takes a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer.main

from modelshrink.cli import app
from modelshrink.commands._from_options import OPTIONS_OF, build_options

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
PLACEHOLDER = re.compile(r"\$(\w+|\{\w+\}|\()|^[A-Z][A-Z_]*$")  # $train, ${D}, $(...); COMMAND, RUN_FOLDER
ELLIPSIS = {"...", "…"}
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*\Z", re.S)


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------- reading command lines out of Markdown


def _strip_comment(line: str) -> str:
    """The line up to an unquoted `#` that starts a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _shell_lines(block: str) -> list[str]:
    """Logical lines of a shell block: continuations joined, comments and heredoc bodies dropped."""
    lines, heredoc, pending = [], None, ""
    for raw in block.splitlines():
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        marker = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", raw)
        if marker:
            heredoc = marker[1]
        line = _strip_comment(raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


START = re.compile(r"(?:(?<=^)|(?<=[\s(;&|]))modelshrink(\.runtime)?(?=\s|$)")


def _command_text(line: str, start: int) -> str:
    """From `start` to where the shell command ends (an unquoted |, >, ;, &&, or the `)` of its `$(`)."""
    quote, depth = None, 0
    for i in range(start, len(line)):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif line.startswith("$(", i):
            depth += 1
        elif ch == ")":
            if depth == 0:
                return line[start:i]
            depth -= 1
        elif ch in "|>;<" or line.startswith("&&", i) or (ch == "&" and depth == 0):
            return line[start:i]
    return line[start:]


def commands_in(line: str) -> list[list[str]]:
    """Every modelshrink command on a logical shell line, as argv after `modelshrink` ("run" for the runtime)."""
    found = []
    for m in START.finditer(line):
        argv = shlex.split(_command_text(line, m.start()))[1:]
        found.append(["run", *argv] if m[1] else argv)
    return found


def command_lines() -> list[tuple[str, list[str], bool]]:
    """(where, argv, inline) for every command line of README.md and docs/*.md."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for fence in FENCE.finditer(text):
            if fence[1] not in SHELL:
                continue
            lineno = text[:fence.start()].count("\n") + 2
            for line in _shell_lines(fence[2]):
                for argv in commands_in(line):
                    out.append((f"{_page_id(page)} (block at line {lineno}): modelshrink {shlex.join(argv)}",
                                argv, False))
        prose = FENCE.sub("", text)
        for span in re.findall(r"`(modelshrink [^`]+)`", prose):
            argv = shlex.split(span.replace("…", "..."))[1:]
            out.append((f"{_page_id(page)} (inline): {span}", argv, True))
    return out


# ---------------------------------------------------------------- parsing them against the real CLI


def _group():
    return typer.main.get_command(app)


def _is_placeholder(token: str) -> bool:
    return bool(PLACEHOLDER.search(token))


def _annotation(param):
    return getattr(getattr(param, "type_descriptor", None), "annotation", None)


def _numeric(param) -> bool:
    annotation = _annotation(param)
    return annotation in (int, float) or (typing.get_origin(annotation) is tuple
                                          and all(a in (int, float) for a in typing.get_args(annotation)))


def _with_values(command, argv: list[str]) -> list[str]:
    """argv with each placeholder replaced by a value its option takes (1 for a number, a path otherwise)."""
    by_flag = {o: p for p in command.params for o in [*p.opts, *p.secondary_opts] if o.startswith("-")}
    out = []
    for i, token in enumerate(argv):
        if _is_placeholder(token):
            before = by_flag.get(argv[i - 1]) if i else None
            token = "1" if before is not None and _numeric(before) else "runs/placeholder"
        out.append(token)
    return out


def _parse_loosely(command, name: str, argv: list[str], ctx_class) -> None:
    """Unknown options, missing option values, literal values of the wrong type or out of range, too many
    arguments: what a line that leaves arguments out can still be checked for."""
    from modelshrink.options import check_value

    argv = [t for t in argv if t not in ELLIPSIS]
    ctx = ctx_class(command, info_name=name)
    options, rest, _ = command.make_parser(ctx).parse_args(list(argv))
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    if not any(p.nargs == -1 for p in arguments):
        capacity = sum(p.nargs for p in arguments)
        assert len(rest) <= capacity, f"extra arguments {rest[capacity:]}"
    cls = OPTIONS_OF.get(name)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    for param in command.params:
        value = options.get(param.name)
        if value is None or param.param_type_name != "option":
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, str) and _is_placeholder(v) for v in values):
            continue
        if _numeric(param) or _annotation(param) is bool:
            value = param.get_runtime_param().coerce(value, param=param, ctx=ctx)
        if param.name in fields:
            check_value(fields[param.name], value)


def parse(argv: list[str], loose: bool) -> None:
    """Parse `modelshrink ARGV` as the real command line would, without running anything."""
    group = _group()
    if loose and argv and argv[0].startswith("-"):  # prose naming an option of `modelshrink` itself
        flags = {o for p in group.params for o in [*p.opts, *p.secondary_opts]}
        assert argv[0] in flags, f"modelshrink has no option {argv[0]}"
        return None
    ctx_class = type(group.make_context("modelshrink", ["--help"], resilient_parsing=True))
    root = ctx_class(group, info_name="modelshrink")
    root_options, rest, _ = group.make_parser(root).parse_args(list(argv))
    if not rest:  # `modelshrink --help` or `--version` (the key Click files --help under is a version's detail)
        flags = set(root.help_option_names) | {o for p in group.params if p.name == "version" for o in p.opts}
        assert set(argv) & flags, "no command"
        return None
    name, args = rest[0], rest[1:]
    if _is_placeholder(name) or name in ELLIPSIS:  # `modelshrink COMMAND --help`: any command
        return None
    assert name in group.commands, f"no command {name!r}; the commands are {', '.join(group.commands)}"
    if not args and loose:  # a command named in prose
        return None
    loose = loose or root_options.get("config") is not None
    if name == "run":
        return _parse_run(args)
    command = group.commands[name]
    loose = loose or any(t in ELLIPSIS for t in args) or any(t in ("--config", "-c", "--help", "-h") for t in args)
    if loose:
        return _parse_loosely(command, name, args, ctx_class)
    ctx = command.make_context(name, _with_values(command, args))
    cls = OPTIONS_OF.get(name)
    if cls is not None and name != "eval":  # eval builds its options from MODEL DATA | PREDICTIONS | SYSTEMS
        build_options(cls, {f.name: ctx.params[f.name] for f in dataclasses.fields(cls) if f.name in ctx.params})


def _parse_run(args: list[str]) -> None:
    """`modelshrink run` is the runtime's argparse command line; its work (run_file) is replaced by nothing."""
    from modelshrink.runtime import cli

    args = ["runs/placeholder" if _is_placeholder(t) else t for t in args if t not in ELLIPSIS]
    original, cli.run_file = cli.run_file, lambda *a, **k: iter(())
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(args, prog="modelshrink run")
    except SystemExit as e:
        code = e.code
    finally:
        cli.run_file = original
    assert code in (0, None), err.getvalue().strip()


LINES = command_lines()


def test_readme_is_short():
    """Issue 56: README is the front door (what it is, the set-up, the quickstart, the chain, links); the rest is in
    docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_pages_hold_command_lines():
    """README and the guides are read: a change to the extraction that found nothing would pass every line."""
    pages = {where.split(" ")[0] for where, _, _ in LINES}
    assert {"README.md", "docs/guides/distill.md", "docs/guides/export.md", "docs/guides/scaling-out.md"} <= pages
    assert sum(1 for _, _, inline in LINES if not inline) > 60


@pytest.mark.parametrize("where, argv, inline", LINES, ids=[f"{w.split(' ')[0]}-{i}" for i, (w, _, _) in
                                                                enumerate(LINES)])
def test_every_command_line_parses_against_the_cli(where, argv, inline):
    try:
        parse(argv, loose=inline)
    except AssertionError as e:
        pytest.fail(f"{where}\n  {e}")
    except Exception as e:  # Click's usage errors and the options' UserError alike
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        pytest.fail(f"{where}\n  {type(e).__name__}: {message}")


@pytest.mark.parametrize("line", [
    "modelshrink distill train.jsonl -o out --no-such-option 3",  # an unknown option
    "modelshrink distil train.jsonl -o out",  # an unknown command
    "modelshrink pseudolabel teacher docs.jsonl -o out --top-p 0.9",  # --top-p without --do-sample
    "modelshrink quantize model -o out --bits 8-8-8 --max-steps ten",  # a value of the wrong type
    "modelshrink export model extra -o out",  # an argument too many
    "modelshrink contrastive ... --no-such-ablation",  # an unknown option on a line with arguments left out
    "modelshrink run folder --input docs.jsonl --beams 4",  # the runtime's own options
    "accelerate launch --num_processes 2 -m modelshrink distill data -o out --precision fp64",  # a bad choice
])
def test_a_wrong_command_line_is_caught(line):
    """The check fails where a reader's command would."""
    (argv,) = commands_in(line)
    with pytest.raises(Exception):
        parse(argv, loose=False)


def test_command_lines_are_read_as_the_shell_reads_them():
    block = ("x=$(modelshrink distill $train -o runs/t \\\n    --max-steps $STEPS)   # a comment\n"
             "python - <<'PY' > r.toml\nfrom modelshrink.options import to_toml  # modelshrink distill -o x\nPY\n"
             "OMP_NUM_THREADS=1 accelerate launch --num_processes 2 -m modelshrink eval m d -o e ... --device cpu\n"
             "python -m modelshrink.runtime runs/x --input d.jsonl | head -1 && modelshrink run runs/x --input d\n")
    found = [argv for line in _shell_lines(block) for argv in commands_in(line)]
    assert found == [["distill", "$train", "-o", "runs/t", "--max-steps", "$STEPS"],
                     ["eval", "m", "d", "-o", "e", "...", "--device", "cpu"],
                     ["run", "runs/x", "--input", "d.jsonl"], ["run", "runs/x", "--input", "d"]]


# ---------------------------------------------------------------- Python blocks


def python_blocks() -> list[tuple[str, str, str | None]]:
    """(where, code, reason not run) of every Python block in docs/; README's are tests/test_api.py's."""
    out = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        for fence in FENCE.finditer(text):
            if fence[1] == "python":
                reason = NOT_RUN.search(text[:fence.start()].rstrip() + "\n")
                lineno = text[:fence.start()].count("\n") + 1
                out.append((f"{_page_id(page)}:{lineno}", fence[2], reason[1] if reason else None))
    return out


@pytest.mark.parametrize("where, code, reason", python_blocks(), ids=[w for w, _, _ in python_blocks()])
def test_every_python_block_in_the_docs_runs_or_says_why_not(where, code, reason, tmp_path, monkeypatch):
    compile(code, where, "exec")  # every block is Python, run or not
    if reason is not None:
        assert len(reason.split()) >= 3, f"{where}: say why the block is not run"
        return
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})


# ---------------------------------------------------------------- the site


def _hooks():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    return hooks


def test_the_reference_names_every_option_of_every_command():
    """docs/hooks.py's pages come from the commands themselves: every flag, and the range its opt() declares."""
    hooks = _hooks()
    group, options_of = hooks._cli()
    assert set(hooks.COMMANDS) == set(group.commands)
    for name in hooks.COMMANDS:
        if name == "run":
            page = hooks.run_page()
            assert "--input" in page and "--num-beams" in page
            continue
        page = hooks.command_page(name, group.commands[name], options_of)
        for param in group.commands[name].params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("-") and flag not in ("--help", "-h"):
                    assert f"`{flag}`" in page, (name, flag)
    distill = hooks.command_page("distill", group.commands["distill"], options_of)
    assert re.search(r"\| `--label-smoothing` \| `0\.1` \| ≥ 0, < 1 \|", distill), "default and range of an option"


def test_an_optional_choice_lists_only_the_values_the_command_takes():
    """Issue 78: a `str | None` option lists None among its choices (so that leaving it out passes the check), and
    the reference listed `None` among `--granularity`'s, which the command refuses."""
    hooks = _hooks()
    group, options_of = hooks._cli()
    from modelshrink.options import spec_of

    optional = 0
    for name, cls in options_of.items():
        page = hooks.command_page(name, group.commands[name], options_of)
        for f in dataclasses.fields(cls):
            choices = spec_of(f).choices or ()
            if None not in choices:
                continue
            optional += 1
            (row,) = [line for line in page.splitlines() if line.startswith(f"| `{_flag(f)}`")]
            listed = "one of " + ", ".join(f"`{c}`" for c in choices if c is not None)
            assert listed in row and "`None`" not in row, row
    assert optional >= 2  # quantize's --granularity and --metric when this was written
    quantize = hooks.command_page("quantize", group.commands["quantize"], options_of)
    assert re.search(r"\| `--granularity` \| – \| one of `tensor`, `row` \|", quantize)


def _flag(f) -> str:
    from modelshrink.options import flag_of

    return flag_of(f)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it, built once for the tests below."""
    for module, package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"), ("mkdocstrings", "mkdocstrings")):
        pytest.importorskip(module, reason=f"{package} is not installed (pip install -e '.[test]')")
    folder = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


def test_the_site_builds_strictly(site):
    page = (site / "reference" / "cli" / "quantize" / "index.html").read_text()
    assert "--activation-clip" in page and "Training (--method distill)" in page
    assert "DQ-BART" in (site / "results" / "reproduction" / "index.html").read_text()
    assert "overwrite" in (site / "reference" / "api" / "index.html").read_text()  # the signatures


def test_option_names_in_the_reference_never_break(site):
    """Issue 78: Material breaks inline code anywhere (`word-break: break-word`), which split option names mid-word
    in the reference's narrow first column. Every table of the command reference sits in `div.cli-options`, whose
    first column's code the site's extra stylesheet keeps whole."""
    css = (site / "stylesheets" / "extra.css").read_text()
    rule = re.search(r"\.cli-options td:first-child code\s*\{([^}]*)\}", css)
    assert rule and re.search(r"white-space:\s*nowrap", rule[1]), "the nowrap rule for option names"
    pages = sorted((site / "reference" / "cli").glob("*/index.html"))
    assert len(pages) >= 7
    tables = 0
    for page in [*pages, site / "reference" / "cli" / "index.html"]:
        html = page.read_text()
        assert "stylesheets/extra.css" in html, page
        for m in re.finditer(r"<table>", html):
            tables += 1
            assert html[:m.start()].rstrip().endswith('<div class="cli-options">'), f"{page}: a table outside it"
    assert tables > 20


# ---------------------------------------------------------------- code blocks fit the page


def _code_width() -> int:
    return _hooks().CODE_WIDTH  # derived there from Material's layout at 1,280 px


def _ci_install_line() -> str:
    """README's and CONTRIBUTING.md's install line is one line by design: CI runs that very text
    (tests/test_project.py, tests/test_contributing.py), so it is the one line allowed to be wider than the page."""
    (line,) = {line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("pip install torch==")
               and not line.endswith("-n 2")}
    return line


def _over(lines, width: int) -> list[str]:
    return [line for line in lines if len(line) > width]


def markdown_code_blocks() -> list[tuple[str, str]]:
    """(where, code) of every fenced block of the Markdown the site renders: README (its included sections),
    docs/, the root files rendered as pages, and the generated command reference."""
    hooks = _hooks()
    group, options_of = hooks._cli()
    texts = {_page_id(p): p.read_text() for p in PAGES}
    texts |= {source: (ROOT / source).read_text() for source in hooks.ROOT_PAGES if (ROOT / source).is_file()}
    texts["reference/cli/index.md (generated)"] = hooks.index_page(group)
    for name in hooks.COMMANDS:
        page = hooks.run_page() if name == "run" else hooks.command_page(name, group.commands[name], options_of)
        texts[f"reference/cli/{name}.md (generated)"] = page
    return [(f"{where}:{text[:fence.start()].count(chr(10)) + 1}", fence[2])
            for where, text in texts.items() for fence in FENCE.finditer(text)]


def test_every_code_block_fits_the_page():
    """Issue 78: code that scrolls sideways at 1,280 px is code a reader does not see. Every line of every code block
    the site renders fits CODE_WIDTH (docs/hooks.py says how it is derived), README's included ones too (the site
    shows them on the index, quickstart and From Python pages), but CI's one-line install."""
    width, install = _code_width(), _ci_install_line()
    blocks = markdown_code_blocks()
    assert len(blocks) > 60 and any(where.startswith("README.md:") for where, _ in blocks)
    wide = [f"{where}: {len(line)} characters: {line}" for where, code in blocks for line in _over(code.splitlines(), width)
            if line != install]
    assert not wide, "\n".join(wide)


_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)


def _site_code(page: Path) -> list[str]:
    import html

    return [line for block in _PRE.findall(page.read_text())
            for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines()]


def test_every_code_block_of_the_built_site_fits_the_page(site):
    """The same on the built pages, whatever made them (snippets, the hooks, the theme): a `<pre>` line wider than
    CODE_WIDTH is CI's install line. The API page's docstring examples are the next test's."""
    width, allowed = _code_width(), {_ci_install_line()}
    pages = [p for p in sorted(site.rglob("*.html")) if p.parent != site / "reference" / "api" and p.name != "404.html"]
    lines = [(page, line) for page in pages for line in _site_code(page)]
    assert len(lines) > 500
    wide = [f"{page.relative_to(site)}: {len(line)}: {line}" for page, line in lines
            if len(line) > width and line not in allowed]
    assert not wide, "\n".join(wide)


def test_the_python_api_pages_code_fits_the_page(site):
    width = _code_width()
    wide = _over(_site_code(site / "reference" / "api" / "index.html"), width)
    assert not wide, "\n".join(wide)
