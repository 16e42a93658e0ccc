"""What each topology says against a run's settings beyond their fields' own ranges:
settings that depend on each other, on the job's size or on whether ULFM is on (``ft``).

Each check returns problems worded by field name (``train.config``'s fields and the
topology part's; ``{mode}`` is the ``--mode`` flag on the command line).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional

from ..errors import SettingProblem, setting_problem
from ..ps.layout import servers_problem
from ..ps.optimizers import OPTIMIZERS
from ..runtime.options import default_of
from ..sandblaster import METHODS, roles_problem

if TYPE_CHECKING:
    from .config import PS, Sandblaster, TrainConfig  # noqa: F401 (PS: also Hybrid's settings)

KILLS = ("kills", "kill_random", "node_kills")
"""The injected failures, which a job without ULFM recovers by a relaunch from its checkpoints
(the settings that work in-job only declare ``needs=(FT,)``: ``FaultConfig``)."""


def ring_problems(config: "TrainConfig", ft: bool) -> List[SettingProblem]:
    found = _optimizer_problems(config)
    killing = _given_kills(config)
    if killing and not ft and not config.fault.checkpoint_dir:
        found.append(setting_problem(killing + " need%s in-job fault tolerance: launch with --ft (ULFM), or give "
                                     "{checkpoint_dir} and --restarts to recover kills by relaunching"
                                     % ("" if " and " in killing else "s")))
    return found + _server_growth_problems(config)


def _given_kills(config: "TrainConfig") -> str:
    """The injected failures given, as ``{kills} and {kill_random}`` (empty: none)."""
    given = ["{%s}" % name for name in KILLS if getattr(config.fault, name)]
    return " and ".join([", ".join(given[:-1]), given[-1]]) if len(given) > 1 else "".join(given)


def ps_problems(ps: "PS", config: "TrainConfig", size: int, ft: bool) -> List[SettingProblem]:
    fault = config.fault
    found = [problem for problem in [servers_problem(ps.servers, size)] if problem] + _optimizer_problems(config)
    if ps.wire_dtype != "float32" and ft:
        found.append(setting_problem("{wire_dtype} %s is not yet supported with in-job fault tolerance "
                                     "(--ft); use float32" % ps.wire_dtype))
    if ps.consistency != "ssp" and ps.staleness:
        found.append(setting_problem("{staleness} only applies to {consistency} ssp"))
    if ps.consistency != "asp" and (ps.fetch_every != 1 or ps.push_every != 1):
        found.append(setting_problem("{fetch_every} and {push_every} only apply to {consistency} asp"))
    if not ft and _given_kills(config) and not fault.checkpoint_dir and not fault.hangs_only():
        found.append(setting_problem(
            "in {mode} %s, {kills} and {kill_random} need" % config.mode + " in-job fault tolerance (--ft, ULFM) or "
            "{checkpoint_dir} with {checkpoint_every} and --restarts R: the job is then relaunched and "
            "resumes from the latest checkpoint"))
    if ft and ps.servers == 1 and not fault.checkpoint_dir and not fault.accept_server_loss:
        found.append(setting_problem(
            "{mode} %s with in-job fault tolerance and {servers} 1 has" % config.mode + " no copy of the model but the "
            "server's: its death would end the job. Give {servers} 2 or more (each shard replicated on "
            "another server), or {checkpoint_dir} (a worker takes over from the latest checkpoint), or "
            "{accept_server_loss} to run anyway"))
    leaving = {identity for identity, _ in fault.leave}
    if fault.leave and not fault.grow_servers and set(range(ps.servers)) <= leaving:
        found.append(setting_problem("{leave}: every parameter server (ids 0..%d) would leave; the last server "
                                     "cannot leave (its shards need a home): keep one, or add servers with "
                                     "{grow_servers}" % (ps.servers - 1)))
    return found


def hybrid_problems(config: "TrainConfig") -> List[SettingProblem]:
    """Beyond PS's: what the workers' dense replicas (``train.ps.dense_replica``) do not do yet."""
    found = []
    if config.topology.fetch_every != 1:
        found.append(setting_problem("{fetch_every} paces pulls of dense tables from the servers; {mode} hybrid "
                                     "keeps them on the workers (sparse rows are read every step): leave it out"))
    if config.device == "gpu":
        found.append(setting_problem("{device} gpu is not supported by {mode} hybrid yet; use {device} cpu "
                                     "or {mode} ps"))
    return found


def sandblaster_problems(sandblaster: "Sandblaster", config: "TrainConfig", size: int,
                         ft: bool) -> List[SettingProblem]:
    fault = config.fault
    found: List[Optional[SettingProblem]] = [roles_problem(sandblaster.servers, size)]
    if config.optimizer not in METHODS:
        found.append(setting_problem("{optimizer} {value!r} does not fit {mode} sandblaster, a batch method: "
                                     "use one of {choices}", value=config.optimizer, choices=", ".join(METHODS)))
    if config.device == "gpu":
        found.append(setting_problem("{device} gpu applies to {mode} ring and ps; {mode} sandblaster computes on "
                                     "the host"))
    if config.lr != _default(config, "lr"):
        found.append(setting_problem("{lr} applies to {mode} ring and ps; {mode} sandblaster's line search sets "
                                     "the length of each step (leave {lr} out)"))
    if sandblaster.unit is not None and not 1 <= sandblaster.unit <= config.batch:
        found.append(setting_problem("{unit} must be from 1 to {batch} ({size}), got {value}",
                                     size=config.batch, value=sandblaster.unit))
    if fault.grow or fault.leave or fault.discover or fault.replace or fault.checkpoint_every:
        found.append(setting_problem("{mode} sandblaster recovers from failures in-job only (--ft): leave out "
                                     "{grow}, {leave}, {discover}, {replace} and {checkpoint_every} (it "
                                     "checkpoints only at a stop signal, into {checkpoint_dir})"))
    if not ft and (fault.kills or fault.kill_random):
        found.append(setting_problem("in {mode} sandblaster, {kills} and {kill_random} need in-job fault "
                                     "tolerance: launch with ULFM (--ft)"))
    if sandblaster.servers == 1 and any(kill.rank == 0 for kill in fault.kills):
        found.append(setting_problem("{kills}: rank 0 is the only server of {mode} sandblaster with "
                                     "{servers} 1, whose slice has no replica: nothing could recover it; "
                                     "use {servers} 2 or more"))
    return [problem for problem in found if problem is not None] + _server_growth_problems(config)


def _default(config: "TrainConfig", name: str) -> object:
    """The default of ``config``'s field ``name``."""
    return next(default_of(f) for f in dataclasses.fields(config) if f.name == name)


def _server_growth_problems(config: "TrainConfig") -> List[SettingProblem]:
    """Ring and sandblaster: ``grow_servers`` is the parameter server's."""
    if config.fault.grow_servers:
        return [setting_problem("{grow_servers} adds parameter servers: it applies to {mode} ps")]
    return []


def shard_optimizer_problems(config: "TrainConfig", ft: bool) -> List[SettingProblem]:
    """``--shard-optimizer`` (ring only): its sharded optimizer state is not carried through
    recovery, growth or checkpoints yet, nor computed on a GPU."""
    if not config.shard_optimizer:
        return []
    if config.mode != "ring":
        return [setting_problem("{shard_optimizer} applies to {mode} ring; {mode} %s keeps its optimizer state "
                                "on the servers or in its own replicas" % config.mode)]
    fault = config.fault
    found = [setting_problem("{shard_optimizer} needs {device} cpu")] if config.device != "cpu" else []
    if ft or fault.needs_ulfm() or fault.checkpoint_dir or fault.kills or fault.kill_random or fault.node_kills:
        found.append(setting_problem("{shard_optimizer} runs without in-job fault tolerance (--ft), kills, growth "
                                     "and {checkpoint_dir} for now: its optimizer state is sharded over the ranks "
                                     "and not yet carried through recovery or checkpoints"))
    return found


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
