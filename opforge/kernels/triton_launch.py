"""Launching a Triton kernel with no tuning and no JIT work per call (``TunedKernel``).

``triton.autotune`` and ``JITFunction.run`` redo, on every call, work whose answer rarely
changes: build the tuning key from the arguments, prune the configs, run pre-hooks, bind the
arguments, compute their specialization and look the compiled kernel up. On a small matmul
that was most of the call's host time (issue 21). Here:

* **The config** is chosen once per (tuning key, device) and remembered: in the process (a
  dict lookup per call) and in opforge's cache (``tuning.py``), so a new process reads the
  winner instead of timing the candidates again. Tuning times each candidate that ``keep``
  allows with ``triton.testing.do_bench`` on the call's own arguments, as ``triton.autotune``
  does. Under CUDA graph capture nothing can be timed: the first kept candidate runs, and the
  key is tuned at its next call outside a capture. ``OPFORGE_TRITON_TUNING=off``: the first
  candidate that fits, untimed. Before a tuning times its candidates, those not compiled yet are
  compiled at once on a thread pool (``_precompile``; ``compile_ahead.compiling_ahead`` does it for
  several kernels together), where a first tuning used to wait for each compile in turn.
* **The compiled kernel** of a (config, device, argument specialization) is kept once the JIT
  has built it (the first call goes through ``fn[grid](...)``), and later calls launch it
  through its own launcher (``CompiledKernel.run``, the call ``JITFunction.run`` makes at its
  end: the same arguments, the same order, triton 3.3 to 3.9). The specialization key
  (``spec``) is at least as fine as triton's: each int's ``== 1`` / ``% 16`` / width, each
  tensor's dtype and 16-byte alignment, each descriptor's dtype and box, each constexpr's value;
  so a kept kernel only runs on arguments triton would have compiled the same kernel for.
* While a launch hook is installed (triton's profiler, proton), calls take triton's own path,
  so the hooks see every launch; ``OPFORGE_TRITON_DIRECT=0`` does that always.

``TunedKernel.tuning_runs`` counts the keys tuned in this process (tests count them).
"""

from __future__ import annotations

import inspect
import math
import threading
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import settings
from ..process import forgets
from . import compile_ahead
from .native_launch.recipe import recipe_of
from .triton_compat import TensorDescriptor, triton
from .triton_tma import Described, RawLauncher, described
from .tuning import TuningStore, fingerprint


class Choice(NamedTuple):
    """One candidate config: its index in the family's list, its meta-parameters (by name and,
    in the kernel's parameter order, as the trailing values of a launch) and launch options."""

    index: int
    kwargs: dict
    values: tuple
    num_warps: int
    num_stages: int


def spec(args, constexprs: frozenset = frozenset()) -> tuple:
    """What triton specializes a compiled kernel on, for these arguments (finer is fine): the
    value of each constexpr parameter (positions in ``constexprs``) and of each bool, None or
    string; each int's ``== 1`` / ``% 16`` / width; each tensor's dtype and 16-byte alignment;
    each descriptor's dtype and box. (A hot loop: a launch pays it.)"""
    out = []
    add = out.append
    for i, a in enumerate(args):
        t = type(a)
        if t is int:
            add(a if i in constexprs else (a == 1, a % 16 == 0, -(2**31) <= a < 2**31, 0 <= a < 2**64))
        elif t is torch.Tensor or isinstance(a, torch.Tensor):
            add((a.dtype, a.data_ptr() % 16 == 0))
        elif t is TensorDescriptor:  # triton keys a descriptor on its dtype and box
            add((a.base.dtype, tuple(a.block_shape), getattr(a, "padding", None)))
        else:  # bools, None, strings: triton keys on their value
            add((t, a))
    return tuple(out)


def _hooks_active() -> bool:
    """A launch hook (a profiler) is installed: take triton's path so it sees the launch."""
    if not _HOOKS:
        knobs = getattr(triton, "knobs", None)
        if knobs is not None:
            _HOOKS.append(knobs.runtime)
        else:  # triton 3.3: the hooks are CompiledKernel's attributes
            from triton.compiler import CompiledKernel
            _HOOKS.append(CompiledKernel)
    enter, leave = _HOOKS[0].launch_enter_hook, _HOOKS[0].launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


_HOOKS: list = []


def _source_digest(fn) -> str:
    try:
        return fn.cache_key  # triton's hash of the kernel and the functions it calls
    except AttributeError:
        return inspect.getsource(fn.fn)


class TunedKernel:
    """One Triton kernel, its candidate configs (``triton.Config``), and the chosen ones.

    ``choose(key, device, trial, keep)`` -> the ``Choice`` for the key; ``launch(choice, grid,
    args, device)`` runs it. ``args`` are the kernel's parameters in order, all but the trailing
    meta-parameters the configs set (which ``launch`` appends)."""

    def __init__(self, family: str, fn, configs: list, dependent: str | None = None):
        self.family, self.fn = family, fn
        names = tuple(configs[0].kwargs)
        params = tuple(fn.arg_names)
        if params[-len(names):] != names or any(tuple(c.kwargs) != names for c in configs):
            raise ValueError(f"{fn}: the configs' meta-parameters {names} must be the kernel's last parameters, in "
                             f"order, and every config must set them all")
        # dependent: the constexpr parameter that says a launch is a programmatic dependent (the kernel
        # then waits for the one before it, griddepcontrol.wait): compiled with launch_pdl where it is true
        self._dependent = None if dependent is None else params.index(dependent)
        # constexpr parameters are keyed by value (triton compiles each value apart); without the
        # list (another triton) every int is keyed by value, which is finer still
        self._setup([Choice(i, dict(c.kwargs), tuple(c.kwargs[n] for n in names), c.num_warps, c.num_stages)
                     for i, c in enumerate(configs)],
                    frozenset(getattr(fn, "constexprs", ())) if hasattr(fn, "constexprs") else None)

    def _setup(self, choices: list, constexprs) -> None:
        """The candidates and the state of the choices made (shared with ``tuned_op.TunedOp``)."""
        self.choices, self.constexprs = choices, constexprs
        self._chosen: dict[tuple, Choice] = {}
        self._compiled: dict[tuple, object] = {}
        self._stores: dict[int, TuningStore] = {}
        _INSTANCES.add(self)
        self._lock = threading.Lock()
        self.tuning_runs = 0
        self.store_hits = 0

    # -- the config --

    def choose(self, key: tuple, device: int, trial: Callable[[Choice], tuple], keep: Callable[[Choice], bool],
               prefer: Callable[[Choice], object] | None = None, stand_ins=None) -> Choice:
        """The config for ``key`` on ``device``: remembered, else read from the cache, else tuned
        (``trial(choice) -> (grid, args)`` builds a launch of a candidate; ``keep(choice)`` says
        whether it may run these arguments at all; ``prefer(choice)``, a sort key, orders the
        kept ones: the first is what runs untimed, under capture or with tuning off). With
        ``stand_ins`` (``graph_timing.StandIns`` of one of the arguments) the candidates are timed
        under graph replay, each call on another stand-in, and the key says so."""
        if stand_ins is not None:
            key = (*key, "replayed")
        found = self._chosen.get((device, key))
        if found is not None:
            return found
        kept = [c for c in self.choices if keep(c)] or [self.choices[0]]
        if prefer is not None:
            kept.sort(key=prefer)
        if settings.current().triton_tuning == "off":
            self._chosen[(device, key)] = kept[0]
            return kept[0]
        if torch.cuda.is_current_stream_capturing():
            return kept[0]  # nothing can be timed now; tuned at the next call outside the capture
        store = self._store(device)
        index = store.get(key)
        if index is not None and 0 <= index < len(self.choices):
            self.store_hits += 1
            found = self.choices[index]
        elif compile_ahead.active():  # a pass that only starts compiles (compiling_ahead): remember nothing
            self._submit(kept, trial, device)
            return kept[0]
        else:
            found, ms = self._tune(kept, trial, device, stand_ins)
            store.put(key, found.index, {"ms": ms, "kwargs": found.kwargs, "num_warps": found.num_warps,
                                         "num_stages": found.num_stages, "tried": len(kept)})
        self._chosen[(device, key)] = found
        return found

    def forget(self) -> None:
        """Read each key's config from the cache again (``opforge.reset()``: the cache directory may
        have changed); compiled kernels are kept."""
        self._chosen.clear()
        self._stores.clear()

    def _store(self, device: int) -> TuningStore:
        store = self._stores.get(device)
        if store is None:
            fp = fingerprint(self.family, getattr(self.fn, "__name__", str(self.fn)), _source_digest(self.fn),
                             [(c.kwargs, c.num_warps, c.num_stages) for c in self.choices], torch.__version__,
                             *self._facts(device))
            store = self._stores[device] = TuningStore(settings.current().cache_dir, self.family, fp)
        return store

    def _facts(self, device: int) -> tuple:
        """What else a winner depends on: triton's version, the device's name and capability."""
        props = torch.cuda.get_device_properties(device)
        return triton.__version__, props.name, (props.major, props.minor)

    def _time(self, fn) -> float:
        """Milliseconds per call of ``fn``, as ``triton.autotune`` times its candidates."""
        from triton.testing import do_bench

        return do_bench(fn, warmup=5, rep=25)

    def _tune(self, kept: list, trial, device: int, stand_ins=None) -> tuple[Choice, float]:
        with self._lock:
            self.tuning_runs += 1
        if stand_ins is not None:
            found = self._timed(kept, trial, device, stand_ins)
            if found is not None:
                return found
        return self._timed(kept, trial, device, None)  # as triton.autotune times (or the replay failed)

    def _timed(self, kept: list, trial, device: int, stand_ins) -> tuple[Choice, float] | None:
        """The fastest of ``kept`` and its time: with ``stand_ins`` under graph replay (None if that
        can't time one of them), else with ``_time``."""
        self._precompile(kept, trial, device)
        best, best_ms, first_error = None, math.inf, None
        for choice in kept:
            grid, args = trial(choice)
            try:
                self.launch(choice, grid, args, device)  # compiles it
                if stand_ins is None:
                    ms = self._time(lambda: self.launch(choice, grid, args, device))  # noqa: B023
                else:
                    ms = stand_ins.per_call_ms(lambda a: self.launch(choice, grid, a, device), args, device)  # noqa: B023
                    if ms is None:
                        return None
            except Exception as exc:  # noqa: BLE001 - a candidate that can't compile or run (resources) is skipped
                first_error = first_error or exc
                continue
            if ms < best_ms:
                best, best_ms = choice, ms
        if best is None:
            raise first_error
        return best, best_ms

    def _precompile(self, kept: list, trial, device: int) -> None:
        """Compile the candidates not compiled yet all at once, on threads, before ``_timed`` times them one
        by one (a first tuning otherwise waits for each compile in turn: issue 35's first contact). Uses
        triton's async compile mode (``compile_ahead.compiling_ahead``); without it, or with one thread
        (``OPFORGE_TRITON_COMPILE_THREADS=1``), the timing loop compiles each as it goes, as before. A
        candidate that fails to compile here fails again in the loop, which skips it as before."""
        if isinstance(self.fn, compile_ahead.jit_function()):
            with compile_ahead.compiling_ahead(device, len(kept)):
                self._submit(kept, trial, device)

    def _submit(self, kept: list, trial, device: int) -> None:
        """Hand each candidate not compiled yet to the open ``compiling_ahead`` scope (nothing without one)."""
        if not compile_ahead.active() or not isinstance(self.fn, compile_ahead.jit_function()):
            return
        with torch.cuda.device(device):
            for choice in kept:
                try:
                    grid, args = trial(choice)
                    args = described(args)
                    if self.compiled(choice, args, device) is None:
                        self.fn.warmup(*args, grid=grid, **choice.kwargs, **self._options(choice, args))
                except Exception:  # noqa: BLE001 - as in the loop: a candidate that can't compile is skipped there
                    continue

    def _options(self, choice: Choice, args: tuple) -> dict:
        """triton's launch options for ``choice``: warps, stages, and PDL for a dependent launch."""
        options = {"num_warps": choice.num_warps, "num_stages": choice.num_stages}
        if self._dependent is not None and args[self._dependent]:
            options["launch_pdl"] = True
        return options

    # -- the launch --

    def launch(self, choice: Choice, grid: tuple, args: tuple, device: int) -> None:
        """Run ``choice`` over ``grid`` on ``device`` (made current for the launch if it isn't).
        ``Described`` operands in ``args`` go in as triton's descriptors."""
        args = described(args)
        if device != torch.cuda.current_device():
            with torch.cuda.device(device):
                return self.launch(choice, grid, args, device)
        compiled = self._compiled.get((choice.index, device, self.spec(args)))
        if compiled is None or not direct():
            self._jit_launch(choice, grid, args, device)
            return
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        compiled.run(grid[0], g1, g2, _stream(device), compiled.function, compiled.packed_metadata, None, None,
                     None, *args, *choice.values)

    def compiled(self, choice: Choice, args: tuple, device: int):
        """The compiled kernel that launches ``args`` with ``choice`` (None until one launch made it)."""
        return self._compiled.get((choice.index, device, self.spec(args)))

    def _jit_launch(self, choice: Choice, grid: tuple, args: tuple, device: int) -> None:
        compiled = self.fn[grid](*args, **choice.kwargs, **self._options(choice, args))
        if compiled is not None and hasattr(compiled, "result"):  # an async compile's future
            compiled = compiled.result()
        if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            self._compiled[(choice.index, device, self.spec(args))] = compiled

    def spec(self, args) -> tuple:
        if self.constexprs is None:
            return tuple((type(a), a) if type(a) is int else s for a, s in zip(args, spec(args)))
        return spec(args, self.constexprs)


class Plan:
    """One call shape's launch, worked out once (``TunedKernel.choose`` and the caller's sizing):
    the kernel and its config, the grid, and the trailing arguments that don't change between
    calls of the shape (``consts``). ``plan(prefix, device)`` launches it with this call's leading
    arguments (its tensors): through the compiled kernel's launcher once a launch has compiled it,
    with no specialization key to compute, since the caller keys its plans on everything that
    key depends on (shapes, dtypes, the inputs' alignment; fresh outputs are always aligned).
    A prefix with TMA operands (``Described``) goes through the kernel's C launcher with the
    descriptors encoded once per address, shape and box (``triton_tma.py``), where triton's
    layout allows."""

    __slots__ = ("kernel", "choice", "grid", "consts", "tail", "compiled", "facts", "raw", "has_desc", "native")

    def __init__(self, kernel: TunedKernel, choice: Choice, grid: tuple, consts: tuple, facts=None):
        self.kernel, self.choice, self.consts, self.facts = kernel, choice, consts, facts
        self.grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        self.tail = consts + choice.values
        self.compiled = self.raw = None
        self.has_desc = False
        self.native = ""  # why a NativeTable can't replay its launch, once one refused it (the caller's business)

    def __call__(self, prefix: tuple, device: int) -> None:
        c = self.compiled
        if c is not None and direct() and device == torch.cuda.current_device():
            g = self.grid
            if self.raw is not None:
                self.raw(g, _stream(device), prefix, self.tail)
                return
            c.run(g[0], g[1], g[2], _stream(device), c.function, c.packed_metadata, None, None, None,
                  *(described(prefix) if self.has_desc else prefix), *self.tail)
            return
        args = prefix + self.consts
        self.kernel.launch(self.choice, self.grid, args, device)
        if c is None:
            self.compiled = self.kernel.compiled(self.choice, described(args), device)
            if self.compiled is not None:
                self.has_desc = any(type(a) is Described for a in prefix)
                self.raw = RawLauncher.of(self.compiled, prefix) if self.has_desc else None

    def recipe(self, prefix: tuple, inputs: tuple, outputs: list):
        """The native_launch recipe of the launch just made with ``prefix`` (``recipe_of``), or why there
        is none; None while no launch has compiled the kernel (ask again after the next)."""
        if self.compiled is None:
            return None
        return recipe_of(self.compiled, self.grid, prefix + self.tail, inputs, outputs)


def _stream(device: int):
    """The current stream's handle, as triton's own launch takes it."""
    if not _STREAM:
        _STREAM.append(triton.runtime.driver.active.get_current_stream)
    return _STREAM[0](device)


_STREAM: list = []
_DIRECT: list = []


def direct() -> bool:
    """Launch compiled kernels directly (``OPFORGE_TRITON_DIRECT``, and no launch hook installed)."""
    if not _DIRECT:
        _DIRECT.append(settings.current().triton_direct)
    return _DIRECT[0] and not _hooks_active()


_INSTANCES: weakref.WeakSet = weakref.WeakSet()


@forgets
def _forget() -> None:
    for kernel in list(_INSTANCES):
        kernel.forget()


__all__ = ["Choice", "Plan", "TunedKernel", "direct", "spec"]
