"""Loading a ``baseline.py``: the ground truth and the speed reference.

A baseline file defines

* ``get_inputs()`` -> list of inputs for one call (``op(*inputs)``), drawn from
  torch's random generator so the harness can draw fresh, reproducible sets by
  seeding it;
* either ``get_reference_output(*inputs)`` (the ground truth) or a ``Model``
  class (``nn.Module``; optional ``get_init_inputs()`` gives its constructor
  arguments; run in eval mode without grad);
* optionally ``get_correctness_inputs()`` -> list of further input lists
  (tail shapes, other dtypes) checked for correctness only;
* optionally ``run_baseline(*inputs)``: the *speed* reference, when the ground
  truth is computed differently (e.g. in float64) from what a user would run;
  without it the reference itself is timed;
* optionally ``FLOPS`` and ``BYTES``: numbers, or callables of the inputs;
* optionally ``PERSISTENT_INPUTS``: the positions of inputs a model keeps in
  memory between calls (weights, KV caches), e.g. ``(1, 2)``: before each timed
  call they are evicted from the caches while the other inputs stay cached
  (``bench/eviction.py``), so the call reads them from memory as a model's
  layer does.

Every malformation is a :class:`UsageError` (exit 2) naming the file and the fix.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import random
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .bench import tree
from .errors import UsageError

_counter = itertools.count()


def seed_everything(seed: int) -> None:
    """Seed every generator a baseline might draw from."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UsageError(
            f"Baseline file {path} does not exist or is not a file. Pass the path of a "
            "baseline.py that defines get_inputs() and get_reference_output() or a Model class."
        )
    name = f"_kernel_harness_baseline_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"Baseline file {path} cannot be imported as Python; give it a .py name.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Baseline file {path} is unreadable: {exc}. Check its permissions "
                         "and encoding (UTF-8).") from exc
    except SyntaxError as exc:
        raise UsageError(f"Baseline file {path} has a syntax error at line {exc.lineno}: "
                         f"{exc.msg}. Fix the file and rerun.") from exc
    except Exception as exc:  # noqa: BLE001 - any error in user code is bad input
        raise UsageError(f"Baseline file {path} raised {type(exc).__name__} while being "
                         f"imported: {exc} ({_where(exc, path)}). Fix the file and rerun.") from exc
    return module


def _where(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
    return f"line {frames[-1].lineno}" if frames else "during import"


@dataclass
class Baseline:
    """A loaded baseline file with helpers that validate what it returns."""

    path: Path
    module: ModuleType
    has_reference_function: bool
    has_correctness_inputs: bool
    has_run_baseline: bool
    persistent_inputs: tuple[int, ...] = ()
    _model: Any = field(default=None, repr=False)

    # ---------------------------------------------------------------- inputs

    def _call_user(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            with torch.no_grad():
                return fn(*args)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"{name} in baseline file {self.path} raised "
                             f"{type(exc).__name__}: {exc} ({_where(exc, self.path)}). "
                             "Fix the baseline file.") from exc

    def draw_inputs(self, seed: int) -> list[Any]:
        """``get_inputs()`` with every random generator seeded with ``seed``."""
        seed_everything(seed)
        inputs = self._call_user("get_inputs()", self.module.get_inputs)
        return self._as_input_list(inputs, "get_inputs()")

    def draw_correctness_inputs(self, seed: int) -> list[list[Any]]:
        """``get_correctness_inputs()`` (seeded), or ``[]`` when the file has none."""
        if not self.has_correctness_inputs:
            return []
        seed_everything(seed)
        sets = self._call_user("get_correctness_inputs()", self.module.get_correctness_inputs)
        if not isinstance(sets, (list, tuple)):
            raise UsageError(f"get_correctness_inputs() in {self.path} returned "
                             f"{type(sets).__name__}; it must return a list of input lists, "
                             "e.g. [[x1, w1], [x2, w2]].")
        return [self._as_input_list(s, f"get_correctness_inputs()[{i}]") for i, s in enumerate(sets)]

    def _as_input_list(self, inputs: Any, what: str) -> list[Any]:
        if not isinstance(inputs, (list, tuple)):
            raise UsageError(f"{what} in {self.path} returned {type(inputs).__name__}; it must "
                             "return a list of the op's arguments, e.g. [x, weight, eps].")
        return list(inputs)

    # ---------------------------------------------------------------- outputs

    def _get_model(self) -> Any:
        if self._model is None:
            init = []
            if hasattr(self.module, "get_init_inputs"):
                init = self._call_user("get_init_inputs()", self.module.get_init_inputs)
                if not isinstance(init, (list, tuple)):
                    raise UsageError(f"get_init_inputs() in {self.path} must return a list of "
                                     f"Model constructor arguments, not {type(init).__name__}.")
            # parameters drawn at construction must be the same in every process
            seed_everything(0)
            model = self._call_user("Model(*get_init_inputs())", self.module.Model, *init)
            if hasattr(model, "eval"):
                model.eval()
            self._model = model
        return self._model

    def reference(self, inputs: list[Any]) -> Any:
        """The ground truth for ``inputs`` (never run in the kernel's process)."""
        if self.has_reference_function:
            return self._call_user("get_reference_output()", self.module.get_reference_output, *inputs)
        return self._call_user("Model.forward()", self._get_model(), *inputs)

    def speed_function(self) -> Callable[..., Any]:
        """What is timed as the baseline: ``run_baseline`` or else the reference."""
        if self.has_run_baseline:
            return self.module.run_baseline
        if self.has_reference_function:
            return self.module.get_reference_output
        return self._get_model()

    def run_speed_baseline(self, inputs: list[Any]) -> Any:
        return self._call_user("the baseline", self.speed_function(), *inputs)

    def oracle(self, inputs: list[Any]) -> Any:
        """The reference evaluated on float64 copies of the inputs (``--oracle fp64``)."""
        wide = [_to_fp64(x) for x in inputs]
        if self.has_reference_function:
            return self._call_user("get_reference_output() on float64 inputs",
                                   self.module.get_reference_output, *wide)
        model = copy.deepcopy(self._get_model())
        if hasattr(model, "double"):
            model = model.double()
        return self._call_user("Model.forward() on float64 inputs", model, *wide)

    # ---------------------------------------------------------------- roofline

    def amount(self, name: str, inputs: list[Any]) -> float | None:
        """``FLOPS``/``BYTES`` for ``inputs`` when the baseline defines them."""
        value = getattr(self.module, name, None)
        if value is None:
            return None
        if callable(value):
            value = self._call_user(f"{name}()", value, *inputs)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"{name} in {self.path} must be a non-negative number or a function "
                             f"of the inputs returning one, not {value!r}.")
        return float(value)


def _to_fp64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.detach().to(torch.float64)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fp64(v) for v in value)
    return value


def load_baseline(path: str | Path) -> Baseline:
    """Import and validate a baseline file (see module docstring)."""
    path = Path(path)
    module = _import_file(path)
    if not callable(getattr(module, "get_inputs", None)):
        raise UsageError(f"Baseline file {path} defines no get_inputs(). Add a function "
                         "get_inputs() returning the list of arguments of one call.")
    has_ref = callable(getattr(module, "get_reference_output", None))
    has_model = isinstance(getattr(module, "Model", None), type)
    if not has_ref and not has_model:
        raise UsageError(f"Baseline file {path} defines neither get_reference_output(*inputs) "
                         "nor a Model class. Add one of them: it is the ground truth.")
    has_corr = hasattr(module, "get_correctness_inputs")
    if has_corr and not callable(module.get_correctness_inputs):
        raise UsageError(f"get_correctness_inputs in {path} is not a function.")
    has_run = hasattr(module, "run_baseline")
    if has_run and not callable(module.run_baseline):
        raise UsageError(f"run_baseline in {path} is not a function.")
    return Baseline(path=path.resolve(), module=module, has_reference_function=has_ref,
                    has_correctness_inputs=has_corr, has_run_baseline=has_run,
                    persistent_inputs=persistent_positions(getattr(module, "PERSISTENT_INPUTS", None), path))


def persistent_positions(positions: Any, path: Path) -> tuple[int, ...]:
    """``PERSISTENT_INPUTS`` checked: distinct non-negative input positions."""
    if positions is None:
        return ()
    if not isinstance(positions, (list, tuple)) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions):
        raise UsageError(f"PERSISTENT_INPUTS in {path} must be a tuple of input positions (non-negative "
                         f"integers, e.g. (1, 2) for a weight and its bias), not {positions!r}. Fix the "
                         "baseline file.")
    if len(set(positions)) != len(positions):
        raise UsageError(f"PERSISTENT_INPUTS in {path} names a position twice: {positions!r}. List each "
                         "input once.")
    return tuple(sorted(positions))


def check_persistent_positions(baseline: Baseline, inputs: list[Any]) -> None:
    """Every ``PERSISTENT_INPUTS`` position lies within ``get_inputs()``'s list and one at least
    holds a tensor: a position past the list (a 1-based count, say) would be skipped in every
    call, each still paying the cache scrub, and the report would claim inputs from memory."""
    named = baseline.persistent_inputs
    if not named:
        return
    outside = [p for p in named if p >= len(inputs)]
    if outside:
        raise UsageError(f"PERSISTENT_INPUTS in {baseline.path} names position(s) {outside}, but get_inputs() "
                         f"returns {len(inputs)} inputs (positions 0-{len(inputs) - 1}, counted from 0). "
                         "Name the positions of the weights or caches in that list.")
    if not any(tree.tensors(inputs[p]) for p in named):
        raise UsageError(f"PERSISTENT_INPUTS in {baseline.path} names {list(named)}, but get_inputs() holds no "
                         "tensor there; name the positions of the weight or cache tensors.")
