"""The text of a ``build.ninja``: variables, rules, build edges, defaults.

Written here rather than with ``ninja.ninja_syntax``: that module ships only inside the PyPI
``ninja`` wheel, while the ninja binary opforge runs may be the OS's (``/usr/bin/ninja``, a
conda env's), found on PATH with no such module importable. torch's JIT writes its build
file by hand for the same reason. The escaping rules are ninja's own
(https://ninja-build.org/manual.html#ref_lexer): ``$`` starts a variable anywhere, and in a
path a space or ``:`` would end it.

>>> f = NinjaFile()
>>> f.variable("cxx", "g++ -DX=$(pwd)")
>>> f.rule("compile", "$cxx -c $in -o $out", depfile="$out.d", deps="gcc")
>>> f.build("a b.o", "compile", ["/src/a b.cpp"], variables={"cflags": "$cflags -O3"})
>>> print(f.text(), end="")
cxx = g++ -DX=$$(pwd)
rule compile
  command = $cxx -c $in -o $out
  depfile = $out.d
  deps = gcc
build a$ b.o: compile /src/a$ b.cpp
  cflags = $cflags -O3
"""

from __future__ import annotations


def escape_path(path: str) -> str:
    """A path as one token of a ``build`` line.

    >>> escape_path("C:/my dir/$x.o")
    'C$:/my$ dir/$$x.o'
    """
    _check_line(path)
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def escape_value(value: str) -> str:
    """A literal variable value: ``$`` doubled, so ninja reads no variable in it."""
    _check_line(value)
    return value.replace("$", "$$")


def _check_line(text: str) -> None:
    if "\n" in text or "\r" in text:
        raise ValueError(f"a build file token can't hold a line break: {text!r}; remove it from the "
                         "flag or path it came from")


class NinjaFile:
    """Collects a build file's lines. Values passed to :meth:`variable` are literal (escaped);
    rule commands and per-edge ``variables`` are ninja text (``$in``, ``$cflags`` expand)."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def variable(self, name: str, value: str) -> None:
        self._lines.append(f"{name} = {escape_value(value)}")

    def rule(self, name: str, command: str, *, description: str | None = None, depfile: str | None = None,
             deps: str | None = None) -> None:
        self._lines.append(f"rule {name}")
        for key, value in (("command", command), ("description", description), ("depfile", depfile),
                           ("deps", deps)):
            if value is not None:
                _check_line(value)
                self._lines.append(f"  {key} = {value}")

    def build(self, output: str, rule: str, inputs: list[str], variables: dict[str, str] | None = None) -> None:
        ins = " ".join(escape_path(p) for p in inputs)
        self._lines.append(f"build {escape_path(output)}: {rule} {ins}".rstrip())
        for key, value in (variables or {}).items():
            _check_line(value)
            self._lines.append(f"  {key} = {value}")

    def default(self, output: str) -> None:
        self._lines.append(f"default {escape_path(output)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
