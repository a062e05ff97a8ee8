"""PPO + domain randomisation: PPO (`ppo.py`, unchanged) trained on randomised dynamics nuisances.

Every training episode (every reset and auto-reset of a row of the training environment) draws its
own initial cell density ρ ~ U[init_density_low, init_density_high] (initial cells i.i.d.
Bernoulli(ρ)) and cell-update noise ε ~ U[noise_low, noise_high] (after each CA update every cell
flips independently with probability ε). Both keep the rule's identity: they perturb the start state
and the transitions, not the rule table. The draws come from the training environment's own
generator, so they are part of the run's seed and of its resume state.

Evaluation is untouched: the runner plays the protocol's common-random-number episodes, explicit
initial tapes drawn with ρ = 0.5, noise-free, exactly as for PPO.
"""
from __future__ import annotations

from dataclasses import dataclass

from tapebench.methods import ppo
from tapebench.validation import check_init_density, check_noise


@dataclass
class Config(ppo.Config):
    init_density_low: float = 0.2
    """lower end of the per-episode initial cell density ρ ~ U[low, high] (training only); in (0, 1)"""
    init_density_high: float = 0.8
    """upper end of ρ's range; in (0, 1), >= init_density_low"""
    noise_low: float = 0.0
    """lower end of the per-episode cell-update noise ε ~ U[low, high] (training only); in [0, 0.5]"""
    noise_high: float = 0.02
    """upper end of ε's range; in [0, 0.5], >= noise_low"""

    def check(self) -> None:
        super().check()
        for name, check, low, high in (("init_density", check_init_density, self.init_density_low,
                                        self.init_density_high),
                                       ("noise", check_noise, self.noise_low, self.noise_high)):
            try:
                check((low, high), allow_range=True)
            except ValueError as exc:
                raise ValueError(f"PPO + DR hyperparameters {name}_low/{name}_high = ({low!r}, {high!r}): "
                                 f"{exc}") from None


def training_env(config: Config) -> dict:
    """The training environment's domain randomisation: per-episode ranges of ρ and ε."""
    return {"init_density": (config.init_density_low, config.init_density_high),
            "noise": (config.noise_low, config.noise_high)}


def make(config: Config, env_spec, total_steps: int, device) -> ppo.PPOAgent:
    return ppo.make(config, env_spec, total_steps, device)


def make_block(agents: list[ppo.PPOAgent], generators: list) -> ppo.PPOBlock:
    """PPO's seed block: domain randomisation lives in each seed's own training environment, not in the agent."""
    return ppo.make_block(agents, generators)


make_block.bit_exact_devices = ppo.make_block.bit_exact_devices
