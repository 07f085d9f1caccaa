"""Which of several kernels runs a call shape (``Route``), where each wins somewhere: timed once per
key among the candidates offered, the winner kept in the process and in opforge's cache
(``tuning.py``), as ``triton_launch.TunedKernel`` keeps a config."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .. import settings
from ..process import forgets
from .tuning import TuningStore, fingerprint


class Route:
    """Which of several kernels runs a call shape, where each wins somewhere (the block-sparse
    forward at decode sizes: ``_decode_kernel`` or the pointer kernel). ``choose(key, device,
    runs)`` times each candidate's launch (``runs``: name -> a callable that launches it, its own
    config already tuned) once per key, as the configs are, or the caller's way (``timing`` names
    it, and the cache keeps its picks apart), and keeps the winner in the process and in opforge's
    cache; under a capture or with tuning off the first name runs, untimed (not kept under a
    capture). ``tuning_runs`` / ``store_hits`` count as ``TunedKernel``'s do."""

    def __init__(self, family: str, name: str, names: tuple, kernels: tuple, timing: str = "do_bench"):
        self.family, self.name, self.names, self.kernels = family, name, tuple(names), tuple(kernels)
        self.timing = timing
        self._chosen: dict[tuple, str] = {}
        self._stores: dict[int, TuningStore] = {}
        self.tuning_runs = 0
        self.store_hits = 0
        _ROUTES.add(self)

    def choose(self, key: tuple, device: int, runs: dict[str, Callable[[], None]],
               timer: Callable[[str], float | None] | None = None) -> str:
        """The name of ``runs`` (a subset of ``names``: a candidate that can't take the call is left
        out, and the key then names the ones offered) that runs ``key`` on ``device``. ``timer(name)``,
        where given: milliseconds per call of that candidate, timed the caller's way (or None: then
        every candidate is timed as a config is, its run in ``runs``)."""
        offered = tuple(n for n in self.names if n in runs)
        if not offered:
            raise ValueError(f"{self.name}: none of {self.names} in the runs given ({tuple(runs)})")
        if offered != self.names:
            key = (*key, offered)
        found = self._chosen.get((device, key))
        if found is not None:
            return found
        if settings.current().triton_tuning == "off":
            self._chosen[(device, key)] = offered[0]
            return offered[0]
        if torch.cuda.is_current_stream_capturing():
            return offered[0]
        store = self._store(device)
        index = store.get(key)
        if index is not None and 0 <= index < len(self.names) and self.names[index] in runs:
            self.store_hits += 1
        else:
            self.tuning_runs += 1
            times = {}
            for name in offered:
                runs[name]()  # compiled (and its config tuned) before it is timed
                times[name] = timer(name) if timer is not None else self._time(runs[name])
            if None in times.values():  # the timer could not time one of them: all timed as configs are
                times = {name: self._time(runs[name]) for name in offered}
            index = self.names.index(min(times, key=times.get))
            store.put(key, index, {"ms": times})
        self._chosen[(device, key)] = self.names[index]
        return self.names[index]

    def forget(self) -> None:
        self._chosen.clear()
        self._stores.clear()

    def _time(self, fn) -> float:
        return self.kernels[0]._time(fn)

    def _store(self, device: int) -> TuningStore:
        store = self._stores.get(device)
        if store is None:
            fp = fingerprint(self.family, self.name, self.names, self.timing,
                             *(k._store(device).fingerprint for k in self.kernels))
            store = self._stores[device] = TuningStore(settings.current().cache_dir, self.family, fp)
        return store


_ROUTES: weakref.WeakSet = weakref.WeakSet()


@forgets
def _forget() -> None:
    for route in list(_ROUTES):
        route.forget()


__all__ = ["Route"]
