"""The method registry: everything that produces a row in a table is one entry here.

A method is a learned agent (it trains; its module follows the agent contract in `tapebench.methods.contract`),
or a controller that does not train (a planner, a filter, an oracle, the random floor) and only has an
evaluation policy. Both evaluate through the one runner (`evaluation.runner`) on the same
common-random-number episodes. docs/methods/ describes the contract and every method.

Third-party packages add methods without editing this repository through the entry-point group
`tapebench.methods`: each entry point names a `Method` (or a function returning one) whose `id` equals
the entry point's name. See the README, "Plugging in your own method".
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import inspect
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from importlib import metadata
from typing import Any, Callable

from tapebench.grid_rules import GridFamily

ENTRY_POINT_GROUP = "tapebench.methods"

# Table families, in the order tables list them (paper Tables 2-4 group rows by family).
FAMILIES = {
    "value_based": "Value-based",
    "actor_critic": "Actor--critic",
    "augmentation": "Augmentation",
    "task_inference": "Task inference",
    "world_model": "World model / planning",
    "belief": "Belief",
    "rule_agnostic": "Rule-agnostic",
    "reference": "Reference",
}
METHOD_ID = re.compile(r"^[a-z][a-z0-9_]*$")
MAX_NUM_ENVS = 65_536   # parallel training environments of one run


@dataclass(frozen=True)
class PolicyContext:
    """What the protocol gives a method that does not train, when its evaluation policy is built."""

    L: int
    H: int
    seed: int                          # the evaluation seed stream of this method (pipeline "seed")
    train_rules: tuple[int, ...] = ()  # the split's training rules (e.g. the Bayes filter's candidate set)
    device: Any = "cpu"
    family: Any = None                 # the episodes' RuleFamily (None: elementary)


@dataclass(frozen=True)
class Ref:
    """A part of a method named by where it lives, `module` and `attribute`, imported at its first use: listing
    methods by name, family and kind (tables, figures, the Snakefile's DAG) then imports no agent module, hence
    no torch. `optional`: an absent attribute is None. The attribute `__doc__` stands for its first line."""

    module: str
    attribute: str
    optional: bool = False

    def load(self):
        if self.attribute == "__doc__":
            return doc_summary(module_doc(self.module))
        module = importlib.import_module(self.module)
        if self.optional:
            return getattr(module, self.attribute, None)
        return getattr(module, self.attribute)


def module_doc(name: str) -> str | None:
    """A module's docstring, read from its source without importing it (an agent module imports torch, and
    `tapebench methods` lists every summary); a module already imported, or without a Python source, is asked."""
    if name not in sys.modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        if origin and origin.endswith(".py"):
            try:
                return ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8")))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                pass
    return importlib.import_module(name).__doc__


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


def doc_summary(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, its wrapped lines joined (a method's summary)."""
    paragraph = " ".join(line.strip() for line in (doc or "").strip().split("\n\n")[0].splitlines())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def field_docs(config: type) -> dict[str, str]:
    """Each field of a `Config` dataclass and its docstring (the string literal under the field, the method contract's
    "a docstring per field"), wrapped lines joined; a subclass's docstring of a field replaces its base's, and a field
    without one maps to "". Read from the classes' source, so a class without one (made at run time) gives ""."""
    docs = {f.name: "" for f in dataclasses.fields(config)}
    for cls in reversed(config.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        try:
            tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in zip(body, body[1:]):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and statement.target.id in docs and isinstance(following, ast.Expr)
                    and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)):
                docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


LAZY_PARTS = ("Config", "make_agent", "make_block", "make_policy", "grid_policy", "training_env", "worldtest",
              "summary")


@dataclass(frozen=True)
class Method:
    """One registry entry.

    id               name in configs, paths and CLIs (lower case, digits, underscores)
    display_name     name in tables and figures
    family           a key of FAMILIES
    Config           dataclass of hyperparameters, a docstring per field, all with defaults
    make_agent       for methods that train: `make(config, env_spec, total_steps, device) -> agent`
                     (the agent contract of `tapebench.methods.contract`)
    make_policy      for methods that do not train: `make_policy(config, context: PolicyContext) -> EvalPolicy`
    sees_true_rule   reference methods (MPC, exact optimum) are given each episode's true rule
    deterministic    its evaluation does not depend on the seed: one seed is evaluated, not `seeds`
    by_rule          evaluate one rule per batch (the exact optimum builds value tables per rule)
    make_block       optional, for methods that train: `make_block(agents, generators) -> block`, many seeds of
                     the method trained as one stacked model (the seed-block contract in `methods.contract`);
                     without it a seed block trains its seeds one after another in one process
    training_env     for methods that train: `config -> dict` of extra `BatchedTapeEnv` arguments for the
                     *training* environment only (e.g. domain randomisation); evaluation never sees them
    world_model      for methods that train: the agent learns a next-tape model and provides
                     `world_model_rollout` (agent contract); the pipeline measures its prediction error on
                     ID and OOD rules beside its success
    every_checkpoint for methods that train: evaluate every checkpoint (learning curves); False evaluates
                     only the last K (planners whose evaluation costs far more than training, the
                     equivariant networks whose CPU evaluation costs ~30x their MLP's)
    any_rule_family  works on tapes of any rule family (k colours, radius r; docs/protocol.md#rule-sets);
                     False: elementary rules only (bit augmentations, a belief over the 256 rules, 2^L tables)
    supports_grid    runs on the 2D grid family (outer-totalistic rules on an n x n torus, docs/protocol.md#grid):
                     its network or policy reads the flattened grid (`EnvSpec.grid`, `EpisodeBatch.family` a
                     `GridFamily`); False: refused on a grid config (`check_rule_family`, the one place)
    grid_policy      for methods that do not train: the evaluation policy on the 2D grid family where it is not
                     `make_policy` (same signature; `policy_maker` picks it)
    worldtest        takes part in the world test (docs/protocol.md#world-test): `worldtest(config, context:
                     methods.worldtest.WorldTestContext) -> WorldTester` (interface in `methods.worldtest`);
                     methods that train get their final checkpoint's agent in `context.agent`. A method with
                     only `worldtest` (no make_agent, no make_policy) exists for the world test alone
    summary          one line for `tapebench methods`
    rule_agnostic    its policy never uses the rule, neither told nor inferred from transitions (the live-cell
                     rows, the prior-only planner, the random floor): the best such row is the rule-agnostic
                     floor of the rule-dependent headroom (docs/protocol.md#rule-agnostic-floors)
    goal_conditioned its evaluation policy takes each episode's own goal (`EpisodeBatch.goals`, the observation's goal
                     part): it can run with env.goal: derived (docs/protocol.md#multi-goal); validation refuses the
                     others there
    needs_derived_goal its agent learns from the goals of env.goal: derived only (hindsight relabelling: `dqn_her`);
                     validation refuses it with the fixed goal (implies goal_conditioned)
    fixed            Config fields that define the row (e.g. the equivariant rows' `network`): an override with
                     another value is refused, since the row would train something else under its name

    Config, make_agent, make_policy, grid_policy, training_env, worldtest and summary may be given as a `Ref`: the part
    is imported when it is first read (and checked then), never by reading the other fields or `trains`.
    """

    id: str
    display_name: str
    family: str
    Config: type
    make_agent: Callable | None = None
    make_block: Callable | None = None
    make_policy: Callable | None = None
    grid_policy: Callable | None = None
    sees_true_rule: bool = False
    deterministic: bool = False
    by_rule: bool = False
    training_env: Callable | None = None
    world_model: bool = False
    every_checkpoint: bool = True
    any_rule_family: bool = False
    supports_grid: bool = False
    worldtest: Callable | None = None
    summary: str = ""
    fixed: tuple[str, ...] = ()
    rule_agnostic: bool = False
    goal_conditioned: bool = False
    needs_derived_goal: bool = False

    def __new__(cls, *args, **kwargs):
        # The dataclass's own TypeError names the unknown keyword only; name the field that was meant as well.
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in kwargs if key not in fields]
        if unknown:
            method_id = kwargs.get("id", args[0] if args else None)
            named = []
            for key in unknown:
                close = difflib.get_close_matches(key, fields, n=1)
                named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise TypeError(f"method {method_id!r}: Method has no field {', '.join(named)}; its fields are {fields}")
        return super().__new__(cls)

    def __post_init__(self):
        if not isinstance(self.id, str) or not METHOD_ID.match(self.id):
            raise ValueError(f"method id must match {METHOD_ID.pattern} (it becomes a path and a Snakemake "
                             f"wildcard), got {self.id!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.id!r}: family must be one of {list(FAMILIES)}, got {self.family!r}")
        make_policy = self._part("make_policy")
        if self.trains and make_policy is not None:
            raise ValueError(f"method {self.id!r} needs one of make_agent (it trains) or make_policy "
                             f"(it does not), not both")
        if not self.trains and make_policy is None and self._part("worldtest") is None:
            raise ValueError(f"method {self.id!r} needs make_agent (it trains), make_policy (it does not) or "
                             f"worldtest (it takes part in the world test only)")
        if not isinstance(self._part("Config"), Ref):
            self._check_config(self.Config)
        for name in ("training_env", "make_block"):
            if self._part(name) is not None and not self.trains:
                raise ValueError(f"method {self.id!r}: {name} is only for methods that train")
        if self._part("grid_policy") is not None and (self.trains or not self.supports_grid):
            raise ValueError(f"method {self.id!r}: grid_policy is for methods that do not train and support the grid "
                             f"(supports_grid=True)")
        if self.needs_derived_goal and not self.goal_conditioned:
            raise ValueError(f"method {self.id!r}: needs_derived_goal is for methods that take an episode's goal "
                             f"(goal_conditioned=True)")
        if (self.world_model or not self.every_checkpoint) and not self.trains:
            raise ValueError(f"method {self.id!r}: world_model and every_checkpoint are only for methods that train")

    def _part(self, name: str):
        """A field as given (a `Ref` stays unresolved)."""
        return object.__getattribute__(self, name)

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if name in LAZY_PARTS and isinstance(value, Ref):
            value = value.load()
            if name == "Config":
                self._check_config(value)
            object.__setattr__(self, name, value)
        if name in MAKERS and value is not None:
            return _named_maker(object.__getattribute__(self, "id"), name, value)
        return value

    def _check_config(self, config) -> None:
        if not dataclasses.is_dataclass(config) or not isinstance(config, type):
            raise ValueError(f"method {self.id!r}: Config must be a dataclass, got {config!r}")
        bare = [f.name for f in dataclasses.fields(config)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if bare:
            raise ValueError(f"method {self.id!r}: Config field(s) {bare} have no default; the method contract asks "
                             f"for a default on every hyperparameter (the config's agents.{self.id} overrides them)")
        if self.trains and "num_envs" not in {f.name for f in dataclasses.fields(config)}:
            raise ValueError(f"method {self.id!r} trains, so its Config needs a num_envs field")

    @property
    def trains(self) -> bool:
        return self._part("make_agent") is not None

    @property
    def plays_episodes(self) -> bool:
        """It has TAPE episodes to evaluate (trains, or has an evaluation policy); False: world test only."""
        return self.trains or self._part("make_policy") is not None

    def policy_maker(self, family) -> Callable:
        """`make_policy`, or `grid_policy` for episodes of the 2D grid family where the method has one."""
        if isinstance(family, GridFamily) and self.grid_policy is not None:
            return self.grid_policy
        return self.make_policy

    @property
    def family_name(self) -> str:
        return FAMILIES[self.family]

    @classmethod
    def from_agent_module(cls, id: str, display_name: str, family: str, module, **kwargs) -> "Method":
        """A method that trains, from a CleanRL-style module with `Config`, `make` and optional `training_env`
        (`Config=` another dataclass of the module: a row with other defaults, e.g. a larger preset). `module`
        given by name is imported at the first use of one of its parts; `Config=` may name an attribute of it."""
        name = module if isinstance(module, str) else module.__name__

        def part(attribute: str, optional: bool = False):
            ref = Ref(name, attribute, optional)
            return ref if isinstance(module, str) else ref.load()

        config = kwargs.pop("Config", "Config")
        return cls(id=id, display_name=display_name, family=family,
                   Config=part(config) if isinstance(config, str) else config, make_agent=part("make"),
                   make_block=kwargs.pop("make_block", part("make_block", optional=True)),
                   training_env=part("training_env", optional=True),
                   summary=kwargs.pop("summary", part("__doc__")),
                   **kwargs)


def _builtin() -> list[Method]:
    # Every part by name (`Ref`): a command imports only the method modules it runs.
    def module(name: str) -> str:
        return f"tapebench.methods.{name}"

    def part(name: str, attribute: str) -> Ref:
        return Ref(module(name), attribute)

    def agent(id, display_name, family, name, **kwargs):
        if kwargs.get("world_model"):   # a learned world model answers the world test through its rollouts
            kwargs.setdefault("worldtest", part("worldtest", "learned_model_tester"))
        return Method.from_agent_module(id, display_name, family, module(name), **kwargs)

    return [
        agent("dqn", "DQN", "value_based", "dqn", any_rule_family=True, goal_conditioned=True, supports_grid=True),
        agent("ppo", "PPO", "actor_critic", "ppo", any_rule_family=True, goal_conditioned=True, supports_grid=True),
        agent("dqn_equivariant", "DQN (equivariant)", "value_based", "dqn", Config="EquivariantConfig",
              fixed=("network",), any_rule_family=True, every_checkpoint=False, goal_conditioned=True,
              supports_grid=True,
              summary="DQN with a shift-equivariant Q-network: circular convolutions over the cells, Q(s, a) read "
                      "from cell a"),
        agent("dqn_her", "DQN + HER", "value_based", "dqn", Config="HERConfig", fixed=("her_strategy",),
              goal_conditioned=True, needs_derived_goal=True, make_block=None,
              summary="DQN with hindsight relabelling (her_strategy future): each transition also stored her_k times "
                      "towards a tape its episode reached later; multi-goal protocol only"),
        agent("ppo_equivariant", "PPO (equivariant)", "actor_critic", "ppo", Config="EquivariantConfig",
              fixed=("network",), any_rule_family=True, every_checkpoint=False, goal_conditioned=True,
              supports_grid=True,
              summary="PPO with shift-equivariant actor and critic: cell a's logit from cell a, the value pooled "
                      "over cells"),
        agent("ppo_context", "PPO (context)", "actor_critic", "ppo_context", fixed=("network",), any_rule_family=True,
              every_checkpoint=False, goal_conditioned=True, supports_grid=True,
              summary="PPO (equivariant) with what the episode so far shows of the rule (the next values of each "
                      "cell's window, or on grids its (state, live-neighbour count), and of those its flip changes) "
                      "as extra channels of every cell"),
        agent("rainbow", "Rainbow", "value_based", "rainbow", goal_conditioned=True, supports_grid=True),
        agent("ppo_dr", "PPO + DR", "actor_critic", "ppo_dr", goal_conditioned=True),
        agent("rad_dqn", "DQN + RAD", "augmentation", "rad_dqn", goal_conditioned=True, supports_grid=True),
        agent("curl_dqn", "DQN + CURL", "augmentation", "curl_dqn", goal_conditioned=True, supports_grid=True),
        agent("pearl_dqn", "PEARL-DQN", "task_inference", "pearl_dqn", goal_conditioned=True, supports_grid=True),
        agent("pearl_dqn_equivariant", "PEARL-DQN (equivariant)", "task_inference", "pearl_dqn",
              Config="EquivariantConfig", fixed=("network",), every_checkpoint=False, goal_conditioned=True,
              supports_grid=True,
              summary="PEARL-DQN with a shift-equivariant Q-network, the task latent broadcast to every cell"),
        agent("rl2_a2c", "RL2-A2C", "task_inference", "rl2_a2c", goal_conditioned=True, supports_grid=True),
        agent("dreamer", "DreamerV3", "world_model", "dreamer", world_model=True, goal_conditioned=True,
              supports_grid=True,
              make_block=part("dreamer_block", "make_block")),
        agent("dreamer_large", "DreamerV3 (large)", "world_model", "dreamer", Config="LargeConfig", world_model=True,
              goal_conditioned=True, supports_grid=True, make_block=part("dreamer_block", "make_block"),
              summary="DreamerV3 with world-model widths x2 and train ratio 64: a more accurate world model at ~8x "
                      "the CPU"),
        agent("planet", "PlaNet-MPC", "world_model", "planet", world_model=True, every_checkpoint=False,
              goal_conditioned=True, supports_grid=True),
        agent("ensemble_mpc", "Ensemble MPC", "world_model", "ensemble_mpc", world_model=True, every_checkpoint=False,
              goal_conditioned=True, supports_grid=True),
        agent("ensemble_mpc_equivariant", "Ensemble MPC (equivariant)", "world_model", "ensemble_mpc",
              Config="EquivariantConfig", fixed=("network",), world_model=True, every_checkpoint=False,
              goal_conditioned=True, supports_grid=True,
              summary="ensemble MPC whose next-tape models are shift-equivariant: circular convolutions over the "
                      "cells, the context transition read through pooling"),
        agent("ensemble_mpc_ig", "Ensemble MPC + IG", "world_model", "ensemble_mpc", Config="IGConfig",
              world_model=True, every_checkpoint=False, goal_conditioned=True, supports_grid=True,
              summary="ensemble MPC with beta x ensemble disagreement (nats) added to each planned step"),
        agent("context_mpc", "Context MPC", "world_model", "context_mpc", world_model=True, every_checkpoint=False,
              any_rule_family=True, goal_conditioned=True, worldtest=part("context_mpc", "context_tester"),
              summary="true-dynamics MPC (8 x 512) through the rule table an in-context model reads out of the episode "
                      "so far, a learned prior on the windows it has not shown"),
        Method("bayes_filter", "Bayes filter (train)", "belief", part("bayes_filter", "Config"),
               make_policy=part("bayes_filter", "make_policy"), grid_policy=part("grid_bayes_filter", "make_policy"),
               goal_conditioned=True, supports_grid=True,
               summary="posterior over the training rules, one-step greedy on expected distance + 0.25 x IG"),
        Method("bayes_filter_full", "Bayes filter (full)", "belief", part("bayes_filter", "Config"),
               make_policy=part("bayes_filter", "make_policy_full"),
               grid_policy=part("grid_bayes_filter", "make_policy_full"),
               goal_conditioned=True, supports_grid=True,
               summary="posterior over all 256 rules, one-step greedy on expected distance + 0.25 x IG"),
        Method("identify_then_plan", "Identify-then-plan", "belief", part("identify_then_plan", "Config"),
               make_policy=part("identify_then_plan", "make_policy"),
               worldtest=part("worldtest", "random_exploration_tester"),
               goal_conditioned=True,
               summary="rule tables consistent with the transitions seen, MPC (8 x 512) averaged over them"),
        Method("active_identify", "Active identification", "belief", part("worldtest", "ActiveConfig"),
               worldtest=part("worldtest", "active_exploration_tester"),
               summary="world test only: flips that pin the most unknown rule-table bits, then exact reasoning"),
        Method("random", "Random policy", "reference", part("random_policy", "Config"),
               make_policy=part("random_policy", "make_policy"), any_rule_family=True, supports_grid=True,
               worldtest=part("worldtest", "chance_tester"), rule_agnostic=True,
               goal_conditioned=True,
               summary="a uniformly random cell each step: the floor"),
        Method("live_leftmost", "Flip lowest live cell", "rule_agnostic", part("live_policy", "Config"),
               make_policy=part("live_policy", "make_leftmost"), any_rule_family=True, rule_agnostic=True,
               supports_grid=True,
               goal_conditioned=True,
               summary="flip the lowest-index live cell (one that differs from the goal); a uniform cell when none is"),
        Method("live_random", "Flip random live cell", "rule_agnostic", part("live_policy", "Config"),
               make_policy=part("live_policy", "make_random"), any_rule_family=True, rule_agnostic=True,
               supports_grid=True,
               goal_conditioned=True,
               summary="flip a uniformly random live cell (one differing from the goal); a uniform cell when none is"),
        Method("mpc_prior", "MPC (training-rule prior)", "rule_agnostic", part("identify_then_plan", "Config"),
               make_policy=part("identify_then_plan", "make_prior_policy"), rule_agnostic=True,
               goal_conditioned=True,
               summary="identify-then-plan's MPC (8 x 512) over the training rules, a prior never updated"),
        Method("mpc", "True-dynamics MPC", "reference", part("mpc", "MPCMethodConfig"),
               make_policy=part("mpc", "make_policy"), grid_policy=part("grid_mpc", "make_policy"),
               sees_true_rule=True, any_rule_family=True, supports_grid=True,
               worldtest=part("worldtest", "true_rule_tester"),
               goal_conditioned=True,
               summary="random-shooting MPC with the episode's true rule (8 x 512)"),
        Method("exact", "Exact optimum", "reference", part("exact", "ExactConfig"),
               make_policy=part("exact", "make_policy"),
               sees_true_rule=True, deterministic=True, by_rule=True,
               goal_conditioned=True,
               summary="exact finite-horizon optimum by dynamic programming over all 2^L tapes (L <= 20)"),
    ]


# The parts that make a method's agent or policy: a call is named after the method, and what it returns is checked
# against the method contract (`methods.contract`), so a plug-in's mistake is one line naming it, not a traceback.
MAKERS = {"make_agent": "make_agent(config, env_spec, total_steps, device)",
          "make_policy": "make_policy(config, context)", "grid_policy": "grid_policy(config, context)"}


def _named_maker(method_id: str, name: str, make: Callable) -> Callable:
    def call(*args, **kwargs):
        # the contract's checks import torch: loaded only when an agent or a policy is made
        from tapebench.methods.contract import AGENT_METHODS, POLICY_METHODS, ContractError

        try:
            made = make(*args, **kwargs)
        except ContractError:
            raise
        except Exception as exc:  # a plug-in may raise anything: name the method and the call, keep the cause
            raise ContractError(f"method {method_id!r}: {MAKERS[name]} raised {type(exc).__name__}: {exc}") from exc
        needed = AGENT_METHODS if name == "make_agent" else () if callable(made) else POLICY_METHODS
        missing = [m for m in needed if not callable(getattr(made, m, None))]
        if made is None or missing:
            what = "None" if made is None else f"a {type(made).__name__} without {'/'.join(missing)}"
            wanted = "an agent with " + ", ".join(AGENT_METHODS) if name == "make_agent" else \
                "a policy with begin, act and observe (or a callable obs -> actions)"
            raise ContractError(f"method {method_id!r}: {MAKERS[name]} returned {what}; the method contract "
                                f"(tapebench.methods.contract) asks for {wanted}")
        return made
    return functools.update_wrapper(call, make)   # its module, name, attributes (fewshot reads __module__)


_REGISTRY: dict[str, Method] | None = None
_PLUGIN_ORIGIN: dict[str, str] = {}


def registry() -> dict[str, Method]:
    """All methods: the built-in ones, then those of installed plug-ins (loaded once)."""
    global _REGISTRY
    if _REGISTRY is None:
        methods = {m.id: m for m in _builtin()}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            method = _load_plugin(ep)
            if method.id in methods:
                where = _PLUGIN_ORIGIN.get(method.id, "tapebench itself")
                raise ValueError(f"plug-in entry point {ep.value!r} registers method id {method.id!r}, which "
                                 f"{where} already registers; rename one of them")
            methods[method.id] = method
            _PLUGIN_ORIGIN[method.id] = ep.value
        _REGISTRY = methods
    return _REGISTRY


def _load_plugin(ep) -> Method:
    try:
        obj = ep.load()
        method = obj() if inspect.isfunction(obj) else obj
    except Exception as exc:
        raise ValueError(f"cannot load tapebench method plug-in {ep.name!r} ({ep.value}): "
                         f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(method, Method):
        raise ValueError(f"plug-in entry point {ep.name!r} ({ep.value}) must name a tapebench.registry.Method "
                         f"or a function returning one, got {type(method).__name__}")
    if method.id != ep.name:
        raise ValueError(f"plug-in entry point {ep.name!r} ({ep.value}) registers a method with id {method.id!r}; "
                         f"the entry point name and the method id must be the same")
    return method


def builtin_ids() -> set[str]:
    """The ids of the methods tapebench itself registers (a plug-in's are not among them)."""
    return {m.id for m in _builtin()}


def register(method: Method) -> Method:
    """Add a method at run time (tests, notebooks). Pipelines should use the entry-point group instead:
    Snakemake jobs run in fresh processes that only see installed plug-ins."""
    methods = registry()
    if method.id in methods:
        raise ValueError(f"method id {method.id!r} is already registered")
    methods[method.id] = method
    return method


def unregister(method_id: str) -> None:
    registry().pop(method_id, None)


def get_method(method_id: str) -> Method:
    """The method registered under `method_id`; unknown ids list the registered ones."""
    methods = registry()
    if method_id not in methods:
        raise ValueError(f"unknown method {method_id!r}; registered methods: {sorted(methods)}")
    return methods[method_id]


def runs_on(method: Method, family) -> bool:
    """Whether a method runs on a rule family: the elementary family, any tape family (`any_rule_family`) or the
    2D grid family (`supports_grid`; a `grid_rules.GridFamily`)."""
    if family is None or family.elementary:
        return True
    return method.supports_grid if isinstance(family, GridFamily) else method.any_rule_family


def check_rule_family(method_id: str, family) -> None:
    """Fail early when a method is asked to run on a rule family it does not support (the one check: training,
    evaluation and config validation call it)."""
    if not runs_on(get_method(method_id), family):
        supported = sorted(m for m, method in registry().items() if runs_on(method, family))
        if isinstance(family, GridFamily):
            raise ValueError(f"method {method_id!r} does not run on the 2D grid family ({family.describe()}); "
                             f"methods that do (registry flag supports_grid): {supported}")
        raise ValueError(f"method {method_id!r} supports only the elementary family, not {family.describe()}; "
                         f"methods for any rule family: {supported}")


def build_config(method_id: str, overrides: dict | None):
    """The method's `Config` with `overrides` applied; unknown keys and wrong types name the allowed ones."""
    method = get_method(method_id)
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise ValueError(f"hyperparameters of method {method_id!r} must be a mapping, got {overrides!r}")
    fields = {f.name: f for f in dataclasses.fields(method.Config)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown hyperparameter(s) {unknown} for method {method_id!r}; allowed: {list(fields)}")
    for key, value in overrides.items():
        _check_type(method_id, key, value, fields[key].type)
    default = method.Config()
    for key in method.fixed:
        if key in overrides and overrides[key] != getattr(default, key):
            raise ValueError(f"hyperparameter {key!r} of method {method_id!r} ({method.display_name}) is fixed at "
                             f"{getattr(default, key)!r}: it defines the row, got {overrides[key]!r}; use another "
                             f"method for another {key}")
    config = method.Config(**overrides)
    if method.trains and (isinstance(config.num_envs, bool) or not 1 <= int(config.num_envs) <= MAX_NUM_ENVS):
        raise ValueError(f"hyperparameter num_envs of method {method_id!r} must be in 1..{MAX_NUM_ENVS}, "
                         f"got {config.num_envs}")
    check = getattr(config, "check", None)
    if check is not None:
        check()
    return config


def make_agent(method_id: str, config, env_spec, total_steps: int, device="cpu"):
    """A fresh agent of a method that trains (its registry entry's `make_agent`)."""
    method = get_method(method_id)
    if not method.trains:
        raise ValueError(f"method {method_id!r} does not train; it has an evaluation policy only")
    return method.make_agent(config, env_spec, total_steps, device)


def check_hyperparameters(method_id: str, overrides: dict | None) -> dict:
    """Validate overrides against the method's `Config`; returns the full resolved dict."""
    return dataclasses.asdict(build_config(method_id, overrides))


def stated_hyperparameters(method_id: str, overrides: dict | None) -> dict:
    """The canonical form of a method's hyperparameters in a job's params: its resolved `Config` (`overrides` over the
    defaults, checked as `build_config` checks them) as the fields whose value differs from the default, a whole number
    given for a float field as a float, tuples as lists. So stating a default, or 5e-4 for 0.0005, or 1 for 1.0, is
    no change, and two configs that resolve to the same `Config` give the same params (docs/protocol.md#job-params)."""
    config = build_config(method_id, overrides)
    default = get_method(method_id).Config()
    stated = {}
    for f in dataclasses.fields(config):
        value, base = _plain(getattr(config, f.name)), _plain(getattr(default, f.name))
        name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if name == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if value != base or type(value) is not type(base):
            stated[f.name] = value
    return stated


def _plain(value):
    """A field's value as JSON holds it: tuples (and nested ones) as lists, dataclasses as mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def display_name(method_id: str) -> str:
    methods = registry()
    return methods[method_id].display_name if method_id in methods else method_id


_SCALAR_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(method_id: str, key: str, value, annotation) -> None:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    expected = _SCALAR_TYPES.get(name)
    if expected is None:
        return
    if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
        raise ValueError(f"hyperparameter {key!r} of method {method_id!r} must be {name}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"hyperparameter {key!r} of method {method_id!r} must be a finite number, got {value!r}")


__all__ = ["ENTRY_POINT_GROUP", "FAMILIES", "Method", "PolicyContext", "build_config", "builtin_ids",
           "check_hyperparameters", "field_docs",
           "check_rule_family", "stated_hyperparameters",
           "runs_on",
           "display_name", "get_method", "make_agent", "register", "registry", "unregister"]
