"""The errors opforge raises. Each message says what went wrong and how to fix it.

``docs/troubleshooting.md`` lists every class here; a test raises each one.
"""

from __future__ import annotations


class OpforgeError(RuntimeError):
    """Base class of opforge's own run-time errors."""


class BuildError(OpforgeError):
    """The compiler or linker failed. Nothing was published; the next call builds again."""

    def __init__(self, message: str, log_path: str | None = None, excerpt: str = ""):
        super().__init__(message)
        self.log_path = log_path
        self.excerpt = excerpt


class ToolchainError(OpforgeError):
    """A compiler, nvcc, CUDA toolkit or ninja that the build needs is missing or unusable."""


class CacheError(OpforgeError):
    """The cache root cannot be created or written (see ``OPFORGE_CACHE_DIR``)."""


class UnsafeCacheError(CacheError):
    """A cache directory or binary is writable by others, owned by another user, or a symlink."""


class ArchiveError(OpforgeError):
    """A cache archive (``opforge cache import``) is not one, is corrupt, or names a path outside the cache."""


class LockTimeoutError(OpforgeError):
    """Another live process held the build lock for longer than ``OPFORGE_LOCK_TIMEOUT``."""
