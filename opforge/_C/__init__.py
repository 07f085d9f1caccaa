"""Kernels built at ``pip install`` with ``OPFORGE_BUILD=...`` land here, next to
``build_info.json`` (see ``opforge/prebuilt.py``). Empty in a plain install."""
