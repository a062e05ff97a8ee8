"""The one training loop every agent shares (docs/protocol.md#schedule).

* Environment: `BatchedTapeEnv` with `num_envs` rows (an agent hyperparameter), `BatchedGridEnv` for the 2D
  grid family (`envs.factory`, L = n * n cells); z ~ Unif(train rules) at every reset; L, H and the success bonus
  from the env config. With `env.goal: derived` (goal-conditioned methods) every episode gets a goal its rule
  reaches from its start (`training_env`, docs/protocol.md#multi-goal).
* Budget: counted in environment steps. One batched step is `num_envs` environment steps, so the
  number of parallel environments does not change the budget.
* Checkpoints at every `eval_every` environment steps and at the end. A checkpoint is taken after
  the first batched step at which the env-step count reaches the target, so when `num_envs` does
  not divide `eval_every` the checkpoint's step count is the target rounded *up* to a multiple of
  `num_envs` (and the same holds for `total_steps`); the logged and recorded counts are the true
  ones. All default configurations divide exactly.
* Each checkpoint writes `checkpoints/step_XXXXXXX.pt` (greedy policy) and then `resume.pt`
  (full training state); a killed run restarted with the same arguments resumes from `resume.pt`
  and ends with bit-identical weights on CPU. `train.json` (the manifest, with each checkpoint's
  sha256) is written last; then `resume.pt` is deleted unless asked to keep it. A run is not redone
  when its train.json matches the configuration and every checkpoint it lists is intact; a damaged
  train.json or checkpoint means the run is not finished, and it is trained again.
* Progress: a line with steps, steps/s and ETA at every checkpoint and every 30 s, to `train.log`
  and stderr (which the workflow shows on the console and keeps in the job's log); with `tensorboard`,
  also TensorBoard scalars under `<run>/tensorboard/` (`training/tensorboard.py`), which change nothing else.
* Determinism: python, numpy and torch are seeded from the run seed, the environment generator
  from a separate stream of it; on CPU `torch.use_deterministic_algorithms(True)` and a fixed
  number of torch threads (results are bit-identical for the same thread count).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tapebench import defaults
from tapebench.envs.batched import BatchedTapeEnv
from tapebench.envs.factory import batched_env, is_grid
from tapebench.envs.grid_batched import BatchedGridEnv
from tapebench.layout import TENSORBOARD_DIR
from tapebench.methods.contract import EnvSpec, check_actions
from tapebench.methods.equivariant import fingerprint_hyperparameters
from tapebench.episodes.sets import TrainingGoals
from tapebench.registry import build_config, check_rule_family, get_method, registry
from tapebench.rule_family import RuleFamily, family_from_config
from tapebench.settings import MAX_CHECKPOINTS_PER_RUN, checkpoints_per_run
from tapebench.training import checkpoint as ckpt
from tapebench.training.tensorboard import TensorBoardLog, summary_writer_class
from tapebench.utils.artifacts import CorruptArtifact, read_json
from tapebench.utils.io import content_hash, cpu_name, provenance, write_json
from tapebench.validation import (check_goal_mode, check_horizon, check_integer, check_length, check_rules,
                                  grid_side)
from tapebench.vocabulary import DERIVED_GOAL

LOG_INTERVAL_S = 30.0


@dataclass(frozen=True)
class TrainSpec:
    """Everything that determines a training run's numbers (the run fingerprint hashes all of it)."""

    agent: str
    rules: tuple[int, ...]                 # z ~ Unif(rules) at every reset
    seed: int
    hyperparameters: dict = field(default_factory=dict)   # overrides of the agent's Config
    L: int = defaults.L
    H: int = defaults.H
    success_bonus: float = defaults.SUCCESS_BONUS
    total_steps: int = defaults.TOTAL_STEPS             # environment steps
    eval_every: int = defaults.EVAL_EVERY               # environment steps between checkpoints
    split: dict | None = None              # {"name", "content_hash"} of the split the rules come from
    family: dict | None = None             # {k, r} of a non-elementary rule family, {neighbourhood} of the 2D grid
                                           # family with L = n * n cells (None: elementary)
    block: tuple[int, ...] | None = None   # the seeds it is trained with as one stacked block, where stacking does
                                           # not reproduce a one-seed run bit for bit (training/blocks.py); else None
    goal: str = defaults.GOAL              # "derived": every training episode its own goal (protocol.md#multi-goal)
    goal_steps: int = defaults.GOAL_STEPS  # derived goals: at most this many random steps from the episode's start

    def __post_init__(self):
        object.__setattr__(self, "rules", tuple(check_rules(self.rules, self.rule_family)))
        check_length(self.L)
        check_horizon(self.H)
        # total_steps 0: the untrained network, its initialisation the run's one checkpoint (the budget study's 0)
        check_integer(self.total_steps, "training.total_steps (environment steps)", minimum=0)
        check_integer(self.eval_every, "training.eval_every (environment steps)", minimum=1)
        n = checkpoints_per_run(self.total_steps, self.eval_every)
        if n > MAX_CHECKPOINTS_PER_RUN:
            raise ValueError(f"training.eval_every = {self.eval_every} gives {n} checkpoints for "
                             f"training.total_steps = {self.total_steps}; at most {MAX_CHECKPOINTS_PER_RUN} "
                             f"checkpoints per run are allowed")
        check_integer(self.seed, "seed", minimum=0)
        if not get_method(self.agent).trains:
            raise ValueError(f"method {self.agent!r} does not train; evaluate it directly with "
                             f"`tapebench evaluate --method {self.agent} --seed N ...`")
        check_rule_family(self.agent, self.rule_family)
        if is_grid(self.rule_family):
            grid_side(self.L)
        goal, goal_steps = check_goal_mode(self.goal, self.goal_steps)
        object.__setattr__(self, "goal", goal)
        object.__setattr__(self, "goal_steps", goal_steps)
        if self.derived_goals:
            if not self.rule_family.elementary:
                raise ValueError(f"env.goal: {DERIVED_GOAL}: derived goals are drawn with elementary rules, not "
                                 f"{self.rule_family.describe()}")
            if not get_method(self.agent).goal_conditioned:
                supported = sorted(m for m, entry in registry().items() if entry.goal_conditioned and entry.trains)
                raise ValueError(f"env.goal: {DERIVED_GOAL}: method {self.agent!r} does not take an episode's goal "
                                 f"(docs/protocol.md#multi-goal); the training methods that do: {supported}")

    @property
    def derived_goals(self) -> bool:
        return self.goal == DERIVED_GOAL

    @property
    def rule_family(self) -> RuleFamily:
        return family_from_config(self.family)

    def config(self):
        return build_config(self.agent, self.hyperparameters)

    def env_spec(self) -> EnvSpec:
        if is_grid(self.rule_family):
            return EnvSpec.for_grid(grid_side(self.L), self.H)
        return EnvSpec.for_tape(self.L, self.H, goal_in_obs=self.derived_goals,
                                success_bonus=self.success_bonus if self.derived_goals else None)

    def fields(self) -> dict:
        """The spec's fields; with the all-zero goal without the goal's (a run's record as before derived goals)."""
        body = dataclasses.asdict(self)
        if not self.derived_goals:
            del body["goal"], body["goal_steps"]
        return body

    def fingerprint(self) -> str:
        body = self.fields()
        if body["family"] is None:      # an elementary run's fingerprint names no family
            del body["family"]
        # defaults resolved; an MLP run leaves out the network-choice fields (its fingerprint is the plain
        # agent's)
        body["hyperparameters"] = fingerprint_hyperparameters(dataclasses.asdict(self.config()))
        return content_hash(body)


def checkpoint_steps(total_steps: int, eval_every: int, num_envs: int) -> list[int]:
    """Env-step counts of the checkpoints: each multiple of eval_every (and total_steps), rounded up
    to a multiple of num_envs."""
    targets = list(range(eval_every, total_steps + 1, eval_every))
    if not targets or targets[-1] != total_steps:
        targets.append(total_steps)
    return sorted({math.ceil(t / num_envs) * num_envs for t in targets})


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use --device cpu or auto")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    return resolved


def device_name(device) -> str:
    """What ran a job, in words: the GPU's name, or the CPU's model."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


@contextlib.contextmanager
def torch_settings(device: torch.device, threads: int | None):
    """Fixed thread count and deterministic algorithms on CPU, restored afterwards."""
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    if device.type == "cpu":
        use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        use_deterministic_algorithms(previous_deterministic)


def use_deterministic_algorithms(mode: bool) -> None:
    """`torch.use_deterministic_algorithms(mode)` without importing torch._inductor when nothing compiled yet.

    The public function imports torch._inductor only to set its `deterministic` flag, which matters to graphs
    compiled by torch.compile alone (tapebench compiles none); that import costs ~1.3 CPU-seconds in every job.
    """
    if "torch._inductor" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(mode)
    else:
        torch._C._set_deterministic_algorithms(mode)


def seed_everything(seed: int) -> int:
    """Seed python, numpy and torch from `seed`; returns the (independent) environment seed."""
    torch_seed, numpy_seed, env_seed = np.random.SeedSequence([int(seed)]).generate_state(3)
    random.seed(int(seed))
    np.random.seed(int(numpy_seed))
    torch.manual_seed(int(torch_seed))
    return int(env_seed)


class RunLog:
    """Timestamped lines to `<run>/train.log` (appended across resumes; `path` None: no file) and to stderr."""

    def __init__(self, path: Path, prefix: str, quiet: bool = False):
        self.path, self.prefix, self.quiet = path, prefix, quiet

    def __call__(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{self.prefix}] {message}"
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


class EpisodeStats:
    """Training episodes finished so far and a window of recent ones (for log lines only)."""

    def __init__(self, num_envs: int, window: int = 200):
        self.returns = torch.zeros(num_envs, dtype=torch.float64)
        self.recent_success: deque = deque(maxlen=window)
        self.recent_return: deque = deque(maxlen=window)
        self.episodes = 0

    def record(self, rewards, terminated, done) -> tuple[list, list]:
        """Add a batched step; returns the (returns, successes) of the episodes that ended at it."""
        self.returns += rewards.double().cpu()
        if not bool(done.any()):
            return [], []
        done_cpu = done.cpu()
        successes, returns = terminated.cpu()[done_cpu].tolist(), self.returns[done_cpu].tolist()
        self.recent_success.extend(successes)
        self.recent_return.extend(returns)
        self.episodes += int(done_cpu.sum())
        self.returns[done_cpu] = 0.0
        return returns, successes

    def summary(self) -> str:
        if not self.recent_success:
            return "episodes 0"
        return (f"episodes {self.episodes} | success {np.mean(self.recent_success):.3f} "
                f"| return {np.mean(self.recent_return):.2f} (last {len(self.recent_success)})")

    def state_dict(self) -> dict:
        return {"returns": self.returns, "recent_success": list(self.recent_success),
                "recent_return": list(self.recent_return), "episodes": self.episodes}

    def load_state_dict(self, state: dict) -> None:
        self.returns = state["returns"].clone()
        self.recent_success.extend(state["recent_success"])
        self.recent_return.extend(state["recent_return"])
        self.episodes = state["episodes"]


def training_env_arguments(method, config) -> dict:
    """Extra BatchedTapeEnv arguments a method asks for in training (e.g. domain randomisation)."""
    return dict(method.training_env(config)) if method.training_env is not None else {}


def training_env(spec: TrainSpec, method, config, device, env_seed: int) -> BatchedTapeEnv | BatchedGridEnv:
    """A run's training environment (one-seed runs and every seed of a block): `num_envs` rows on the spec's rules;
    with derived goals every episode a row starts gets its own goal (`TrainingGoals`) and the goal is observed."""
    goals = dict(goal_in_obs=True, goal_sampler=TrainingGoals(env_seed, config.num_envs, spec.goal_steps)) \
        if spec.derived_goals else {}
    return batched_env(config.num_envs, L=spec.L, H=spec.H, rules=spec.rules, family=spec.rule_family,
                       success_bonus=spec.success_bonus, device=device, seed=env_seed,
                       **training_env_arguments(method, config), **goals)


def read_manifest(out_dir, verify: bool = True) -> dict | None:
    """The run's train.json, or None when there is none. A damaged train.json, or (with `verify`) a
    listed checkpoint that is gone or damaged, raises CorruptArtifact naming the file."""
    path = Path(out_dir) / ckpt.MANIFEST_FILE
    if not path.is_file():
        return None
    manifest = read_json(path, "training manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("checkpoints"), list) \
            or "fingerprint" not in manifest:
        raise CorruptArtifact(path, "not a training manifest (no fingerprint or checkpoint list)")
    if verify:
        ckpt.verify_checkpoints(out_dir, manifest["checkpoints"])
    return manifest


def finished_manifest(out_dir, fingerprint: str, log) -> dict | None:
    """train.json when the run in `out_dir` is finished for this configuration with intact files;
    otherwise None, after logging why a damaged run is trained again."""
    try:
        manifest = read_manifest(out_dir, verify=False)
        if manifest is None or manifest.get("fingerprint") != fingerprint:
            return None
        ckpt.verify_checkpoints(out_dir, manifest["checkpoints"])
    except CorruptArtifact as exc:
        log(f"the run is not finished: {exc.path} is damaged ({exc.problem}); training it again")
        return None
    return manifest


def train(spec: TrainSpec, out_dir, *, device="cpu", threads: int | None = 1, config_slice: dict | None = None,
          on_checkpoint: Callable[[int, int], None] | None = None, quiet: bool = False,
          keep_resume: bool = False, tensorboard: bool = False) -> dict:
    """Train `spec.agent` into `out_dir`; resumes from `resume.pt`; returns the manifest (train.json).

    `config_slice` is what provenance records as the job's config (default: the spec's fields).
    `tensorboard` also writes TensorBoard scalars under `<out_dir>/tensorboard/` (`training/tensorboard.py`);
    it is not part of the fingerprint and changes no checkpoint.
    `on_checkpoint(index, env_steps)` is called after checkpoint `index` (1-based) is on disk.
    `resume.pt` (~30 MB with a full DQN replay buffer) is deleted once train.json is written, unless
    `keep_resume`.
    """
    out_dir = Path(out_dir)
    device = resolve_device(device)
    config = spec.config()
    if threads is not None:
        check_integer(threads, "threads", minimum=1)
    if tensorboard:
        summary_writer_class()   # fails now, naming the install command, when tensorboard is missing
    fingerprint = spec.fingerprint()
    out_dir.mkdir(parents=True, exist_ok=True)   # only once every argument has been accepted
    label = f"{spec.agent} seed {spec.seed}"
    log = RunLog(out_dir / ckpt.LOG_FILE, f"{spec.split['name']} {label}" if spec.split else label, quiet)

    manifest = finished_manifest(out_dir, fingerprint, log)
    if manifest is not None:
        log(f"{ckpt.MANIFEST_FILE} matches this configuration and its checkpoints are intact: nothing to do")
        return manifest

    schedule = checkpoint_steps(spec.total_steps, spec.eval_every, config.num_envs)
    total_iterations = schedule[-1] // config.num_envs
    checkpoint_at = {steps // config.num_envs: steps for steps in schedule}
    config_slice = config_slice if config_slice is not None else spec.fields()
    prov = provenance(config_slice, spec.seed, agent=spec.agent, split=spec.split, fingerprint=fingerprint)

    with torch_settings(device, threads):
        env_seed = seed_everything(spec.seed)
        method = get_method(spec.agent)
        env = training_env(spec, method, config, device, env_seed)
        agent = method.make_agent(config, spec.env_spec(), schedule[-1], device)
        stats = EpisodeStats(config.num_envs)
        obs = env.reset()
        iteration, checkpoints, wall_time, cpu_time, resumes = 0, [], 0.0, 0.0, 0

        resume = load_resume(out_dir, fingerprint, log)
        if resume is not None:
            agent.load_state_dict(resume["agent"])
            ckpt.load_env_state(env, resume["env"])
            stats.load_state_dict(resume["stats"])
            ckpt.set_rng_state(resume["rng"])
            iteration, checkpoints = resume["iteration"], resume["checkpoints"]
            wall_time, resumes = resume["wall_time_s"], resume["resumes"] + 1
            cpu_time = resume.get("cpu_time_s", 0.0)
            obs = env.observation()
            log(f"resuming from {ckpt.RESUME_FILE} at step {iteration * config.num_envs} "
                f"(checkpoint {len(checkpoints)} of {len(schedule)})")
        else:
            remove_stale_files(out_dir, log)
            log(f"training {spec.agent} on {len(spec.rules)} rules, L={spec.L} H={spec.H}, "
                f"{schedule[-1]} env steps ({config.num_envs} envs), checkpoints at {short_list(schedule)}, "
                f"device {device}, threads {torch.get_num_threads()}")
            if schedule[-1] != spec.total_steps or any(s % spec.eval_every for s in schedule[:-1]):
                log(f"note: num_envs={config.num_envs} does not divide the step targets; checkpoints are "
                    f"rounded up to multiples of num_envs")

        if total_iterations == 0 and not checkpoints:
            write_run_checkpoint(spec, config, agent, out_dir, 0, 0, checkpoints, prov, fingerprint, 0, env, stats,
                                 ckpt.rng_state(), wall_time, cpu_time, resumes)
        board = TensorBoardLog(out_dir, iteration * config.num_envs) if tensorboard else None
        segment_start, segment_steps = time.perf_counter(), iteration * config.num_envs
        segment_cpu = time.process_time()
        last_log, metrics = segment_start, {}
        try:
            while iteration < total_iterations:
                actions = check_actions(agent.act(obs), obs.shape[0], f"method {spec.agent!r}")
                next_obs, rewards, terminated, truncated, info = env.step(actions)
                # info["final_obs"] is the observation before auto-reset: the true successor of every row
                agent.observe(obs, actions, rewards, info["final_obs"], terminated, truncated)
                metrics = agent.update() or metrics
                ended = stats.record(rewards, terminated, terminated | truncated)
                obs = next_obs
                iteration += 1
                env_steps = iteration * config.num_envs
                if board is not None:
                    board.episodes(*ended)
                    board.step(env_steps, metrics, checkpoint=iteration in checkpoint_at)

                now = time.perf_counter()
                if iteration in checkpoint_at:
                    check_finite_metrics(metrics, env_steps)
                    write_run_checkpoint(spec, config, agent, out_dir, env_steps, schedule[-1], checkpoints, prov,
                                         fingerprint, iteration, env, stats, ckpt.rng_state(),
                                         wall_time + (now - segment_start),
                                         cpu_time + (time.process_time() - segment_cpu), resumes)
                    log(progress_line(env_steps, schedule[-1], segment_steps, segment_start, now, stats, metrics)
                        + f" | checkpoint {len(checkpoints)}/{len(schedule)}")
                    last_log = now
                    if on_checkpoint is not None:
                        on_checkpoint(len(checkpoints), env_steps)
                elif now - last_log > LOG_INTERVAL_S:
                    log(progress_line(env_steps, schedule[-1], segment_steps, segment_start, now, stats, metrics))
                    last_log = now
        finally:
            if board is not None:
                board.close()
        wall_time += time.perf_counter() - segment_start
        cpu_time += time.process_time() - segment_cpu

    manifest = run_manifest(spec, config, schedule, checkpoints, device, threads, resumes, wall_time, cpu_time, prov,
                            fingerprint)
    write_json(out_dir / ckpt.MANIFEST_FILE, manifest)
    if not keep_resume:
        (out_dir / ckpt.RESUME_FILE).unlink(missing_ok=True)
    log(f"done: {schedule[-1]} env steps in {wall_time:.1f} s ({manifest['steps_per_second']} steps/s, "
        f"{resumes} resume(s)); wrote {ckpt.MANIFEST_FILE}")
    return manifest



def write_run_checkpoint(spec: TrainSpec, config, agent, out_dir: Path, env_steps: int, total_steps: int,
                         checkpoints: list, prov: dict, fingerprint: str, iteration: int, env, stats: "EpisodeStats",
                         rng: dict, wall_time: float, cpu_time: float, resumes: int) -> None:
    """Checkpoint `checkpoints/step_*.pt` (greedy policy, appended to `checkpoints`), then `resume.pt`."""
    path = ckpt.checkpoint_name(env_steps)
    digest = ckpt.save(out_dir / path, ckpt.policy_checkpoint(
        spec.agent, config, spec.env_spec(), agent, env_steps, total_steps, spec.seed, prov))
    checkpoints.append({"env_steps": env_steps, "file": path, "sha256": digest})
    ckpt.save(out_dir / ckpt.RESUME_FILE, {
        "format": ckpt.FORMAT_VERSION, "fingerprint": fingerprint, "iteration": iteration,
        "checkpoints": checkpoints, "agent": agent.state_dict(), "env": ckpt.env_state(env),
        "stats": stats.state_dict(), "rng": rng, "wall_time_s": wall_time, "cpu_time_s": cpu_time,
        "resumes": resumes})


def run_manifest(spec: TrainSpec, config, schedule: list[int], checkpoints: list, device, threads, resumes: int,
                 wall_time: float, cpu_time: float, prov: dict, fingerprint: str) -> dict:
    """A finished run's train.json."""
    return {
        "agent": spec.agent,
        "seed": spec.seed,
        "fingerprint": fingerprint,
        "split": spec.split,
        "train_rules": list(spec.rules),
        **({"family": spec.family} if spec.family is not None else {}),
        "env": {"L": spec.L, "H": spec.H, "success_bonus": spec.success_bonus,
                **({"goal": spec.goal, "goal_steps": spec.goal_steps} if spec.derived_goals else {})},
        "training": {"total_steps": spec.total_steps, "eval_every": spec.eval_every,
                     "num_envs": config.num_envs, "env_steps": schedule[-1]},
        "hyperparameters": dataclasses.asdict(config),
        "checkpoints": checkpoints,
        "device": str(device),
        "device_name": device_name(device),
        "threads": int(threads) if threads is not None else torch.get_num_threads(),
        "resumes": resumes,
        "wall_time_s": round(wall_time, 3),
        "cpu_time_s": round(cpu_time, 3),
        "steps_per_second": round(schedule[-1] / wall_time, 1) if wall_time > 0 else None,
        "provenance": prov,
    }


def load_resume(out_dir: Path, fingerprint: str, log) -> dict | None:
    path = out_dir / ckpt.RESUME_FILE
    if not path.is_file():
        return None
    try:
        state = ckpt.load(path)
    except CorruptArtifact as exc:  # an unreadable file cannot be resumed from; start over
        log(f"ignoring damaged {ckpt.RESUME_FILE} ({exc.problem}); starting fresh")
        return None
    if state.get("fingerprint") != fingerprint:
        log(f"{ckpt.RESUME_FILE} belongs to a different configuration; starting fresh")
        return None
    try:
        ckpt.verify_checkpoints(out_dir, state["checkpoints"], listed_in=ckpt.RESUME_FILE)
    except CorruptArtifact as exc:
        log(f"cannot resume: {exc.path} is damaged or gone ({exc.problem}); starting fresh")
        return None
    return state


def remove_stale_files(out_dir: Path, log) -> None:
    """A fresh start must not leave checkpoints (or TensorBoard events) of an earlier run behind."""
    stale = sorted((out_dir / ckpt.CHECKPOINT_DIR).glob("step_*.pt"))
    for name in (ckpt.RESUME_FILE, ckpt.MANIFEST_FILE):
        if (out_dir / name).exists():
            stale.append(out_dir / name)
    if stale:
        log(f"removing {len(stale)} file(s) of an earlier run with a different configuration")
        for path in stale:
            path.unlink()
    if (out_dir / TENSORBOARD_DIR).is_dir():
        log(f"removing {TENSORBOARD_DIR}/ of an earlier run")
        shutil.rmtree(out_dir / TENSORBOARD_DIR)


def check_finite_metrics(metrics: dict, env_steps: int) -> None:
    """Stop a run whose last update returned a NaN or infinite loss (or any other metric): its weights are no
    longer numbers, and no checkpoint of them is written. Called before each checkpoint on the metrics dict the
    agent already returned (Python floats: no extra device sync)."""
    values = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or hasattr(v, "__float__")}
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        shown = ", ".join(f"{k} = {v}" for k, v in sorted(bad.items()))
        raise ValueError(f"training diverged by step {env_steps}: {shown}; no checkpoint was written. Check the "
                         f"method's hyperparameters (learning_rate and the other agents.<method> values)")


def progress_line(env_steps, total, segment_steps, segment_start, now, stats, metrics) -> str:
    elapsed = max(now - segment_start, 1e-9)
    rate = (env_steps - segment_steps) / elapsed
    eta = (total - env_steps) / rate if rate > 0 else float("nan")
    shown = " ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items()))
    return (f"step {env_steps}/{total} ({100.0 * env_steps / total:.0f}%) | {rate:.0f} steps/s | "
            f"eta {eta:.0f} s | {stats.summary()}" + (f" | {shown}" if shown else ""))


def short_list(values: list[int]) -> str:
    return str(values) if len(values) <= 4 else f"[{values[0]}, {values[1]}, ..., {values[-1]}]"
