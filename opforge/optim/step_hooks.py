"""``torch.optim.Optimizer``'s step wrapper, without its cost when nothing listens.

torch wraps every optimizer's ``step`` (``Optimizer.profile_hook_step``) to open a profiler range and
to run the step hooks, global and per optimizer. The range costs its few microseconds even with no
profiler running: 8.8 us of CPUAdam's 22 us step on a 1-element param here, more than the kernel.
:func:`lean_step` wraps a step the same way, but calls it directly when no hook is registered and
no profiler is on, and through torch's own wrapper otherwise, so hooks, their argument rewriting,
``_optimizer_step_code`` and the profiler's ``Optimizer.step#<class>.step`` range stay exactly
torch's.

It reads two private names, ``torch.optim.optimizer._global_optimizer_pre_hooks`` /
``_global_optimizer_post_hooks`` (what ``register_optimizer_step_pre_hook`` fills) and
``torch._C._autograd._profiler_enabled``. Where a torch lacks one of them, every step takes
torch's wrapper (``tests/kernels/cpu_adam/test_cpu_adam_optim.py`` checks both ways).
"""

from __future__ import annotations

import functools

import torch


def _fast_path_facts():
    """The global hook dicts and the profiler probe, or None when this torch lacks them."""
    from torch.optim import optimizer as optim_mod

    pre = getattr(optim_mod, "_global_optimizer_pre_hooks", None)
    post = getattr(optim_mod, "_global_optimizer_post_hooks", None)
    probe = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    if not isinstance(pre, dict) or not isinstance(post, dict) or not callable(probe):
        return None
    return pre, post, probe


FACTS = _fast_path_facts()
"""None: this torch lacks a private name, and every step goes through torch's wrapper."""


def lean_step(func):
    """Decorate an ``Optimizer`` subclass's ``step``; torch then leaves it as it is (``hooked``).

    Under ``torch.compile`` (``torch.compile(opt.step)``, or a compiled training step that calls it)
    the step runs as it is, eagerly (through ``torch.compiler.disable``): opforge's steps are fused
    C++ kernel calls over every param already, and dynamo tracing into one would hand the kernel
    fake tensors, which it refuses."""
    hooked = torch.optim.Optimizer.profile_hook_step(func)

    @functools.wraps(func)
    def step(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # traced: call the step as it is (a graph break), not its insides
            return eager(self, *args, **kwargs)
        if FACTS is not None:
            pre, post, profiling = FACTS
            if not (pre or post or self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or profiling()):
                out = func(self, *args, **kwargs)
                self._optimizer_step_code()
                return out
        return hooked(self, *args, **kwargs)

    eager = torch.compiler.disable(step)  # (a wrapper every call would pay for: 0.3 us of a 9.5 us step)
    step.hooked = True  # Optimizer._patch_step_function: already wrapped, leave it
    return step
