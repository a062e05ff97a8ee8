"""TensorBoard scalars of a training run (config `logging: {tensorboard: true}`; off by default).

`TensorBoardLog` writes under `<run>/tensorboard/` (layout.TENSORBOARD_DIR), with the environment steps as the
x axis, every `EVERY_STEPS` environment steps and at every checkpoint:

* `episode/return`, `episode/success`: mean return and strict success of the training episodes that ended
  since the last write (nothing when none ended);
* `agent/<metric>`: the agent's latest `update()` metrics, the ones the progress lines show (DQN: `td_loss`,
  `q_mean`, `epsilon`; PPO: `policy_loss`, `value_loss`, `entropy`, `approx_kl`, `clip_fraction`; ...);
* `perf/env_steps_per_second`: environment steps per wall-clock second since the last write.

It only reads what the loop already has and draws no random numbers, so a run's checkpoints are the same
bytes with it on or off (tested). It is not part of the run's fingerprint: a finished run is not trained again
for it. A resumed run hides (TensorBoard's `purge_step`) what the killed process wrote after its last
checkpoint, then writes those steps again; a fresh start removes the folder of an earlier run.

`tensorboard` is an optional dependency (`pip install tapebench[tensorboard]`).
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from tapebench.layout import TENSORBOARD_DIR

EVERY_STEPS = 1_000
INSTALL_HINT = "pip install tapebench[tensorboard]"


def tensorboard_installed() -> bool:
    """Whether the optional tensorboard package can be found (looked up, not imported: no torch import)."""
    return importlib.util.find_spec("tensorboard") is not None


def summary_writer_class():
    """torch's SummaryWriter; a clear error when the optional tensorboard package is missing."""
    try:
        # torch.utils.tensorboard needs the optional tensorboard package: loaded only when a run asks for it
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ValueError(f"TensorBoard logging is on (logging: {{tensorboard: true}}) but the tensorboard package "
                         f"cannot be imported ({exc}); install it with `{INSTALL_HINT}` or turn the logging off"
                         ) from None
    return SummaryWriter


class TensorBoardLog:
    """The scalars of one run; `start_steps` > 0 when it resumes (what was written after it is purged)."""

    def __init__(self, run_dir, start_steps: int = 0):
        SummaryWriter = summary_writer_class()
        self.path = Path(run_dir) / TENSORBOARD_DIR
        # events at steps after the last checkpoint were written by the killed process: hide them
        self.writer = SummaryWriter(log_dir=str(self.path), purge_step=start_steps + 1 if start_steps else None)
        self.returns: list[float] = []
        self.successes: list[float] = []
        self.last_steps, self.last_time = start_steps, time.perf_counter()
        self.next_write = (start_steps // EVERY_STEPS + 1) * EVERY_STEPS

    def episodes(self, returns, successes) -> None:
        """Training episodes that just ended: their returns and strict successes."""
        self.returns.extend(returns)
        self.successes.extend(float(s) for s in successes)

    def step(self, env_steps: int, metrics: dict, checkpoint: bool = False) -> None:
        """After a batched step: write when `EVERY_STEPS` more steps are done, and at every checkpoint."""
        if env_steps < self.next_write and not checkpoint:
            return
        self.next_write = (env_steps // EVERY_STEPS + 1) * EVERY_STEPS
        w = self.writer
        if self.returns:
            w.add_scalar("episode/return", sum(self.returns) / len(self.returns), env_steps)
            w.add_scalar("episode/success", sum(self.successes) / len(self.successes), env_steps)
            self.returns, self.successes = [], []
        for name, value in sorted(metrics.items()):
            w.add_scalar(f"agent/{name}", float(value), env_steps)
        now = time.perf_counter()
        if now > self.last_time and env_steps > self.last_steps:
            w.add_scalar("perf/env_steps_per_second", (env_steps - self.last_steps) / (now - self.last_time),
                         env_steps)
        self.last_steps, self.last_time = env_steps, now
        if checkpoint:
            w.flush()

    def close(self) -> None:
        self.writer.close()
