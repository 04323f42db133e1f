"""A training loop that saves a checkpoint when gpuwarden asks, and resumes from it.

Launch it with the checkpoint signal declared in its environment (gpuwarden reads the
environment a process started with, so set it here, not inside the script)::

    GPUWARDEN_CHECKPOINT_SIGNAL=SIGUSR1 GPUWARDEN_PRIORITY=normal \\
        python examples/train_with_checkpoint.py --steps 2000 --checkpoint /scratch/ckpt.json

It uses PyTorch when it is installed (a one-layer model fitted to y = 2x + 1, saved with
``torch.save``) and plain Python otherwise (the same model as two floats, saved as JSON), so it
runs anywhere. Either way:

- each step trains; at the end of each step ``job.maybe_checkpoint()`` saves and acknowledges
  if gpuwarden signalled (the signal handler itself only sets a flag);
- SIGTERM (what a ``kill`` step sends first, ``grace`` seconds before SIGKILL) saves one last
  checkpoint and exits 0;
- a checkpoint is written to a temporary file and renamed, so a kill mid-save never leaves a
  torn file, and a restart resumes from the last step saved.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from gpuwarden import job


class PlainModel:
    """y = w * x + b, fitted by stochastic gradient descent: PyTorch's shape, no PyTorch."""

    suffix = ".json"

    def __init__(self, lr: float) -> None:
        self.weights = {"w": 0.0, "b": 0.0}
        self.lr = lr

    def step(self, rng: random.Random) -> float:
        x = rng.uniform(-1.0, 1.0)
        error = self.weights["w"] * x + self.weights["b"] - (2.0 * x + 1.0)
        self.weights["w"] -= self.lr * 2 * error * x
        self.weights["b"] -= self.lr * 2 * error
        return error * error

    def state_dict(self) -> dict[str, Any]:
        return dict(self.weights)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = {"w": float(state["w"]), "b": float(state["b"])}

    def save(self, state: dict[str, Any], path: Path) -> None:
        path.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")

    def load(self, path: Path) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return loaded


class TorchModel(PlainModel):
    """The same model with PyTorch (used only when it is installed)."""

    suffix = ".pt"

    def __init__(self, lr: float) -> None:
        torch = importlib.import_module("torch")  # ImportError without PyTorch
        self.torch = torch
        self.net = torch.nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=lr)

    def step(self, rng: random.Random) -> float:
        x = self.torch.tensor([[rng.uniform(-1.0, 1.0)]])
        loss = ((self.net(x) - (2.0 * x + 1.0)) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, state: dict[str, Any], path: Path) -> None:
        self.torch.save(state, path)

    def load(self, path: Path) -> dict[str, Any]:
        loaded: dict[str, Any] = self.torch.load(path, weights_only=False)
        return loaded


def make_model(lr: float, use_torch: bool) -> PlainModel:
    if use_torch:
        try:
            return TorchModel(lr)
        except ImportError:
            pass
    return PlainModel(lr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="train until this step")
    parser.add_argument("--step-time", type=float, default=0.01, help="seconds per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint"))
    parser.add_argument("--no-torch", action="store_true", help="plain Python even with torch")
    args = parser.parse_args(argv)

    model = make_model(args.lr, use_torch=not args.no_torch)
    path = args.checkpoint.with_suffix(model.suffix)
    step = 0
    if path.exists():  # resume where the last run left off
        saved = model.load(path)
        model.load_state_dict(saved["state"])
        step = int(saved["step"])
        print(f"resumed from {path} at step {step}", flush=True)
    rng = random.Random(step)  # noqa: S311 (training data, not secrets)

    def save_checkpoint() -> str:
        tmp = path.with_name(f".{path.name}.tmp")
        model.save({"step": step, "state": model.state_dict()}, tmp)
        os.replace(tmp, path)  # all or nothing, even if we are killed mid-save
        print(f"checkpoint step={step} path={path}", flush=True)
        return f"step {step} saved to {path}"

    job.on_checkpoint(save_checkpoint)  # the handler for GPUWARDEN_CHECKPOINT_SIGNAL
    stopping: list[int] = []

    def on_term(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    if job.signal_from_name(os.environ.get("GPUWARDEN_CHECKPOINT_SIGNAL")) != signal.SIGTERM:
        signal.signal(signal.SIGTERM, on_term)
    print(f"ready pid={os.getpid()} model={type(model).__name__}", flush=True)

    loss = 0.0
    while step < args.steps and not stopping:
        loss = model.step(rng)
        step += 1
        if step % 100 == 0:
            print(f"step={step} loss={loss:.6f}", flush=True)
        job.maybe_checkpoint()  # a safe point: the step is complete
        time.sleep(args.step_time)

    save_checkpoint()
    why = "stopped by SIGTERM" if stopping else "done"
    print(f"{why} at step={step} loss={loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
