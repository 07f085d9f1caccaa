"""The doctor's ``patch torch`` line: is ``OPFORGE_PATCH_TORCH`` on, and does it take with no ``import opforge``?

It takes when opforge's startup hook (``opforge-patch-torch.pth``, see ``_opforge_startup.py``) is in one of
this Python's site directories, which ``site`` reads at start-up (not under ``python -S``).
"""

from __future__ import annotations

import os
import site
import sys

from .doctor_checks import OK, WARN, Check

NAME = "patch torch"
REINSTALL = "reinstall opforge (`pip install opforge`, or `pip install -e .` in a checkout): the install puts the hook there"


def site_dirs() -> list[str]:
    """The directories whose ``.pth`` files this Python runs at start-up."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def hook_file(dirs: list[str]) -> str | None:
    """The installed startup hook in ``dirs``, or None (also when its module can't be imported)."""
    try:
        from _opforge_startup import PTH_NAME
    except ImportError:
        return None
    for d in dirs:
        path = os.path.join(d, PTH_NAME)
        if os.path.isfile(path):
            return path
    return None


def check_patch_torch(on: bool, hook: str | None, dirs: list[str], no_site: bool = False) -> Check:
    """The verdict, from facts: the setting, the hook's file (or None), where it was looked for.

    >>> check_patch_torch(True, "/venv/site-packages/opforge-patch-torch.pth", []).status
    'ok'
    >>> check_patch_torch(True, None, ["/venv/site-packages"]).status
    'warn'
    """
    if on and hook and not no_site:
        return Check(NAME, OK, "on (OPFORGE_PATCH_TORCH=1): torch's load and load_inline go through opforge from the "
                               f"first import of torch.utils.cpp_extension, with no import of opforge (startup hook {hook})")
    if on and hook:
        return Check(NAME, WARN, "OPFORGE_PATCH_TORCH=1, but this Python runs without `site` (-S), so the startup hook "
                                 f"{hook} does not run: torch is patched only where a script imports opforge",
                     "run Python without -S, or call opforge.patch_torch() in the script")
    if on:
        return Check(NAME, WARN, "OPFORGE_PATCH_TORCH=1, but opforge's startup hook is not installed in this Python (no "
                                 f"opforge-patch-torch.pth in {', '.join(dirs) or 'its site directories'}): torch is "
                                 "patched only where a script imports opforge", REINSTALL)
    if hook:
        return Check(NAME, OK, "off (OPFORGE_PATCH_TORCH unset or 0); OPFORGE_PATCH_TORCH=1 routes torch's load and "
                               f"load_inline through opforge with no change to the code (startup hook {hook})")
    return Check(NAME, OK, "off (OPFORGE_PATCH_TORCH unset or 0); opforge's startup hook is not installed in this "
                           "Python, so OPFORGE_PATCH_TORCH=1 would patch only where a script imports opforge")


def check(settings) -> Check:
    dirs = site_dirs()
    return check_patch_torch(settings.patch_torch, hook_file(dirs), dirs, bool(sys.flags.no_site))
