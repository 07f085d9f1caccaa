"""The shared precompiled torch/extension.h: which sources may use it (``pch.eligible``, read from
their text), the setting (on unless 0), and the silent fallbacks (another compiler, a PCH that
fails to build). The real PCH build and its use are in test_load.py (one per test session)."""

from __future__ import annotations

import os

import pytest

from opforge.engine import pch, pch_store
from opforge.engine.progress import Reporter

TORCH = "#include <torch/extension.h>\n"


def tree(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, ok", [
    (TORCH, True),
    ("// Copyright\n/* a\n   block */\n\n" + TORCH, True),
    ("#include <stdio.h>\n#include <vector>\n" + TORCH, True),  # system headers: read again later as no-ops
    ("#pragma once\n#define NOMINMAX  // Windows only\n" + TORCH, True),
    ("#define TORCH_ASSERT_ONLY_METHOD_OPERATORS\n" + TORCH, False),  # changes what ATen's headers declare
    ("#define _GLIBCXX_USE_CXX11_ABI 0\n" + TORCH, False),
    ("#ifdef __AVX2__\n#include <immintrin.h>\n#endif\n" + TORCH, False),
    ("int x = 1;\n" + TORCH, False),
    ("#include <ATen/ATen.h>\n", False),  # never reaches torch/extension.h
    ("", False),
])
def test_a_source_qualifies_when_nothing_before_the_header_can_change_it(tmp_path, text, ok):
    src = tree(tmp_path, {"a.cpp": text}) / "a.cpp"
    assert pch.eligible(str(src)) is ok


def test_local_headers_are_followed_beside_the_file_and_in_the_include_dirs(tmp_path):
    tree(tmp_path, {
        "csrc/adam/cpu_adam.cpp": '// DeepSpeed\'s layout\n#include "cpu_adam.h"\nint f();\n',
        "csrc/includes/cpu_adam.h": "#pragma once\n#define NOMINMAX\n#include <stdio.h>\n" + TORCH,
        "guarded.cpp": '#include "guard.h"\n' + TORCH,
        "guard.h": "#ifndef GUARD_H\n#define GUARD_H\n#include <cstdint>\n#endif\n",  # ends harmlessly: go on
        "code.cpp": '#include "code.h"\n' + TORCH,
        "code.h": "#pragma once\nstruct S {};\n",
        "loop.cpp": '#include "loop.h"\n',
        "loop.h": '#pragma once\n#include "loop.h"\n',
    })
    src = tmp_path / "csrc" / "adam" / "cpu_adam.cpp"
    assert pch.eligible(str(src), [str(tmp_path / "csrc" / "includes")])
    assert not pch.eligible(str(src))  # cpu_adam.h not found: no
    assert pch.eligible(str(tmp_path / "guarded.cpp"))
    assert not pch.eligible(str(tmp_path / "code.cpp"))
    assert not pch.eligible(str(tmp_path / "loop.cpp"))


def _fake_compiler(tmp_path, defines: str, header_rc: int) -> list[str]:
    script = tmp_path / "fakecxx"
    script.write_text("#!/bin/sh\n"
                      f'case " $* " in *" -dM "*) printf \'{defines}\\n\'; exit 0;; esac\n'
                      f"echo 'fatal: no PCH for you' >&2; exit {header_rc}\n")
    script.chmod(0o755)
    return [str(script)]


def test_another_compiler_is_not_given_one(tmp_path):
    assert not pch.is_gcc(tuple(_fake_compiler(tmp_path, "#define __GNUC__ 4\\n#define __clang__ 1", 0)))
    (tmp_path / "gcc").mkdir()
    assert pch.is_gcc(tuple(_fake_compiler(tmp_path / "gcc", "#define __GNUC__ 12", 0)))


def test_a_pch_that_fails_to_build_is_skipped_silently_and_leaves_no_pch(tmp_path, capfd):
    argv = _fake_compiler(tmp_path, "#define __GNUC__ 12", 1)
    p = pch_store.describe(str(tmp_path / "cache"), "fake", argv, ("-O2",), "torch")
    assert pch_store.make(p, 2**30, 10, Reporter(False)) is False
    assert capfd.readouterr().err == ""
    assert sorted(os.listdir(p.base)) == [f"{p.key}{x}" for x in (".h", ".json", ".lock")]
    assert "no PCH for you" in pch_store.read_record(p)["failed"]


def test_ccache_is_told_what_pch_builds_need(monkeypatch):
    """ccache passes -include'd PCH compiles through uncached unless its sloppiness has pch_defines and
    time_macros (measured by hand with Debian 12's ccache: a rebuild after `opforge cache clean` 45.5 s -> 1.2 s)."""
    from opforge.engine.build import _compiler_env

    monkeypatch.setenv("CCACHE_SLOPPINESS", "include_file_mtime")
    env = _compiler_env("/usr/bin/ccache", "/cache/.pch/k/torch_extension.h")
    assert env["CCACHE_SLOPPINESS"] == "include_file_mtime,pch_defines,time_macros"
    assert _compiler_env("/usr/bin/ccache", None)["CCACHE_SLOPPINESS"] == "include_file_mtime"
    assert _compiler_env("/usr/bin/sccache", "/h.h")["CCACHE_SLOPPINESS"] == "include_file_mtime"
    assert _compiler_env(None, "/h.h")["CCACHE_SLOPPINESS"] == "include_file_mtime"
