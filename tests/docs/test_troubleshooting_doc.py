"""docs/troubleshooting.md can't drift from the code.

The doc's convention: a section about an error class is headed
``## `opforge.Name`: what it means`` (or ``###``), several classes as ``## `A`, `B`: ...``, a
builtin bare (``## `ValueError`: ...``). Checked here:

* each class a heading names exists (``opforge.<Name>``, or a builtin exception);
* each class of ``opforge.errors``, and each exception or warning ``opforge`` exports, is named
  in the doc (an error class in a heading);
* each error class named anywhere in the doc (in a heading or in backticks in the text) has a
  heading, and each warning is named in backticks;
* each named class is raised by some test: ``pytest.raises(Class, ...)`` or
  ``pytest.raises((Class, ...))`` in tests/, read with ``ast``, with the name resolved through
  the test file's imports (``Class``, ``opforge.Class``, ``errors.Class``, ...). It must name
  exactly that class (a ``pytest.raises`` of a subclass or a base doesn't count); a warning
  needs a ``pytest.warns`` of it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import os
import re

import pytest
from conftest import ROOT

import opforge
import opforge.errors

DOC = os.path.join(ROOT, "docs", "troubleshooting.md")
TESTS = os.path.join(ROOT, "tests")

HEADING = re.compile(r"^#{2,6}\s+(.*)$")
NAMED_HEADING = re.compile(r"^((?:`[\w.]+`)(?:,\s*`[\w.]+`)*):\s+\S")
"""`A`: summary, or `A`, `B`: summary."""
TICKED = re.compile(r"`([A-Za-z_][\w.]*)`")


# --------------------------------------------------------------------------- the doc


def _doc_lines() -> list[str]:
    """The doc's lines, fenced code blocks left out."""
    with open(DOC, encoding="utf-8") as f:
        lines, fenced = [], False
        for line in f.read().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                lines.append(line)
    return lines


def heading_names() -> dict[str, str]:
    """Each class name a heading documents -> that heading."""
    found: dict[str, str] = {}
    for line in _doc_lines():
        m = HEADING.match(line)
        if not m or not m.group(1).startswith("`"):
            continue
        named = NAMED_HEADING.match(m.group(1))
        if named:  # "## `pip install` notes" (no "`X`: ") names no class; malformed_headings() checks those
            for name in TICKED.findall(named.group(1)):
                found[name] = line
    return found


def malformed_headings() -> list[str]:
    """Headings that start with a backticked exception class, but not in the "`X`: summary" form."""
    bad = []
    for line in _doc_lines():
        m = HEADING.match(line)
        if m and m.group(1).startswith("`") and not NAMED_HEADING.match(m.group(1)):
            first = TICKED.match(m.group(1))
            if first and exception_class(first.group(1), bare_opforge=True) is not None:
                bad.append(line)
    return bad


def ticked_names() -> set[str]:
    """Every `name` in backticks anywhere in the doc (headings included)."""
    return {name for line in _doc_lines() for name in TICKED.findall(line)}


def exception_class(name: str, bare_opforge: bool = False) -> type[BaseException] | None:
    """The exception (or warning) class a name in the doc stands for: ``opforge.X``, or a builtin;
    with ``bare_opforge``, also a bare ``X`` that opforge exports (the text says `OpforgeError`)."""
    if name.startswith("opforge."):
        obj = getattr(opforge, name[len("opforge."):], None)
    else:
        obj = getattr(builtins, name, None)
        if obj is None and bare_opforge:
            obj = getattr(opforge, name, None)
    return obj if inspect.isclass(obj) and issubclass(obj, BaseException) else None


def _is_warning(cls: type) -> bool:
    return issubclass(cls, Warning)


def doc_classes() -> dict[str, type[BaseException]]:
    """Every exception or warning class the doc names, in a heading or in the text, by its name there."""
    found = {}
    for name in ticked_names():
        cls = exception_class(name, bare_opforge=True)
        if cls is not None:
            found[name] = cls
    return found


# --------------------------------------------------------------------------- the tests' source


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name / Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted path, from every import in the file (functions' own included)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:  # `import opforge.errors` binds `opforge`
                    top = a.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _resolve(dotted: str, imports: dict[str, str]) -> object | None:
    """The object a dotted name in a test file refers to, through the file's imports or builtins."""
    head, _, rest = dotted.partition(".")
    if head in imports:
        path = imports[head] + ("." + rest if rest else "")
    elif hasattr(builtins, head):
        obj = getattr(builtins, head)
        for attr in filter(None, rest.split(".")):
            obj = getattr(obj, attr, None)
        return obj
    else:
        return None  # a local variable (a parametrized `exc`): not resolvable statically
    parts = path.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _expected_classes(call: ast.Call, imports: dict[str, str]) -> list[type]:
    """The classes a ``pytest.raises`` / ``pytest.warns`` call names as expected."""
    if call.args:
        arg = call.args[0]
    else:
        arg = next((k.value for k in call.keywords if k.arg in ("expected_exception", "expected_warning")), None)
    if arg is None:
        return []
    elts = arg.elts if isinstance(arg, ast.Tuple) else [arg]
    found = []
    for e in elts:
        dotted = _dotted(e)
        obj = _resolve(dotted, imports) if dotted else None
        if inspect.isclass(obj):
            found.append(obj)
    return found


def classes_expected_by_tests() -> tuple[set[type], set[type]]:
    """(the classes some test expects with pytest.raises, the ones it expects with pytest.warns)."""
    raised: set[type] = set()
    warned: set[type] = set()
    for folder, _, files in os.walk(TESTS):
        for fname in sorted(files):
            if not fname.endswith(".py"):
                continue
            path = os.path.join(folder, fname)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            imports = _imports(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = _dotted(node.func)
                if not func or func.rsplit(".", 1)[-1] not in ("raises", "warns"):
                    continue  # resolve only these: resolving imports the module a name comes from
                target = _resolve(func, imports)
                if target is pytest.raises:
                    raised.update(_expected_classes(node, imports))
                elif target is pytest.warns:
                    warned.update(_expected_classes(node, imports))
    return raised, warned


# --------------------------------------------------------------------------- the checks


def test_the_doc_names_error_classes_in_headings():
    names = heading_names()
    # The sections the doc has always had, at least: the convention is followed, the parser works.
    for expected in ("ValueError", "opforge.BuildError", "opforge.ToolchainError", "opforge.LockTimeoutError"):
        assert expected in names, sorted(names)
    assert malformed_headings() == [], "use the form '## `opforge.Name`: what it means'"


def test_each_heading_names_a_real_exception_class():
    for name, heading in heading_names().items():
        if name.startswith("opforge."):
            assert exception_class(name) is not None, f"{heading!r}: opforge has no exception class {name[8:]!r}"
        else:
            assert exception_class(name) is not None, (f"{heading!r}: {name!r} is not a builtin exception; "
                                                       f"name opforge's own as `opforge.{name}`")


def test_each_class_in_opforge_errors_has_a_section():
    defined = [cls for _, cls in inspect.getmembers(opforge.errors, inspect.isclass)
               if cls.__module__ == opforge.errors.__name__ and issubclass(cls, BaseException)]
    assert len(defined) >= 7
    documented = {exception_class(n) for n in heading_names()}
    missing = [cls.__name__ for cls in defined if cls not in documented]
    assert missing == [], f"add a '## `opforge.<Name>`: ...' section to docs/troubleshooting.md for {missing}"


def test_each_exported_exception_or_warning_is_named_in_the_doc():
    exported = {getattr(opforge, n) for n in opforge.__all__}
    exported = {c for c in exported if inspect.isclass(c) and issubclass(c, BaseException)}
    named = set(doc_classes().values())
    missing = sorted(c.__name__ for c in exported - named)
    assert missing == [], f"docs/troubleshooting.md doesn't mention {missing}"


def test_each_error_class_the_text_names_has_a_section():
    documented = {exception_class(n) for n in heading_names()}
    loose = sorted({name for name, cls in doc_classes().items() if not _is_warning(cls) and cls not in documented})
    assert loose == [], f"the doc names {loose} but has no '## `Name`: ...' section for them"


def test_each_documented_class_is_raised_by_a_test():
    raised, warned = classes_expected_by_tests()
    missing = []
    for name, cls in sorted(doc_classes().items()):
        if cls not in (warned if _is_warning(cls) else raised):  # exactly this class
            missing.append(name)
    assert missing == [], (f"no test raises (pytest.raises / pytest.warns) {missing}: write one that triggers "
                           "it through opforge's API")


# --------------------------------------------------------------------------- the scanner itself


def test_the_scanner_resolves_each_way_a_test_names_a_class():
    src = (
        "import pytest\n"
        "import opforge\n"
        "from opforge import errors\n"
        "from opforge.errors import CacheError as CE\n"
        "from pytest import raises\n"
        "def t():\n"
        "    from opforge.errors import ArchiveError\n"
        "    pytest.raises(opforge.BuildError)\n"
        "    pytest.raises((errors.ToolchainError, KeyError), match='x')\n"
        "    raises(CE)\n"
        "    pytest.raises(expected_exception=ArchiveError)\n"
        "    pytest.raises(exc)\n"  # a variable: skipped
        "    pytest.warns(opforge.KernelFallbackWarning)\n"
    )
    tree = ast.parse(src)
    imports = _imports(tree)
    got = [(_resolve(_dotted(n.func), imports), _expected_classes(n, imports))
           for n in ast.walk(tree) if isinstance(n, ast.Call) and _dotted(n.func) in
           ("pytest.raises", "raises", "pytest.warns")]
    assert got == [
        (pytest.raises, [opforge.BuildError]),
        (pytest.raises, [opforge.ToolchainError, KeyError]),
        (pytest.raises, [opforge.CacheError]),
        (pytest.raises, [opforge.ArchiveError]),
        (pytest.raises, []),
        (pytest.warns, [opforge.KernelFallbackWarning]),
    ]
    assert exception_class("opforge.NoSuchError") is None and exception_class("opforge.load") is None
    assert exception_class("OpforgeError") is None and exception_class("OpforgeError", bare_opforge=True)
