"""dsadam: DeepSpeed's CPU Adam kernel, built and loaded by opforge (``examples/ds_cpu_adam``).

``load()`` returns the best implementation here: a prebuilt variant (``DSADAM_BUILD=all`` at
``pip install``), a cached one, a fresh JIT build, or the pure-torch functions. Its attributes are
DeepSpeed's module functions: ``create_adam``, ``adam_update``, ``destroy_adam``."""

from .kernels import DSCPUAdamLoader


def load(**kwargs):
    return DSCPUAdamLoader().load(device="cpu", **kwargs)


__all__ = ["DSCPUAdamLoader", "load"]
