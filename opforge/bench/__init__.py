"""``opforge bench``: each kernel family timed against its peers on this machine.

``run(kinds, devices, quick)`` gives a :class:`Report`; ``report.to_json()`` is the schema
``opforge.bench/1`` (``schema.json`` beside this file, described in docs/bench.md);
``table.py`` prints it, ``plot.py`` draws it.

This package's own module imports nothing: the command line names the families (``KINDS``) in
its ``--help`` without importing the suites, which are torch code (``suites.SUITES`` holds the
same kinds, in the same order; tests/cli/test_cli_imports.py checks it).
"""

#: The families ``opforge bench`` times: the keys of ``suites.SUITES``, known without importing torch.
KINDS = ("cpu_adam", "bias_act", "block_sparse", "block_sparse_decode", "warm_start")
