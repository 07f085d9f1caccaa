"""The ``opforge`` command line."""
