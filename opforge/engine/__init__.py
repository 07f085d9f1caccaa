"""The build engine: key, cache, lock, compile, and the JIT entry points."""
