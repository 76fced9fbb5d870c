"""`gc train`: SGD on a synthetic data set the net can learn, through the make-train-step pass.

The loss function (@main) gets its @train_step from the pass, compiled once (or run on the
interpreter); the loop feeds it one batch after another and its new weights back in. The data set is
made to be learnable:

- classification (softmax_cross_entropy over labels that are an argument): each class has a random
  prototype per float data input, and an example of class c is its prototype plus unit noise;
- regression (a loss op reading a target argument directly, such as mse_loss): the targets are what
  the same net computes with other random weights (a teacher), on unit Gaussian inputs;
- anything else: seeded random inputs (the loss may fall, but there is nothing to learn).

Weights start He-normal (std sqrt(2 / fan-in), PyTorch's kaiming_normal_) when at least 2-D, biases
at zero, the scale of a norm and a batch_norm variance at one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.diagnostics import GCError
from compiler.files import check_writable
from compiler.inputs import castable, save_npz
from compiler.ir import Func, Module, Value
from compiler.passes.make_train_step import build_train_step, trained_args
from compiler.rewrite import inline_calls


@dataclass
class Task:
    """A loss function ready to train: the module holding its step, and the roles of its arguments."""

    module: Module  # @entry and its step
    entry: str
    step: str  # the step's function name
    params: list[str]  # trained arguments, in argument order
    data: list[str]  # the other arguments
    batch: int | None  # the leading dimension of the data (None: the data has no batch axis)


def prepare(
    module: Module, entry: str = "main", lr: float = 0.1, params: list[str] | None = None, batch_size: int | None = None
) -> Task:
    """Inline @entry's calls, re-type it for `batch_size`, and add its training step."""
    if entry not in module:
        names = ", ".join("@" + n for n in module.funcs) or "none"
        raise GCError(f"no function @{entry} in the module (functions: {names})")
    module = module.clone()
    f = module[entry]
    inline_calls(module, f)
    trained = [a.name for a in trained_args(f, params or ())]
    data = [a.name for a in f.args if a.name not in trained]
    batch = _batch(f, data)
    if batch_size is not None and batch_size != batch:
        if batch is None:
            raise GCError(f"--batch-size: the data of @{entry} ({_names(data)}) has no batch dimension to change")
        rebatch(f, data, batch, batch_size)
        batch = batch_size
    step = build_train_step(module, f, lr, trained)
    module.add(step)
    return Task(module, entry, step.name, trained, data, batch)


def _names(names: list[str]) -> str:
    return ", ".join("%" + n for n in names) or "none"


def _batch(f: Func, data: list[str]) -> int | None:
    """The batch size: the leading dimension of the first data argument."""
    first = next((a for a in f.args if a.name in data), None)
    return first.type.shape[0] if first is not None and first.type.rank > 0 else None


def rebatch(f: Func, data: list[str], old: int, new: int) -> None:
    """Give the data arguments whose leading dimension is `old` the leading dimension `new` and infer every
    type again; a net that spells its batch size in an attribute (a reshape) cannot change it."""
    if new < 1:
        raise GCError(f"--batch-size must be at least 1, got {new}")
    for a in f.args:
        if a.name in data and a.type.rank > 0 and a.type.shape[0] == old:
            a.type = a.type.with_shape((new, *a.type.shape[1:]))
    for op in f.ops:
        try:
            types = op.infer_types()
        except GCError as e:
            raise GCError(f"cannot train @{f.name} at batch size {new}: {e.diagnostics[0].message}", op.loc) from None
        for r, t in zip(op.results, types):
            r.type = t
    f.result_types = [v.type for v in f.results]


# --- weights --------------------------------------------------------------------------------------------


def init_params(f: Func, params: list[str], seed: int) -> dict[str, np.ndarray]:
    """He-normal weights (std sqrt(2 / fan-in)) for tensors of rank >= 2, zeros for biases, ones for what
    an op says starts at one (a layer_norm's or batch_norm's scale, a batch_norm variance)."""
    rng = np.random.default_rng(seed)
    uses = f.users()
    out = {}
    for a in f.args:
        if a.name not in params:
            continue
        t = a.type
        roles = [(op, i) for op, i in uses.get(a, []) if op is not None]
        if t.rank >= 2:
            x = rng.standard_normal(t.shape) * math.sqrt(2.0 / _fan_in(t.shape, roles))
        elif any(i in op.unit_operands for op, i in roles):
            x = np.ones(t.shape)
        else:
            x = np.zeros(t.shape)
        out[a.name] = x.astype(t.dtype.np)
    return out


def _fan_in(shape: tuple[int, ...], roles: list) -> int:
    """Inputs per output, as the op reading the weight says (K of a [K, N] matmul weight, C*kh*kw of an
    OIHW conv2d weight); else all but the first axis, as of an OIHW weight."""
    said = next((n for op, i in roles if (n := op.fan_in(i, shape))), None)
    return said or max(math.prod(shape[1:]), 1)


def load_params(path: str, f: Func, params: list[str]) -> dict[str, np.ndarray]:
    """Weights from an .npz keyed by argument name, checked against @f's trained arguments."""
    from compiler.inputs import load_npz

    given = load_npz(path)
    types = {a.name: a.type for a in f.args}
    for name, x in given.items():
        if name not in types:
            raise GCError(f"{path}: @{f.name} has no argument %{name} (it trains {_names(params)})")
        if name not in params:
            raise GCError(f"{path}: %{name} is data, not a trained weight (trained: {_names(params)})")
        t = types[name]
        if tuple(x.shape) != t.shape or not castable(x.dtype, t.dtype.np):
            raise GCError(f"{path}: %{name} is {list(x.shape)} {x.dtype}, @{f.name} takes {t}")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise GCError(f"{path}: %{name} holds NaN or infinity: training cannot start from it")
    return {k: v.astype(types[k].dtype.np) for k, v in given.items()}


# --- data -----------------------------------------------------------------------------------------------


def synthetic_data(task: Task, examples: int, seed: int) -> tuple[dict[str, np.ndarray], str]:
    """A data set of `examples` rows (whole batches) for the data arguments, and a line describing it.
    Arguments without the batch dimension get one value for every step."""
    f = task.module[task.entry]
    rng = np.random.default_rng(seed + 1)
    n = task.batch or 1
    batches = max(1, -(-examples // n))
    loss_op = f.results[0].owner
    args = {a.name: a for a in f.args}
    direct = [v for v in (loss_op.operands if loss_op is not None else []) if v in f.args and v.name in task.data]
    hook = getattr(loss_op, "input_range", None)
    for v in direct:
        valid = hook(loss_op.operands.index(v)) if hook is not None and v.type.dtype.is_int else None
        if valid is not None:  # class labels: an integer operand whose valid values [0, C) the loss states
            return _clusters(task, args, v, int(valid[1]), batches, rng)
    if direct and direct[0].type.dtype.is_float and loss_op is not None:
        pred = next((v for v in loss_op.operands if v is not direct[0]), None)
        if pred is not None and pred.type == direct[0].type:
            return _teacher(task, direct[0], pred, batches, seed)
    data = _stack([_random(task, seed + 1 + b) for b in range(batches)], task)
    return data, f"{batches * n} random examples (the loss reads no target argument: nothing to learn)"


def _batched(task: Task, a: Value) -> bool:
    return task.batch is not None and a.type.rank > 0 and a.type.shape[0] == task.batch


def _stack(per_batch: list[dict[str, np.ndarray]], task: Task) -> dict[str, np.ndarray]:
    f = task.module[task.entry]
    out = {}
    for a in f.args:
        if a.name in task.data:
            parts = [d[a.name] for d in per_batch]
            out[a.name] = np.concatenate(parts) if _batched(task, a) else parts[0]
    return out


def _random(task: Task, seed: int) -> dict[str, np.ndarray]:
    from compiler.inputs import random_inputs

    f = task.module[task.entry]
    made = random_inputs(f, seed, task.module)
    return {k: v for k, v in made.items() if k in task.data}


def _clusters(
    task: Task, args: dict[str, Value], labels: Value, classes: int, batches: int, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], str]:
    """Labels uniform over the classes; each batched float input its class's prototype plus unit noise."""
    n = batches * task.batch
    y = rng.integers(0, classes, n)
    data = {labels.name: y.astype(labels.type.dtype.np)}
    rest = _random(task, int(rng.integers(2**31)))
    for name in task.data:
        a = args[name]
        if name == labels.name:
            continue
        if a.type.dtype.is_float and _batched(task, a):
            # Prototypes 4 noise deviations apart whatever the size: learnable, yet not in one step.
            size = math.prod(a.type.shape[1:])
            protos = rng.standard_normal((classes, *a.type.shape[1:])) * (4 / math.sqrt(2 * max(size, 1)))
            noise = rng.standard_normal((n, *a.type.shape[1:]))
            data[name] = (protos[y] + noise).astype(a.type.dtype.np)
        else:
            data[name] = np.concatenate([rest[name]] * batches) if _batched(task, a) else rest[name]
    return data, f"{n} examples of {classes} classes (a Gaussian cluster per class, 4 deviations apart)"


def _teacher(task: Task, target: Value, pred: Value, batches: int, seed: int) -> tuple[dict[str, np.ndarray], str]:
    """Unit Gaussian inputs; the targets are the net's own prediction under other random weights."""
    from compiler.interpreter import run_func
    from compiler.rewrite import erase_dead_ops

    f = task.module[task.entry]
    net = Func(f"{f.name}_teacher", f.args, [pred.type])  # the ops up to the prediction, shared with @f
    net.ops, net.results = list(f.ops), [pred]
    erase_dead_ops(net)
    teacher = init_params(f, task.params, seed + 7919)
    per_batch = []
    for b in range(batches):
        d = _random(task, seed + 1 + b)
        inputs = {**d, **teacher}
        d[target.name] = run_func(task.module, net, [inputs.get(a.name, _zeros(a)) for a in f.args])[0]
        per_batch.append(d)
    n = batches * (task.batch or 1)
    return _stack(per_batch, task), f"{n} examples; the targets are the same net's output under other random weights"


def _zeros(a: Value) -> np.ndarray:
    return np.zeros(a.type.shape, a.type.dtype.np)


# --- the loop -------------------------------------------------------------------------------------------


def step_function(task: Task, target: str) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The training step as a function of its arguments (in order) returning (loss, new weights...):
    compiled once for llvm or cuda, or the reference interpreter for interp."""
    if target == "interp":
        from compiler.interpreter import run_func

        f = task.module[task.step]
        return lambda args: run_func(task.module, f, args)
    import compiler

    model = compiler.compile(task.module, target, entry=task.step)
    f = task.module[task.step]
    positions = [i for i, a in enumerate(f.args) if a.name in task.params]
    spare: list[list[np.ndarray]] = []

    def run(args: list[np.ndarray]) -> list[np.ndarray]:
        # The new weights go into the arrays of the weights before: nothing is allocated per step.
        outs = spare.pop() if spare else [np.empty(t.shape, t.dtype.np) for t in f.result_types[1:]]
        got = model.run_into([np.empty((), f.result_types[0].dtype.np), *outs], *args)
        spare.append([args[i] for i in positions])
        return got

    return run


def train(
    task: Task,
    step: Callable,
    weights: dict[str, np.ndarray],
    data: dict[str, np.ndarray],
    steps: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Run `steps` SGD steps over `data` (batches in a shuffled order, reshuffled each epoch); the loss of
    every step and the final weights."""
    f = task.module[task.step]
    n = task.batch or 1
    batched = {a.name for a in f.args if a.name in task.data and a.type.rank > 0 and a.type.shape[0] == task.batch}
    rows = next((len(data[k]) for k in batched), n)
    batches = max(1, rows // n)
    rng = np.random.default_rng(seed + 2)
    order: list[int] = []
    weights = {k: np.array(v) for k, v in weights.items()}  # the step may reuse their memory
    losses = []
    for s in range(steps):
        if not order:
            order = list(rng.permutation(batches))
        b = order.pop()
        batch = {k: x[b * n : (b + 1) * n] if k in batched else x for k, x in data.items()}
        outs = step([weights[a.name] if a.name in weights else batch[a.name] for a in f.args])
        loss = float(outs[0])
        if not math.isfinite(loss):
            raise GCError(f"the loss is {loss} at step {s + 1}: the steps diverged; try a smaller --lr")
        losses.append(loss)
        weights.update(zip(task.params, outs[1:]))
        if on_step is not None:
            on_step(s + 1, loss)
    return losses, weights


class Progress:
    """The loss as training goes: tqdm's bar when it is installed, else one line on stderr, rewritten in
    place on a terminal and printed at every tenth of the run otherwise."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.start = self.shown = time.perf_counter()
        self.tty = self.stream.isatty()
        self.bar = None
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="train", unit="step", file=self.stream, dynamic_ncols=True)
        except ImportError:
            pass

    def __call__(self, step: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            return
        now = time.perf_counter()
        tenth = max(1, self.total // 10)
        if self.tty and (now - self.shown > 0.1 or step == self.total):
            self.shown = now
            self.stream.write(f"\r{self._line(step, loss, now)}" + ("\n" if step == self.total else ""))
            self.stream.flush()
        elif not self.tty and (step % tenth == 0 or step == self.total or step == 1):
            self.stream.write(self._line(step, loss, now) + "\n")

    def _line(self, step: int, loss: float, now: float) -> str:
        width = 24
        done = int(width * step / self.total)
        rate = step / max(now - self.start, 1e-9)
        return (
            f"train [{'#' * done}{'.' * (width - done)}] step {step}/{self.total}  loss {loss:.4g}  {rate:.1f} steps/s"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_train(args) -> int:
    """`gc train FILE.gir --steps N`: train on a synthetic data set, print the first and last loss, save the weights."""
    from pathlib import Path

    from compiler.parser import parse_file

    if args.steps < 1:
        raise GCError(f"--steps must be at least 1, got {args.steps}")
    if args.examples is not None and args.examples < 1:
        raise GCError(f"--examples must be at least 1, got {args.examples}")
    out = args.output or Path(args.file).stem + ".trained.npz"
    check_writable(out)  # before training
    module = parse_file(args.file)
    params = [n.strip() for n in args.train.split(",") if n.strip()] if args.train else None
    task = prepare(module, args.entry, args.lr, params, args.batch_size)
    f = task.module[task.entry]
    weights = init_params(f, task.params, args.seed)
    if args.params:
        weights.update(load_params(args.params, f, task.params))
    examples = args.examples or 16 * (task.batch or 1)
    data, about = synthetic_data(task, examples, args.seed)
    print(
        f"gc train: @{task.entry}, {len(task.params)} weight tensors ({_names(task.params)}, "
        f"{sum(w.size for w in weights.values()):,} values); data: {about}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    step = step_function(task, args.target)
    if args.target != "interp":
        print(f"gc train: compiled @{task.step} for {args.target} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    progress = Progress(args.steps)
    t0 = time.perf_counter()
    try:
        losses, trained = train(task, step, weights, data, args.steps, args.seed, progress)
    finally:
        progress.close()
    seconds = time.perf_counter() - t0
    save_npz(out, trained)
    print(f"first loss {losses[0]:.6g}")
    print(
        f"last loss {losses[-1]:.6g} ({losses[-1] / losses[0]:.1%} of the first)"
        if losses[0]
        else f"last loss {losses[-1]:.6g}"
    )
    print(
        f"gc train: {args.steps} steps in {seconds:.2f} s ({seconds / args.steps * 1e3:.2f} ms a step, "
        f"batch {task.batch or 1}, lr {args.lr:g}, {args.target}); wrote {out}",
        file=sys.stderr,
    )
    return 0
