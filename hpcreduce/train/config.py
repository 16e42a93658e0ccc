"""Settings of one training run: the fields every mode shares, plus one topology part.

    TrainConfig(steps=100, batch=64, lr=0.1)                                   # ring AllReduce
    TrainConfig(topology=PS(servers=2, consistency="ssp", staleness=2))       # parameter server
    TrainConfig(topology=Hybrid(servers=2, consistency="asp"))                # sparse on servers, dense allreduced
    TrainConfig(optimizer="lbfgs", steps=100, topology=Sandblaster(servers=2))

``mode`` is the topology's (``ring``, ``ps``, ``hybrid`` or ``sandblaster``); a setting of another mode
cannot be given at all. Every field declares its command-line form (``runtime.options``):
``hpcreduce train`` builds its flags, defaults, help and range checks from these declarations.
``problems`` checks the values, by field name (each topology's ``problems`` what its settings say
against the run's: settings that depend on each other, on the job's size or on ULFM, ``ft``);
``output_problems`` what rank 0's disk says.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ..arrays import DEVICE_KINDS
from ..arrays.dtypes import WIRE
from ..errors import SettingProblem, setting_problem
from ..ft.faults import FaultConfig
from ..runtime.places import Place, place_problems
from ..ps.layout import servers_problem
from ..ps.optimizers import OPTIMIZERS
from ..ps.tables import EVICTIONS, Dynamic
from ..runtime.options import (Option, at_least, field_problems, non_negative_finite, option, parse_size,
                               partner_problems,
                               positive_finite, probability)
from ..sandblaster import METHODS, roles_problem

PROGRESS = ("auto", "bar", "lines", "none")
OUTPUTS = ("json_path", "metrics_path", "timeline_path")
STEPS_AND_BATCH = at_least(1)
ASP_CADENCE = at_least(1)
HISTORY_AND_PUSHES = at_least(1)
SERVERS = Option("--servers", "ps, hybrid and sandblaster: server ranks K", metavar="K")
LR = 0.2
HASHED_MODELS = ("logreg", "logreg-interaction")  # the built-in models --table-rows applies to
DYNAMIC_MODELS = ("embed",)  # the built-in models with dynamic tables
DYNAMIC_SETTINGS = ("admit_after", "admit_probability", "row_budget", "eviction")


KILLS = ("kills", "kill_random", "node_kills")
"""The injected failures, which a job without ULFM recovers by a relaunch from its checkpoints
(the settings that work in-job only declare ``needs=(FT,)``: ``FaultConfig``)."""


def _given_kills(config: "TrainConfig") -> str:
    """The injected failures given, as ``{kills} and {kill_random}`` (empty: none)."""
    given = ["{%s}" % name for name in KILLS if getattr(config.fault, name)]
    return " and ".join([", ".join(given[:-1]), given[-1]]) if len(given) > 1 else "".join(given)


def _server_growth_problems(config: "TrainConfig") -> List[SettingProblem]:
    """Ring and sandblaster: ``grow_servers`` is the parameter server's."""
    if config.fault.grow_servers:
        return [setting_problem("{grow_servers} adds parameter servers: it applies to {mode} ps")]
    return []


def _optimizer_problems(config: "TrainConfig") -> List[SettingProblem]:
    """Ring and PS: an SGD-family optimizer (a batch method belongs to sandblaster)."""
    if config.optimizer in METHODS:
        return [setting_problem("{optimizer} {value!r} is a batch method of {mode} sandblaster; {mode} %s "
                                "takes one of {choices}" % config.mode, value=config.optimizer,
                                choices=", ".join(OPTIMIZERS))]
    if config.optimizer not in OPTIMIZERS:
        return [setting_problem("{optimizer} must be one of {choices}, got {value!r}",
                                choices=", ".join(OPTIMIZERS), value=config.optimizer)]
    return []


@dataclass(frozen=True)
class Ring:
    """Ring AllReduce: every rank a worker, all of them in step (no settings of its own)."""

    mode: ClassVar[str] = "ring"
    defaults: ClassVar[Dict[str, Any]] = {}

    def problems(self, config: "TrainConfig", size: int, ft: bool) -> List[SettingProblem]:
        found = _optimizer_problems(config)
        killing = _given_kills(config)
        if killing and not ft and not config.fault.checkpoint_dir:
            found.append(setting_problem(killing + " need%s in-job fault tolerance: launch with --ft (ULFM), or give "
                                         "{checkpoint_dir} and --restarts to recover kills by relaunching"
                                         % ("" if " and " in killing else "s")))
        return found + _server_growth_problems(config)


@dataclass(frozen=True)
class PS:
    """Parameter servers: ``servers`` shard servers (ranks 0..K-1), the other ranks workers."""

    mode: ClassVar[str] = "ps"
    defaults: ClassVar[Dict[str, Any]] = {}

    servers: int = field(default=1, metadata={"option": SERVERS})
    consistency: str = option("bsp", "--consistency", "ps, hybrid: bsp, ssp or asp", metavar="C",
                              choices=("bsp", "ssp", "asp"))
    staleness: int = option(0, "--staleness", "ps, hybrid with ssp: clocks a worker may run ahead", metavar="S",
                            bound=at_least(0))
    fetch_every: int = option(1, "--fetch-every", "ps with asp: pull every n steps", metavar="N", bound=ASP_CADENCE)
    push_every: int = option(1, "--push-every", "ps, hybrid with asp: push every n steps (hybrid: the sparse "
                             "rows; the dense parameters are reduced every step)", metavar="N", bound=ASP_CADENCE)
    wire_dtype: str = option("float32", "--wire-dtype", "ps, hybrid: float32 or float16, how pushed and pulled "
                             "values travel (the servers keep float32)", metavar="DTYPE",
                             choices=WIRE)
    model_dir: Optional[str] = option(None, "--model-dir", "ps, hybrid: each server writes its shard of the trained "
                                      "model here (hybrid: rank 0 the dense parameters too), plus a manifest "
                                      "(hpcreduce export DIR assembles it)", metavar="DIR")

    def problems(self, config: "TrainConfig", size: int, ft: bool) -> List[SettingProblem]:
        fault = config.fault
        found = [problem for problem in [servers_problem(self.servers, size)] if problem] + _optimizer_problems(config)
        if self.wire_dtype != "float32" and ft:
            found.append(setting_problem("{wire_dtype} %s is not yet supported with in-job fault tolerance "
                                         "(--ft); use float32" % self.wire_dtype))
        if self.consistency != "ssp" and self.staleness:
            found.append(setting_problem("{staleness} only applies to {consistency} ssp"))
        if self.consistency != "asp" and (self.fetch_every != 1 or self.push_every != 1):
            found.append(setting_problem("{fetch_every} and {push_every} only apply to {consistency} asp"))
        if not ft and _given_kills(config) and not fault.checkpoint_dir and not fault.hangs_only():
            found.append(setting_problem(
                "in {mode} %s, {kills} and {kill_random} need" % config.mode + " in-job fault tolerance (--ft, "
                "ULFM) or {checkpoint_dir} with {checkpoint_every} and --restarts R: the job is then relaunched "
                "and resumes from the latest checkpoint"))
        if ft and self.servers == 1 and not fault.checkpoint_dir and not fault.accept_server_loss:
            found.append(setting_problem(
                "{mode} %s with in-job fault tolerance and {servers} 1 has" % config.mode + " no copy of the model "
                "but the server's: its death would end the job. Give {servers} 2 or more (each shard replicated on "
                "another server), or {checkpoint_dir} (a worker takes over from the latest checkpoint), or "
                "{accept_server_loss} to run anyway"))
        leaving = {identity for identity, _ in fault.leave}
        if fault.leave and not fault.grow_servers and set(range(self.servers)) <= leaving:
            found.append(setting_problem("{leave}: every parameter server (ids 0..%d) would leave; the last server "
                                         "cannot leave (its shards need a home): keep one, or add servers with "
                                         "{grow_servers}" % (self.servers - 1)))
        return found


@dataclass(frozen=True)
class Hybrid(PS):
    """PERSIA's hybrid: the sparse tables on ``servers`` parameter servers (PS's settings), the
    dense parameters replicated on every worker and reduced among the workers by allreduce
    every step (``train.ps.dense_replica``)."""

    mode: ClassVar[str] = "hybrid"

    def problems(self, config: "TrainConfig", size: int, ft: bool) -> List[SettingProblem]:
        """Beyond PS's: what the workers' dense replicas (``train.ps.dense_replica``) do not do yet."""
        found = super().problems(config, size, ft)
        if self.fetch_every != 1:
            found.append(setting_problem("{fetch_every} paces pulls of dense tables from the servers; {mode} hybrid "
                                         "keeps them on the workers (sparse rows are read every step): leave it out"))
        if config.device == "gpu":
            found.append(setting_problem("{device} gpu is not supported by {mode} hybrid yet; use {device} cpu "
                                         "or {mode} ps"))
        return found


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"must be on or off, got {text!r}")
    return text == "on"


@dataclass(frozen=True)
class Sandblaster:
    """DistBelief's batch procedure: ``servers`` vector servers, a coordinator, the rest workers.
    ``unit``: examples per work unit (None: batch // (8 * workers))."""

    mode: ClassVar[str] = "sandblaster"
    # a batch method's; its line search sets every step's length, so no model's learning rate applies
    defaults: ClassVar[Dict[str, Any]] = {"steps": 100, "optimizer": "lbfgs", "lr": LR}

    servers: int = field(default=1, metadata={"option": SERVERS})
    unit: Optional[int] = option(None, "--unit", "examples per work unit (default: batch / (8 x workers))",
                                 metavar="N")
    history: int = option(10, "--history", "L-BFGS memory: (s, y) pairs", metavar="M", bound=HISTORY_AND_PUSHES)
    backups: bool = option(True, "--backups", "backup tasks near the end of a pass (default on)",
                           metavar="on|off", parse=_on_off)
    gtol: float = option(1e-6, "--gtol", "stop when ||gradient|| <= X", metavar="X", bound=non_negative_finite())
    ftol: float = option(1e-10, "--ftol", "stop when an iteration lowers the objective by <= X relative",
                         metavar="X", bound=non_negative_finite())
    l2: float = option(1e-4, "--l2", "weight of 0.5 ||x||^2 in the objective", metavar="X",
                       bound=non_negative_finite())
    push_units: int = option(4, "--push-units", "a worker pushes its gradients every N units kept", metavar="N",
                             bound=HISTORY_AND_PUSHES)

    def problems(self, config: "TrainConfig", size: int, ft: bool) -> List[SettingProblem]:
        fault = config.fault
        found: List[Optional[SettingProblem]] = [roles_problem(self.servers, size)]
        if config.optimizer not in METHODS:
            found.append(setting_problem("{optimizer} {value!r} does not fit {mode} sandblaster, a batch method: "
                                         "use one of {choices}", value=config.optimizer, choices=", ".join(METHODS)))
        if config.device == "gpu":
            found.append(setting_problem("{device} gpu applies to {mode} ring and ps; {mode} sandblaster computes on "
                                         "the host"))
        if config.lr != LR:
            found.append(setting_problem("{lr} applies to {mode} ring and ps; {mode} sandblaster's line search sets "
                                         "the length of each step (leave {lr} out)"))
        if self.unit is not None and not 1 <= self.unit <= config.batch:
            found.append(setting_problem("{unit} must be from 1 to {batch} ({size}), got {value}",
                                         size=config.batch, value=self.unit))
        if fault.grow or fault.leave or fault.discover or fault.replace or fault.checkpoint_every:
            found.append(setting_problem("{mode} sandblaster recovers from failures in-job only (--ft): leave out "
                                         "{grow}, {leave}, {discover}, {replace} and {checkpoint_every} (it "
                                         "checkpoints only at a stop signal, into {checkpoint_dir})"))
        if not ft and (fault.kills or fault.kill_random):
            found.append(setting_problem("in {mode} sandblaster, {kills} and {kill_random} need in-job fault "
                                         "tolerance: launch with ULFM (--ft)"))
        if self.servers == 1 and any(kill.rank == 0 for kill in fault.kills):
            found.append(setting_problem("{kills}: rank 0 is the only server of {mode} sandblaster with "
                                         "{servers} 1, whose slice has no replica: nothing could recover it; "
                                         "use {servers} 2 or more"))
        return [problem for problem in found if problem is not None] + _server_growth_problems(config)


Topology = Union[Ring, PS, Hybrid, Sandblaster]
TOPOLOGIES: Dict[str, type] = {kind.mode: kind for kind in (Ring, PS, Hybrid, Sandblaster)}
MODES: Tuple[str, ...] = tuple(TOPOLOGIES)


@dataclass
class TrainConfig:
    """What a training run was asked to do. ``batch`` is the global batch per step, split over
    the workers, so a run computes the same thing for any number of workers (in sandblaster
    mode: the fixed batch of the batch method, ``steps`` its most iterations). ``data``: a data
    directory to train the built-in model on (``hpcreduce train --data``; ``train()`` takes a
    data set instead)."""

    model: str = option("logreg", "--model", "logreg (sparse hashed features, synthetic clicks), mlp "
                        "(scikit-learn digits), embed (embeddings and their interactions, on clicks with "
                        "pairwise interactions) or logreg-interaction (logreg on those)", metavar="NAME")
    data: Optional[str] = option(None, "--data", "train on the .npy shards of data directory DIR (hpcreduce "
                                 "data write makes one; each worker opens only its shards) instead of the model's "
                                 "built-in data", metavar="DIR")
    table_rows: Optional[int] = option(None, "--table-rows", "logreg, logreg-interaction: rows of the hashed "
                                       "feature table, a power of two (default 2**20)", metavar="R")
    admit_after: int = option(1, "--admit-after", "embed: pushes of an id before its dynamic tables give it a row "
                              "(until then it reads as its initial value and its gradients are dropped)",
                              metavar="K", bound=at_least(1))
    admit_probability: float = option(1.0, "--admit-probability", "embed: an id due a row gets one with this "
                                      "probability", metavar="P", bound=probability())
    row_budget: int = option(0, "--row-budget", "embed: bytes a server's shard of each dynamic table may hold "
                             "(4M, 1G...; 0: unbounded); past it the coldest rows are evicted", metavar="BYTES",
                             parse=parse_size, bound=at_least(0))
    eviction: str = option("lru", "--eviction", "embed: which rows go past --row-budget: lru (least recently "
                           "pushed) or lfu (least often)", metavar="HOW", choices=EVICTIONS,
                           needs=("row_budget",))
    steps: int = option(200, "--steps", "training steps (default: the model's)", metavar="S", bound=STEPS_AND_BATCH)
    batch: int = option(4096, "--batch", "global batch per step, split over the workers (default: the model's)",
                        metavar="B", bound=STEPS_AND_BATCH)
    lr: float = option(LR, "--lr", "learning rate (default: the model's; not sandblaster's, whose line search "
                       "sets each step)", metavar="X", bound=positive_finite())
    optimizer: str = option("adagrad", "--optimizer", "sgd, momentum, adagrad or adam (default: the model's); "
                            "sandblaster: lbfgs (default) or gd", metavar="NAME")
    device: str = option("cpu", "--device", "cpu (numpy) or gpu (cupy; each rank takes GPU local rank %% GPUs; "
                         "ring and ps modes)", metavar="cpu|gpu", choices=DEVICE_KINDS)
    shard_optimizer: bool = option(False, "--shard-optimizer", "ring: ZeRO-1, each rank keeps and steps 1/N of the "
                                   "optimizer state, then the parameters are allgathered (the same result)",
                                   switch=True)
    seed: int = option(0, "--seed", "seed of data, initial parameters and batch order", metavar="SEED",
                       bound=at_least(0))
    json_path: Optional[str] = option(None, "--json", "write per-step metrics and the final result here (rank 0)",
                                      metavar="PATH")
    progress: str = option("auto", "--progress", "bar (redrawn in place), lines (every ~10%% of the steps), none, "
                           "or auto: a bar when stdout is a terminal, else lines", metavar="HOW", choices=PROGRESS)
    metrics_path: Optional[str] = option(None, "--metrics", "write one JSON object per step here as the run goes "
                                         "(JSON lines)", metavar="PATH")
    timeline_path: Optional[str] = option(None, "--timeline", "write every rank's compute/communication/wait "
                                          "phases here (Chrome trace JSON, gathered to rank 0 at the end)",
                                          metavar="PATH")
    topology: Topology = field(default_factory=Ring)
    fault: FaultConfig = field(default_factory=FaultConfig)

    @property
    def mode(self) -> str:
        return self.topology.mode

    @property
    def servers(self) -> int:
        """The server ranks of the topology (0 in ring mode)."""
        return getattr(self.topology, "servers", 0)

    def problems(self, size: int, ft: bool = True) -> List[SettingProblem]:
        """What is wrong with these settings for a job of ``size`` ranks (``ft``: with ULFM),
        by field name; empty when fine. The same on every rank (output files: ``output_problems``)."""
        found = field_problems(self) + field_problems(self.topology) + self._table_rows_problems()
        found += partner_problems(self) + partner_problems(self.topology)
        found += self._dynamic_problems() + self._shard_optimizer_problems(ft)
        found += self.topology.problems(self, size, ft) + self._slow_role_problems()
        return found + self.fault.problems(self.steps, size, ft, self.has_servers)

    @property
    def has_servers(self) -> bool:
        """Whether parameter servers hold tables (``ps`` and ``hybrid``; not sandblaster's vector servers)."""
        return isinstance(self.topology, PS)

    def _shard_optimizer_problems(self, ft: bool) -> List[SettingProblem]:
        """``--shard-optimizer`` (ring only): its sharded optimizer state is not carried through
        recovery, growth or checkpoints yet, nor computed on a GPU."""
        if not self.shard_optimizer:
            return []
        if self.mode != "ring":
            return [setting_problem("{shard_optimizer} applies to {mode} ring; {mode} %s keeps its optimizer state "
                                    "on the servers or in its own replicas" % self.mode)]
        fault = self.fault
        found = [setting_problem("{shard_optimizer} needs {device} cpu")] if self.device != "cpu" else []
        if ft or fault.needs_ulfm() or fault.checkpoint_dir or fault.kills or fault.kill_random or fault.node_kills:
            found.append(setting_problem("{shard_optimizer} runs without in-job fault tolerance (--ft), kills, growth "
                                         "and {checkpoint_dir} for now: its optimizer state is sharded over the ranks "
                                         "and not yet carried through recovery or checkpoints"))
        return found

    def _table_rows_problems(self) -> List[SettingProblem]:
        """``table_rows`` (logreg's hashed feature space): a power of two from 2 to 2**40."""
        rows = self.table_rows
        if rows is None:
            return []
        if self.model not in HASHED_MODELS:
            return [setting_problem("{table_rows} sets the hashed feature space of {model} "
                                    + " and ".join(HASHED_MODELS) + ", not of {model} {value}", value=self.model)]
        if not 2 <= rows <= 2**40 or rows & (rows - 1):
            return [setting_problem("{table_rows} must be a power of two from 2 to 2**40, got {value}", value=rows)]
        return []

    def _dynamic_problems(self) -> List[SettingProblem]:
        """Dynamic-table settings given for a model without dynamic tables."""
        given = [name for name in DYNAMIC_SETTINGS if getattr(self, name) != self.__dataclass_fields__[name].default]
        if given and self.model not in DYNAMIC_MODELS:
            return [setting_problem(" and ".join("{%s}" % name for name in given) + " set(s) the dynamic tables of {model} "
                                    + " and ".join(DYNAMIC_MODELS) + ", not of {model} {value}", value=self.model)]
        return []

    def dynamic(self) -> Dynamic:
        """The dynamic tables' settings of a model that has them, seeded by the run."""
        return Dynamic(admit_after=self.admit_after, admit_probability=self.admit_probability,
                       budget_bytes=self.row_budget, eviction=self.eviction, seed=self.seed)

    def _slow_role_problems(self) -> List[SettingProblem]:
        """Stragglers named among the ranks that compute no gradients: PS servers, and Sandblaster's
        servers and coordinator (slowing them would do nothing)."""
        computing_from = self.servers + (self.mode == "sandblaster")
        return [setting_problem("{slow} %d:%g: rank %d is %s, which computes no gradients; slow a worker "
                                "(rank %d or above)" % (rank, factor, rank, "a server" if rank < self.servers
                                                       else "the coordinator", computing_from))
                for rank, factor in self.fault.slow if rank < computing_from]

    def output_problems(self) -> List[SettingProblem]:
        """What this rank's disk says against the outputs (``runtime.places``): files
        (json_path, metrics_path, timeline_path) and folders (checkpoint_dir, model_dir) that
        cannot be written here, or that name an input (``data``), another output or a place
        inside their folders. Asked of the rank that writes (rank 0), whose answer every rank takes."""
        return place_problems([*(Place(name, getattr(self, name)) for name in OUTPUTS),
                               Place("checkpoint_dir", self.fault.checkpoint_dir, folder=True),
                               Place("model_dir", getattr(self.topology, "model_dir", None), folder=True),
                               Place("data", self.data, folder=True, output=False)])

    def writes_files(self) -> bool:
        """Whether the run writes any file (a result, metrics, a timeline, checkpoints, a model)."""
        return (any(getattr(self, name) for name in OUTPUTS) or bool(self.fault.checkpoint_dir)
                or bool(getattr(self.topology, "model_dir", None)))

    def as_dict(self) -> Dict[str, Any]:
        """The settings as plain values, flat as the results JSON has them: ``mode`` and the
        topology's fields beside the shared ones, ``fault`` nested."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("topology", "fault")}
        return {"mode": self.mode, **shared, **dataclasses.asdict(self.topology),
                "fault": dataclasses.asdict(self.fault)}


__all__ = ["TrainConfig", "Ring", "PS", "Hybrid", "Sandblaster", "Topology", "TOPOLOGIES", "MODES"]
