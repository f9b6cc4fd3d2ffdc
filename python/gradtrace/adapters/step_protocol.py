"""Where FINAL is taken, whatever way the optimizer is stepped.

FINAL must hold the gradient the update uses. ``optimizer.step()`` without a closure uses what
``.grad`` holds when it is called: FINAL is taken in torch's step pre-hook. ``optimizer.step(closure)``
(Lightning, Fabric, LBFGS) runs the closure inside ``step()``, after that pre-hook, and the closure
runs the last micro-batch's forward and backward (and, under Lightning, clipping): taken in the
pre-hook, FINAL would hold the previous micro-batch's local, unreduced gradient. So the pre-hook hands
``step()`` a closure of its own that runs the user's and takes FINAL right after its first evaluation.

An optimizer that evaluates its closure more than once per step (LBFGS: up to ``max_iter`` times, each
at new parameters) updates with all of those gradients; FINAL holds the first evaluation's (at the
step's starting point, the one a first-order optimizer would use), said once in a warning, and the later
evaluations are not recorded (no PRE/POST, no micro-step, no StepInfo) so that every step has one
record of each.

A step the optimizer skips (a GradScaler that found inf/NaN gradients calls no ``optimizer.step``) would
otherwise merge its micro-steps into the next step's records. It shows as ``optimizer.zero_grad()`` called
after micro-steps ran but before any step since the last ``zero_grad``: that step is closed with no FINAL (it
updated nothing), said once in a warning, and the next one is the next step number. Gradients zeroed another
way (``model.zero_grad()``, ``set_to_none`` by hand) are not seen: such a skip stays merged.
"""

from __future__ import annotations

import warnings

REEVALUATION_WARNING = ("gradtrace: {name} evaluated its closure {count} times in step {step}: FINAL holds the "
                        "first evaluation's gradient (at the step's starting point); the update also used the later "
                        "evaluations, which are not recorded")


def torch_optimizer(optimizer):
    """The torch optimizer a wrapper steps: Accelerate's AcceleratedOptimizer (``.optimizer``; it skips the
    step while accumulating), Lightning's LightningOptimizer and Fabric's _FabricOptimizer (``._optimizer``;
    both pose as the optimizer's class). A torch optimizer is returned as it is."""
    import torch

    for _ in range(8):  # wrappers of wrappers, never a cycle
        own = vars(optimizer) if hasattr(optimizer, "__dict__") else {}
        inner = own.get("_optimizer", own.get("optimizer"))
        if not isinstance(inner, torch.optim.Optimizer):
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"gradtrace: {type(optimizer).__name__} is not a torch.optim.Optimizer (nor a wrapper of "
                        "one): FINAL is taken at the optimizer's step, so pass the torch optimizer")
    return optimizer


class StepHooks:
    """torch's step hooks on one optimizer: ``before()`` when the gradients the update uses are final
    (at the pre-hook, or after the step's first closure evaluation), ``after()`` behind the step.
    ``reevaluation``: a context manager factory the later closure evaluations of a step run inside
    (the recorder's: nothing of them is recorded), or None."""

    def __init__(self, optimizer, before, after, reevaluation=None, recorder=None):
        self.optimizer = torch_optimizer(optimizer)
        self._before, self._after = before, after
        self._reevaluation = reevaluation
        self._recorder = recorder
        self._evaluations = 0
        self._closure_step = False
        self._warned = False
        self._stepped = True  # an optimizer step since the last zero_grad (or none yet)
        self._in_step = False  # inside step(): its closure's zero_grad is part of the step
        self.handles = [self.optimizer.register_step_pre_hook(self._pre),
                        self.optimizer.register_step_post_hook(self._post), self._watch_zero_grad()]

    def _watch_zero_grad(self):
        """Shadows the optimizer's zero_grad with an instance attribute that first checks for a skipped step;
        the returned handle's remove() takes it away."""
        optimizer, original = self.optimizer, self.optimizer.zero_grad

        def zero_grad(*args, **kwargs):
            if not self._in_step:
                if not self._stepped and self._recorder is not None and self._recorder.forwards_this_step > 0:
                    self._recorder.skipped_step()
                self._stepped = False
            return original(*args, **kwargs)

        optimizer.zero_grad = zero_grad
        return _Unshadow(optimizer, "zero_grad")

    def _pre(self, _optimizer, args, kwargs):
        # args are step()'s own, the optimizer first: step(self, closure=None)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        self._in_step = True
        self._evaluations = 0
        self._closure_step = closure is not None
        if closure is None:
            self._before()
            return None
        wrapped = self._wrap(closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _wrap(self, closure):
        def gradtrace_closure(*a, **k):
            self._evaluations += 1
            if self._evaluations == 1:
                result = closure(*a, **k)
                self._before()  # the first evaluation's backward is done: its gradients are final
                return result
            if self._reevaluation is None:
                return closure(*a, **k)
            with self._reevaluation():
                return closure(*a, **k)

        return gradtrace_closure

    def _post(self, *_):
        self._stepped, self._in_step = True, False
        if self._closure_step and self._evaluations == 0:
            # The optimizer never ran its closure: the gradients were already there when step() began.
            self._before()
        elif self._evaluations > 1 and not self._warned:
            self._warned = True
            step = getattr(self._recorder, "step", "?")
            warnings.warn(REEVALUATION_WARNING.format(name=type(self.optimizer).__name__, count=self._evaluations,
                                                      step=step), stacklevel=3)
        self._after()


class _Unshadow:
    """Removes an instance attribute that shadows a class method (a hook handle's remove())."""

    def __init__(self, obj, name):
        self._obj, self._name = obj, name

    def remove(self) -> None:
        self._obj.__dict__.pop(self._name, None)


def optimizer_hooks(optimizer, before, after, reevaluation=None, recorder=None) -> list:
    """Runs ``before()`` when the gradients of every ``optimizer.step`` are final and ``after()`` behind it
    (:class:`StepHooks`; the optimizer's class is not changed). Returns the handles."""
    return StepHooks(optimizer, before, after, reevaluation, recorder).handles
