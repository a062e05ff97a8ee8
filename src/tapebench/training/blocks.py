"""Seed blocks: many seeds of one method trained in one process (docs/protocol.md#seed-blocks).

A block is the runs of one method on one rule set that differ only in their seed. Each seed keeps its own
run folder, checkpoints, `train.json` and `resume.pt`, exactly as a one-seed run writes them.

* A method with `make_block` (the seed-block contract in `methods.contract`) trains the block's seeds as one
  stacked model: every seed is built as a one-seed run builds it (its seed, its environment stream, its network
  initialisation), then the method stacks them; each seed's agent draws only from its own generator, which
  continues the stream torch's global generator would have given that seed alone.
* Any other method trains the seeds one after another in the same process (`train` per seed): bit for bit the
  one-seed runs, and the process start-up is paid once.

Seeds whose run is already finished for this configuration are left alone, so adding seeds trains only the new
ones. A stacked block resumes after a kill when every unfinished seed has a `resume.pt` of the same step;
otherwise its unfinished seeds start again.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from tapebench.envs.batched import BatchedTapeEnv, seed_block_step
from tapebench.methods.contract import BlockUnsupported
from tapebench.registry import get_method
from tapebench.settings import training_device
from tapebench.training import checkpoint as ckpt
from tapebench.training.loop import (LOG_INTERVAL_S, EpisodeStats, RunLog, TrainSpec, check_finite_metrics,
                                     checkpoint_steps, finished_manifest, load_resume, progress_line,
                                     remove_stale_files, resolve_device, run_manifest, seed_everything, short_list,
                                     torch_settings, train, training_env, write_run_checkpoint)
from tapebench.utils.artifacts import file_sha256
from tapebench.utils.io import provenance, write_json
from tapebench.validation import check_integer


SEED_FIELD = "{seed}"   # where a block's run-folder pattern puts each seed
STACKING = ("auto", "always", "never")


def check_block(specs: Sequence[TrainSpec]) -> None:
    """The specs of one block: at least one, distinct seeds, otherwise identical."""
    if not specs:
        raise ValueError("a seed block needs at least one seed")
    seeds = [s.seed for s in specs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed block's seeds must be distinct, got {seeds}")
    first = dataclasses.replace(specs[0], seed=0)
    for spec in specs[1:]:
        if dataclasses.replace(spec, seed=0) != first:
            raise ValueError(f"the runs of a seed block may differ only in their seed; seed {spec.seed}'s "
                             f"configuration differs from seed {specs[0].seed}'s")


def train_block(specs: Sequence[TrainSpec], out_dirs: Sequence, *, device="cpu", threads: int | None = 1,
                config_slice: dict | None = None, quiet: bool = False, keep_resume: bool = False,
                tensorboard: bool = False, stacking: str = "auto") -> list[dict]:
    """Train the seeds of `specs` (one method, one configuration) into `out_dirs`; returns their manifests.

    `device`: as `training_device` resolves it (auto: CUDA for a block trained stacked, else the CPU).
    `stacking` (one of STACKING): "auto" stacks a method that has `make_block` where its stacked seeds are its
    one-seed runs bit for bit (`make_block.bit_exact_devices`) and on any GPU (where nothing is bit-exact and the
    batched products pay); "always" wherever the method has `make_block`; "never" trains the seeds one after
    another. TensorBoard logging trains one after another (it logs one run).
    """
    if stacking not in STACKING:
        raise ValueError(f"stacking must be one of {list(STACKING)}, got {stacking!r}")
    specs, out_dirs = list(specs), [Path(p) for p in out_dirs]
    check_block(specs)
    if len(out_dirs) != len(specs):
        raise ValueError(f"{len(specs)} seeds but {len(out_dirs)} run folders")
    if len({p.resolve() for p in out_dirs}) != len(out_dirs):
        raise ValueError("each seed of a block needs its own run folder")
    if threads is not None:
        check_integer(threads, "threads", minimum=1)
    method = get_method(specs[0].agent)
    stack = (stacking != "never" and not tensorboard and method.make_block is not None and len(specs) > 1
             and specs[0].total_steps > 0)   # the untrained network (0 steps): each seed's initialisation on its own
    device = training_device(device, stack)
    common = dict(device=device, threads=threads, config_slice=config_slice, quiet=quiet, keep_resume=keep_resume)
    device_type = resolve_device(device).type
    exact = not stack or device_type in getattr(method.make_block, "bit_exact_devices", ())
    if stack and not exact and stacking == "auto" and device_type == "cpu":
        stack, exact = False, True
    if not exact:   # a seed's numbers depend on being stacked: its fingerprint names the block, which is retrained whole
        specs = [dataclasses.replace(spec, block=tuple(s.seed for s in specs)) for spec in specs]
    pending = [i for i, (spec, out) in enumerate(zip(specs, out_dirs))
               if finished_manifest(out, spec.fingerprint(), lambda message: None) is None]
    if pending and not exact:
        pending = list(range(len(specs)))
    if stack and len(pending) > 1:
        try:
            stacked_runs = _StackedBlock([specs[i] for i in pending], [out_dirs[i] for i in pending], **common)
        except BlockUnsupported as exc:
            specs = [dataclasses.replace(spec, block=None) for spec in specs]
            if not quiet:
                print(f"[{specs[0].agent}] {exc}; training the seeds one after another", flush=True)
        else:
            stacked_runs.run()
    return [train(spec, out, tensorboard=tensorboard, **common) for spec, out in zip(specs, out_dirs)]


@dataclass
class _Member:
    """One seed of a stacked block: what its one-seed run would hold besides the stacked agent."""

    spec: TrainSpec
    out_dir: Path
    fingerprint: str
    log: RunLog
    prov: dict
    env: BatchedTapeEnv
    agent: object          # a one-seed agent: the stacked state is exported into it at each checkpoint
    generator: torch.Generator
    host_rng: dict         # python and numpy generator states after seeding (resume.pt keeps them as a run does)
    stats: EpisodeStats
    checkpoints: list


class _StackedBlock:
    def __init__(self, specs, out_dirs, *, device, threads, config_slice, quiet, keep_resume):
        self.device, self.threads, self.quiet, self.keep_resume = resolve_device(device), threads, quiet, keep_resume
        self.method = get_method(specs[0].agent)
        self.config = specs[0].config()
        self.schedule = checkpoint_steps(specs[0].total_steps, specs[0].eval_every, self.config.num_envs)
        self.specs, self.out_dirs = specs, out_dirs
        self.config_slices = [config_slice if config_slice is not None else s.fields() for s in specs]
        seeds = [s.seed for s in specs]
        label = f"{specs[0].agent} seeds {short_list(seeds)}"
        self.log = RunLog(None, label, quiet)   # the block's lines go to stderr; each seed's to its train.log
        with torch_settings(self.device, threads):
            self.members = [self._member(spec, out, slice_)
                            for spec, out, slice_ in zip(specs, out_dirs, self.config_slices)]
            # the method may refuse this configuration (BlockUnsupported): nothing is written before this point
            self.block = self.method.make_block([m.agent for m in self.members], [m.generator for m in self.members])

    def _member(self, spec, out_dir, config_slice) -> _Member:
        env_seed = seed_everything(spec.seed)
        # the environments step on the CPU and the block moves one stacked batch per step to its device: per-seed
        # environment kernels and episode bookkeeping on a GPU would be S streams of tiny launches and syncs
        env = training_env(spec, self.method, self.config, "cpu", env_seed)
        agent = self.method.make_agent(self.config, spec.env_spec(), self.schedule[-1], self.device)
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        fingerprint = spec.fingerprint()
        prefix = f"{spec.split['name']} {spec.agent} seed {spec.seed}" if spec.split else f"{spec.agent} seed {spec.seed}"
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return _Member(spec=spec, out_dir=Path(out_dir), fingerprint=fingerprint,
                       log=RunLog(Path(out_dir) / ckpt.LOG_FILE, prefix, quiet=True),
                       prov=provenance(config_slice, spec.seed, agent=spec.agent, split=spec.split,
                                       fingerprint=fingerprint),
                       env=env, agent=agent, generator=generator,
                       host_rng={"python": random.getstate(), "numpy": np.random.get_state()},
                       stats=EpisodeStats(self.config.num_envs), checkpoints=[])

    def _say(self, message: str) -> None:
        for m in self.members:
            m.log(message)
        if not self.quiet:
            self.log(message)

    def _resume(self) -> tuple[int, float, float, int]:
        """(iteration, wall, cpu, resumes) of a common resume point, or a fresh start of every member."""
        states = [load_resume(m.out_dir, m.fingerprint, m.log) for m in self.members]
        if all(s is not None for s in states) and len({s["iteration"] for s in states}) == 1:
            for m, state in zip(self.members, states):
                m.agent.load_state_dict(state["agent"])
                ckpt.load_env_state(m.env, state["env"])
                m.stats.load_state_dict(state["stats"])
                m.generator.set_state(state["rng"]["torch"])
                m.host_rng = {"python": state["rng"]["python"], "numpy": state["rng"]["numpy"]}
                m.checkpoints = list(state["checkpoints"])
            first = states[0]
            self._say(f"resuming the block from {ckpt.RESUME_FILE} at step {first['iteration'] * self.config.num_envs}")
            return first["iteration"], first["wall_time_s"], first.get("cpu_time_s", 0.0), first["resumes"] + 1
        if any(s is not None for s in states):
            self._say("the block's seeds have no common resume point; its unfinished seeds start again")
        for m in self.members:
            remove_stale_files(m.out_dir, m.log)
        return 0, 0.0, 0.0, 0

    def run(self) -> None:
        num_envs, schedule = self.config.num_envs, self.schedule
        total_iterations = schedule[-1] // num_envs
        checkpoint_at = {steps // num_envs: steps for steps in schedule}
        members, block = self.members, self.block
        with torch_settings(self.device, self.threads):
            obs = torch.stack([m.env.reset() for m in members])
            iteration, wall_time, cpu_time, resumes = self._resume()
            if iteration:   # the seeds' agents and generators hold their resumed states: the block takes them in
                block = self.block = self.method.make_block([m.agent for m in members],
                                                            [m.generator for m in members])
                for k, m in enumerate(members):
                    obs[k] = m.env.observation()
            obs = obs.to(self.device)
            step = seed_block_step([m.env for m in members])
            if not iteration:
                self._say(f"training {len(members)} seeds of {self.specs[0].agent} as one stacked block on "
                          f"{len(self.specs[0].rules)} rules, L={self.specs[0].L} H={self.specs[0].H}, "
                          f"{schedule[-1]} env steps each ({num_envs} envs per seed), checkpoints at "
                          f"{short_list(schedule)}, device {self.device}, threads {torch.get_num_threads()}")
            segment_start, segment_steps, segment_cpu = time.perf_counter(), iteration * num_envs, time.process_time()
            last_log, metrics = segment_start, [{} for _ in members]
            while iteration < total_iterations:
                actions = block.act(obs)
                host_actions = actions.cpu()
                next_obs, rewards, terminated, truncated, final_obs = step(host_actions)
                for k, m in enumerate(members):
                    m.stats.record(rewards[k], terminated[k], terminated[k] | truncated[k])
                next_obs, final_obs, rewards, terminated, truncated = (t.to(self.device) for t in (
                    next_obs, final_obs, rewards, terminated, truncated))
                block.observe(obs, actions, rewards, final_obs, terminated, truncated)
                metrics = [new or old for new, old in zip(block.update() or [{}] * len(members), metrics)]
                obs = next_obs
                iteration += 1
                env_steps = iteration * num_envs
                now = time.perf_counter()
                if iteration in checkpoint_at:
                    wall_now = wall_time + (now - segment_start)
                    cpu_now = cpu_time + (time.process_time() - segment_cpu)
                    for k, m in enumerate(members):
                        check_finite_metrics(metrics[k], env_steps)
                    for k, m in enumerate(members):
                        block.export_seed(k, m.agent)
                        rng = {**m.host_rng, "torch": m.generator.get_state()}
                        write_run_checkpoint(m.spec, self.config, m.agent, m.out_dir, env_steps, schedule[-1],
                                             m.checkpoints, m.prov, m.fingerprint, iteration, m.env, m.stats, rng,
                                             wall_now, cpu_now, resumes)
                        m.log(progress_line(env_steps, schedule[-1], segment_steps, segment_start, now, m.stats,
                                        metrics[k]) + f" | checkpoint {len(m.checkpoints)}/{len(schedule)}")
                    if not self.quiet:
                        self.log(f"step {env_steps}/{schedule[-1]} | checkpoint {len(members[0].checkpoints)}/"
                                 f"{len(schedule)} of {len(members)} seeds")
                    last_log = now
                elif now - last_log > LOG_INTERVAL_S:
                    for k, m in enumerate(members):
                        m.log(progress_line(env_steps, schedule[-1], segment_steps, segment_start, now, m.stats,
                                        metrics[k]))
                    if not self.quiet:
                        self.log(progress_line(env_steps, schedule[-1], segment_steps, segment_start, now,
                                           members[0].stats, metrics[0]) + f" (seed {self.specs[0].seed})")
                    last_log = now
            wall_time += time.perf_counter() - segment_start
            cpu_time += time.process_time() - segment_cpu
        block_record = {"seeds": [m.spec.seed for m in members], "stacked": True,
                        "wall_time_s": round(wall_time, 3), "cpu_time_s": round(cpu_time, 3)}
        share = len(members)
        for m in members:
            manifest = run_manifest(m.spec, self.config, schedule, m.checkpoints, self.device, self.threads, resumes,
                                    wall_time / share, cpu_time / share, m.prov, m.fingerprint)
            manifest["block"] = block_record
            write_json(m.out_dir / ckpt.MANIFEST_FILE, manifest)
            if not self.keep_resume:
                (m.out_dir / ckpt.RESUME_FILE).unlink(missing_ok=True)
            m.log(f"done in a stacked block of {share} seeds: {schedule[-1]} env steps each, the block "
                  f"{wall_time:.1f} s; wrote {ckpt.MANIFEST_FILE}")
        if not self.quiet:
            self.log(f"done: {share} seeds x {schedule[-1]} env steps in {wall_time:.1f} s "
                     f"({share * schedule[-1] / max(wall_time, 1e-9):.0f} env steps/s)")


def write_block_record(path, manifests: Sequence[dict], out_dirs: Sequence, config_slice: dict) -> None:
    """The pipeline's target for a seed block: each seed's finished run (folder, train.json digest, fingerprint)."""
    runs = [{"seed": m["seed"], "run": str(out), "fingerprint": m["fingerprint"],
             "manifest_sha256": file_sha256(Path(out) / ckpt.MANIFEST_FILE)} for m, out in zip(manifests, out_dirs)]
    write_json(path, {"agent": manifests[0]["agent"], "split": manifests[0]["split"],
                      "seeds": [m["seed"] for m in manifests], "runs": runs,
                      "provenance": provenance(config_slice, None, agent=manifests[0]["agent"])})
