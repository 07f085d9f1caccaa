"""Prebuilt kernels land here (MYOPS_BUILD=... at pip install), with build_info.json."""
