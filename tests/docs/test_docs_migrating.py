"""docs/migrating.md must not drift from opforge: its snippets run, and every opforge name,
argument, environment variable and command it mentions exists.

The guide marks code blocks with an HTML comment on the line just before the fence:

* ``<!-- test: file PATH -->``: the block is written to PATH in a work directory that all the
  runnable snippets share (a C++ source, or a module such as ``mypkg/kernels.py``);
* ``<!-- test: run -->``: the python block runs in a fresh interpreter in that directory, on the
  session's shared build cache (``shared_cache``), so its compile happens once per session;
* ``<!-- test: run, warm -->``: it then runs again with the compiler hidden (``CXX`` pointing
  nowhere) and process creation disabled: the guide says a warm load needs neither.

The other blocks are checked statically: python blocks must parse; ``opforge.<name>`` chains
(in any code block or inline code span) and ``import``/``from opforge... import`` must resolve;
classes derived from opforge's may only set attributes and override methods that opforge's
class has, and a ``platform`` parameter's attributes must exist on ``opforge.platform.Platform``;
calls of opforge callables (functions, classes, a loader's methods) must bind to their
signatures; every ``OPFORGE_*`` variable must be read somewhere in opforge; every ``opforge``
command line in a bash block must parse with opforge's CLI parser.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import os
import re
import shlex
from dataclasses import dataclass

import pytest
from conftest import ROOT, has_cxx, run_python

DOC = os.path.join(ROOT, "docs", "migrating.md")

#: Subcommands the guide documents before they land (``opforge bench`` is being written): lines
#: that use one are skipped while the CLI lacks it, and parsed in full once it has it.
PENDING_COMMANDS = {"bench"}

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")
OPFORGE_DOTTED = re.compile(r"(?<![\w.])opforge(?:\.[A-Za-z_]\w*)+(?![\w/-])")
ENV_VAR = re.compile(r"\bOPFORGE_[A-Z0-9_]+\b")
INLINE_CODE = re.compile(r"`([^`\n]+)`")

# The warm run: a process started by opforge (ninja, the compiler, a probe) fails the snippet.
NO_PROCESSES = """\
import os as _os, subprocess as _subprocess
def _no_process(*args, **kwargs):
    raise AssertionError("a warm load started a process")
_subprocess.Popen = _subprocess.run = _os.fork = _os.posix_spawn = _os.execv = _no_process
"""


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    """1-based line of the opening fence."""
    marker: str
    """The text of ``<!-- test: ... -->`` on the line before the fence, or ''."""

    @property
    def action(self) -> str:
        return self.marker.split(",")[0].split()[0] if self.marker else ""

    @property
    def flags(self) -> set[str]:
        return {f.strip() for f in self.marker.split(",")[1:]}


def read_doc() -> tuple[str, list[Block], list[str]]:
    """The guide's text, its fenced blocks, and the problems with its markers."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if MARKER.match(lines[i].strip()) and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                problems.append(f"line {i + 1}: a test marker must be on the line just before a code fence")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            problems.append(f"line {i + 1}: unclosed code fence")
            break
        prev = MARKER.match(lines[i - 1].strip()) if i else None
        blocks.append(Block(m.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1, prev.group(1) if prev else ""))
        i = end + 1
    return text, blocks, problems


TEXT, BLOCKS, MARKER_PROBLEMS = read_doc()
RUNS = [b for b in BLOCKS if b.action == "run"]
FILES = [b for b in BLOCKS if b.action == "file"]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def prose_spans() -> list[str]:
    """Inline code spans outside the fenced blocks."""
    lines = TEXT.splitlines()
    inside = set()
    for b in BLOCKS:
        inside.update(range(b.line - 1, b.line + b.code.count("\n") + 1))
    prose = "\n".join(ln for k, ln in enumerate(lines) if k not in inside)
    return INLINE_CODE.findall(prose)


# -- the markers ---------------------------------------------------------------------------


def test_markers_are_well_formed():
    assert not MARKER_PROBLEMS, MARKER_PROBLEMS
    for b in BLOCKS:
        if not b.marker:
            continue
        where = f"line {b.line}: <!-- test: {b.marker} -->"
        assert b.action in ("run", "file"), f"{where}: unknown action (run, file)"
        if b.action == "run":
            assert b.lang == "python", f"{where}: only python blocks run"
            assert b.flags <= {"warm"}, f"{where}: unknown flag (warm)"
        else:
            parts = b.marker.split()
            assert len(parts) == 2 and not os.path.isabs(parts[1]) and ".." not in parts[1], \
                f"{where}: `file` takes one relative path"


def test_the_torch_migration_snippets_are_run_warm():
    """The brief of section 1: the opforge side of `load` and `load_inline` runs, twice."""
    warm = [b.code for b in RUNS if "warm" in b.flags]
    assert any("opforge.load(" in code for code in warm), "no `run, warm` snippet calls opforge.load"
    assert any("opforge.load_inline(" in code for code in warm), "no `run, warm` snippet calls opforge.load_inline"


# -- the runnable snippets -------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The files the guide shows (``<!-- test: file PATH -->``), in one directory."""
    root = tmp_path_factory.mktemp("migrating")
    for b in FILES:
        path = root / b.marker.split()[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.code)
    return root


@pytest.mark.skipif(not has_cxx(), reason="needs a C++ compiler")
@pytest.mark.parametrize("block", RUNS, ids=[f"line{b.line}" for b in RUNS])
def test_snippet_runs(block, workdir, shared_cache):
    env = {"OPFORGE_CACHE_DIR": str(shared_cache)}
    cold = run_python(block.code, env=env, cwd=str(workdir), timeout=900)
    assert cold.returncode == 0, f"docs/migrating.md line {block.line}:\n{cold.stdout}\n{cold.stderr}"
    if "warm" in block.flags:
        warm = run_python(NO_PROCESSES + block.code, env={**env, "CXX": "/nonexistent/c++"}, cwd=str(workdir))
        assert warm.returncode == 0, \
            f"docs/migrating.md line {block.line}, warm, no compiler:\n{warm.stdout}\n{warm.stderr}"


# -- names, declarations and calls -----------------------------------------------------------


def resolve(dotted: str):
    """The object ``opforge.a.b`` names, importing submodules on the way; raises if there is none."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i in range(1, len(parts)):
        try:
            obj = getattr(obj, parts[i])
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


def is_opforge_class(obj) -> bool:
    return inspect.isclass(obj) and obj.__module__.split(".")[0] == "opforge"


def dotted_name(node) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(attrs)])


class Checker:
    """Static checks of one python snippet against opforge.

    ``aliases``: local name -> dotted opforge path (from the snippet's imports).
    ``classes``: local class name -> the opforge class it derives from, or None when it derives
    from something else (a class of DeepSpeed's, ColossalAI's); ``known`` is the same for the
    classes the guide's other snippets declare (``ScaleAddLoader``), for snippets that use them.
    """

    def __init__(self, tree: ast.AST, known: dict[str, type], aliases: dict[str, str] | None = None):
        self.tree = tree
        self.known = known
        self.aliases: dict[str, str] = dict(aliases or {})
        self.classes: dict[str, type | None] = {}
        self.errors: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "opforge":
                        if a.asname:
                            self.aliases[a.asname] = a.name
                        else:
                            self.aliases["opforge"] = "opforge"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "opforge" and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):  # in source order: a base is declared before its subclasses
            if isinstance(node, ast.ClassDef):
                bases = [self.opforge_class(b) for b in node.bases]
                self.classes[node.name] = next((b for b in bases if b is not None), None)

    def full_name(self, node) -> str | None:
        """The dotted opforge path of ``node`` when it is rooted at an opforge import."""
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head not in self.aliases:
            return None
        return f"{self.aliases[head]}.{rest}" if rest else self.aliases[head]

    def opforge_class(self, node) -> type | None:
        """The opforge class ``node`` names or derives from (a local class: its opforge base)."""
        if isinstance(node, ast.Name):
            if node.id in self.classes:
                return self.classes[node.id]
            if node.id in self.known and node.id not in self.aliases:
                return self.known[node.id]
        full = self.full_name(node)
        if full is None:
            return None
        try:
            obj = resolve(full)
        except Exception:
            return None  # reported by check_names
        return obj if is_opforge_class(obj) else None

    def error(self, node, message: str) -> None:
        self.errors.append(f"line +{getattr(node, 'lineno', '?')}: {message}")

    def check_names(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "opforge" and not node.level:
                for a in node.names:
                    self._resolves(node, f"{node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "opforge":
                        self._resolves(node, a.name)
            elif isinstance(node, ast.Attribute):
                full = self.full_name(node)
                if full is not None:
                    self._resolves(node, full)

    def _resolves(self, node, dotted: str) -> None:
        try:
            resolve(dotted)
        except Exception as exc:
            self.error(node, f"{dotted} does not resolve ({type(exc).__name__}: {exc})")

    def check_declarations(self) -> None:
        """Subclasses of opforge's classes set only attributes that opforge's class has, and
        override only its methods; a ``platform`` parameter is used as a Platform."""
        from opforge.platform import Platform

        for node in ast.walk(self.tree):
            if not isinstance(node, ast.ClassDef) or self.classes.get(node.name) is None:
                continue
            base = self.classes[node.name]
            for stmt in node.body:
                targets = []
                if isinstance(stmt, ast.Assign):
                    for t in stmt.targets:
                        targets += t.elts if isinstance(t, ast.Tuple) else [t]
                elif isinstance(stmt, ast.AnnAssign):
                    targets = [stmt.target]
                elif isinstance(stmt, ast.FunctionDef):
                    if not hasattr(base, stmt.name):
                        self.error(stmt, f"{node.name}.{stmt.name}() overrides nothing in {base.__qualname__}: "
                                         "opforge never calls it")
                    params = [a.arg for a in stmt.args.args]
                    if "platform" in params:
                        self._check_platform_uses(stmt, Platform())
                for t in targets:
                    if isinstance(t, ast.Name) and not hasattr(base, t.id):
                        self.error(t, f"{node.name}.{t.id}: {base.__qualname__} has no attribute {t.id!r}")

    def _check_platform_uses(self, func: ast.FunctionDef, platform) -> None:
        for node in ast.walk(func):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                name = dotted_name(node)
                if not name or not name.startswith("platform."):
                    continue
                obj = platform
                for attr in name.split(".")[1:]:
                    if not hasattr(obj, attr):
                        self.error(node, f"{name}: opforge.platform.Platform has no {attr!r} there")
                        break
                    obj = getattr(obj, attr)

    def check_class_attributes(self) -> None:
        """``Loader.register_extension``, ``Loader().load``: attributes that opforge's class has
        (or that the snippet's own class defines)."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            owner = node.value
            if isinstance(owner, ast.Call) and not owner.args and not owner.keywords:
                owner = owner.func  # an instance: Loader().load
            if not isinstance(owner, ast.Name):
                continue
            cls = self.opforge_class(owner)
            if cls is None or hasattr(cls, node.attr) or self._defined_locally(owner.id, node.attr):
                continue
            self.error(node, f"{ast.unparse(node)}: {cls.__qualname__} has no {node.attr!r}")

    def check_calls(self) -> None:
        """Each call of an opforge callable binds to its signature."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            target, add_self = self.callee(node.func)
            if target is None:
                continue
            try:
                sig = inspect.signature(target)
            except (TypeError, ValueError):
                continue
            args = [None] * (len(node.args) + add_self)
            try:
                sig.bind(*args, **{k.arg: None for k in node.keywords})
            except TypeError as exc:
                self.error(node, f"{ast.unparse(node)}: does not fit {getattr(target, '__qualname__', target)}"
                                 f"{sig}: {exc}")

    def callee(self, func) -> tuple[object | None, int]:
        """The opforge object a call calls, and 1 when ``self`` must be added to bind it."""
        if isinstance(func, ast.Attribute):
            owner = func.value
            instance = isinstance(owner, ast.Call) and not owner.args and not owner.keywords
            cls = self.opforge_class(owner.func if instance else owner)
            if cls is not None:
                local = owner.func if instance else owner
                if isinstance(local, ast.Name) and self._defined_locally(local.id, func.attr):
                    return None, 0
                if not hasattr(cls, func.attr):
                    return None, 0  # reported by check_class_attributes
                static = inspect.getattr_static(cls, func.attr)
                target = getattr(cls, func.attr)
                plain = inspect.isfunction(static)
                return target, int(instance and plain)
        full = self.full_name(func)
        if full is None:
            if isinstance(func, ast.Name) and self.opforge_class(func) is not None:
                return self.opforge_class(func), 0
            return None, 0
        try:
            obj = resolve(full)
        except Exception:
            return None, 0  # reported by check_names
        return (obj, 0) if callable(obj) else (None, 0)

    def _defined_locally(self, cls_name: str, attr: str) -> bool:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ClassDef) and node.name == cls_name:
                return any(isinstance(s, ast.FunctionDef) and s.name == attr for s in node.body)
        return False


def known_classes() -> dict[str, type]:
    """The classes the guide's python blocks derive from opforge's, by name."""
    known: dict[str, type] = {}
    for b in PYTHON:
        for name, base in Checker(ast.parse(b.code), {}).classes.items():
            if base is not None:
                known.setdefault(name, base)
    return known


def known_aliases() -> dict[str, str]:
    """The names the guide's python blocks import from opforge (``setup_extensions``, ``CPUAdam``)."""
    aliases = {"opforge": "opforge"}
    for b in PYTHON:
        aliases.update(Checker(ast.parse(b.code), {}).aliases)
    return aliases


def test_python_blocks_parse():
    bad = []
    for b in PYTHON:
        try:
            ast.parse(b.code)
        except SyntaxError as exc:
            bad.append(f"line {b.line + (exc.lineno or 0)}: {exc.msg}")
    assert not bad, bad


@pytest.mark.parametrize("block", PYTHON, ids=[f"line{b.line}" for b in PYTHON])
def test_python_block_matches_opforge(block):
    checker = Checker(ast.parse(block.code), known_classes())
    checker.check_names()
    checker.check_declarations()
    checker.check_class_attributes()
    checker.check_calls()
    assert not checker.errors, [f"docs/migrating.md block at line {block.line}, {e}" for e in checker.errors]


def test_inline_code_matches_opforge():
    """Spans in the prose that are Python (``ScaleAddLoader().load(ext_name=...)``,
    ``opforge.isa.AVX2``) get the same checks as the code blocks."""
    known, aliases = known_classes(), known_aliases()
    errors = []
    for span in prose_spans():
        try:
            tree = ast.parse(span)
        except SyntaxError:
            continue
        checker = Checker(tree, known, aliases=aliases)
        checker.check_names()
        checker.check_class_attributes()
        checker.check_calls()
        errors += [f"`{span}`: {e}" for e in checker.errors]
    assert not errors, errors


def test_every_opforge_name_resolves():
    """``opforge.<name>`` anywhere in code (blocks of any language and inline spans)."""
    code = [b.code for b in BLOCKS] + prose_spans()
    names = sorted({m for c in code for m in OPFORGE_DOTTED.findall(c)})
    assert "opforge.load" in names, names
    bad = []
    for name in names:
        try:
            resolve(name)
        except Exception as exc:
            bad.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not bad, bad


# -- environment variables, the entry point group, the command line ---------------------------


def test_environment_variables_exist():
    sources = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "opforge")):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    sources.append(fh.read())
    source = "\n".join(sources)
    missing = sorted({v for v in ENV_VAR.findall(TEXT) if v not in source})
    assert not missing, f"docs/migrating.md names variables opforge never reads: {missing}"


def test_entry_point_group():
    from opforge.registry import ENTRY_POINTS

    groups = re.findall(r'entry-points\."([^"]+)"', "".join(b.code for b in BLOCKS if b.lang == "toml"))
    assert groups, "the guide shows no entry point group"
    assert all(g == ENTRY_POINTS for g in groups if g.startswith("opforge")), (groups, ENTRY_POINTS)


def parse_cli(argv: list[str]) -> int:
    """0 when opforge's parser accepts ``argv``; argparse's exit status otherwise."""
    from opforge.cli.main import build_parser

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


def has_command(name: str) -> bool:
    return parse_cli([name, "--help"]) == 0


def test_command_lines_parse():
    bad, pending = [], []
    for b in BLOCKS:
        if b.lang not in ("bash", "sh", "console"):
            continue
        for k, line in enumerate(b.code.splitlines()):
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)  # VAR=value before the command
            if not words or words[0] != "opforge":
                continue
            argv = words[1:]
            if argv and argv[0] in PENDING_COMMANDS and not has_command(argv[0]):
                pending.append(line)
                continue
            if parse_cli(argv) != 0:
                bad.append(f"line {b.line + 1 + k}: {line.strip()}")
    assert not bad, f"opforge's CLI rejects: {bad}"


def test_inline_commands_exist():
    """``opforge report``, ``opforge cache export``... in the prose: the (sub)commands exist."""
    bad = []
    for span in prose_spans():
        words = span.split()
        if len(words) < 2 or words[0] != "opforge" or not re.match(r"^[a-z]+$", words[1]):
            continue
        path = [words[1]]
        if words[1] == "cache" and len(words) > 2 and re.match(r"^[a-z]+$", words[2]):
            path.append(words[2])
        if path[0] in PENDING_COMMANDS and not has_command(path[0]):
            continue
        if parse_cli([*path, "--help"]) != 0:
            bad.append(span)
    assert not bad, bad
