"""``opforge bench``: each kernel family timed against its peers on this machine.

``run(kinds, devices, quick)`` gives a :class:`Report`; ``report.to_json()`` is the schema
``opforge.bench/1`` (``schema.json`` beside this file, described in docs/bench.md);
``table.py`` prints it, ``plot.py`` draws it.
"""
