"""Every fault suite, in one package (so that its conftest does not shadow tests/conftest.py):

* ``test_cache_faults.py``: what the cache must survive, each case once: a kill -9 mid-build,
  a crowd of processes, corrupt binaries, changed inputs, unsafe permissions, held locks;
* ``test_fault_injection.py``: faults injected in rounds (``-m slow``: the full counts), each
  load tallied by ``conftest.py`` (``OPFORGE_FAULT_REPORT`` writes the totals that
  ``docs/reliability.md`` quotes).
"""
