"""Settings of one training run, shared by the ring and parameter-server trainers."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..arrays import DEVICE_KINDS
from ..errors import SettingProblem, setting_problem
from ..ft.faults import FaultConfig
from ..ps.consistency import KINDS as CONSISTENCIES
from ..ps.layout import servers_problem
from ..ps.optimizers import OPTIMIZERS
from ..ft.checkpoint_files import folder_problem
from ..runtime.files import path_problem, written_through
from ..sandblaster import METHODS, roles_problem

MODES = ("ring", "ps", "sandblaster")
PROGRESS = ("auto", "bar", "lines", "none")
OUTPUTS = ("json_path", "metrics_path", "timeline_path")
WIRE_DTYPES = ("float32", "float16")  # ps: how pushed and pulled values travel (--wire-dtype)
IN_JOB_ONLY = ("grow", "grow_servers", "leave", "discover", "replace")  # ps: no checkpoint-and-relaunch form


@dataclass
class TrainConfig:
    """What ``hpcreduce train`` was asked to do.

    ``batch`` is the global batch per step, split over the workers (all ranks in ring
    mode, the non-server ranks in PS mode), so the run computes the same thing for any
    number of workers. In ``sandblaster`` mode ``batch`` is the fixed batch of a batch method
    (``optimizer`` lbfgs or gd), ``steps`` its most iterations, cut into work units of ``unit``
    examples (None: batch // (8 * workers)); ``history`` is L-BFGS's memory, ``backups``
    turns backup tasks on, ``gtol``/``ftol`` stop on the gradient norm or the relative drop of
    the objective, ``l2`` weighs its 0.5 ||x||^2 term and a worker pushes every ``push_units``
    kept units.
    ``device``: ``cpu`` (numpy) or ``gpu`` (cupy: each rank's GPU by its rank on the node;
    ring and ps modes). ``data``: a data directory of shards to train the built-in model on
    (``train.data_dir``; used by ``hpcreduce train --data``, not by ``train()``, which takes a data set).
    """

    mode: str = "ring"
    model: str = "logreg"
    steps: int = 200
    batch: int = 4096
    lr: float = 0.2
    optimizer: str = "adagrad"
    seed: int = 0
    servers: int = 1
    consistency: str = "bsp"
    staleness: int = 0
    fetch_every: int = 1
    push_every: int = 1
    table_rows: Optional[int] = None
    wire_dtype: str = "float32"
    model_dir: Optional[str] = None
    data: Optional[str] = None
    json_path: Optional[str] = None
    progress: str = "auto"
    metrics_path: Optional[str] = None
    timeline_path: Optional[str] = None
    unit: Optional[int] = None
    history: int = 10
    backups: bool = True
    gtol: float = 1e-6
    ftol: float = 1e-10
    l2: float = 1e-4
    push_units: int = 4
    device: str = "cpu"
    fault: FaultConfig = field(default_factory=FaultConfig)

    def problems(self, size: int, ft: bool = True) -> List[SettingProblem]:
        """What is wrong with these settings for a job of ``size`` ranks (``ft``: with ULFM),
        by field name; empty when fine. The same on every rank (output files are checked
        by ``output_problems``, on the rank that writes them)."""
        found = []
        if self.mode not in MODES:
            found.append(_choice("mode", MODES, self.mode))
        if self.consistency not in CONSISTENCIES:
            found.append(_choice("consistency", CONSISTENCIES, self.consistency))
        if self.steps < 1 or self.batch < 1:
            found.append(setting_problem("{steps} and {batch} must be at least 1, got {a} and {b}",
                                         a=self.steps, b=self.batch))
        if not 0 < self.lr < math.inf:
            found.append(setting_problem("{lr} must be positive and finite, got {value}", value=self.lr))
        found += self._optimizer_problems()
        if self.seed < 0:
            found.append(setting_problem("{seed} must be >= 0, got {value}", value=self.seed))
        if self.progress not in PROGRESS:
            found.append(_choice("progress", PROGRESS, self.progress))
        found += self._table_rows_problems()
        if self.model_dir and self.mode != "ps":
            found.append(setting_problem("{model_dir} (the model written sharded by its servers) applies to {mode} ps"))
        if self.device not in DEVICE_KINDS:
            found.append(_choice("device", DEVICE_KINDS, self.device))
        elif self.device == "gpu" and self.mode == "sandblaster":
            found.append(setting_problem("{device} gpu applies to {mode} ring and ps; {mode} sandblaster "
                                         "computes on the host"))
        if self.mode == "ring" and (self.consistency != "bsp" or self.staleness or self.servers != 1
                                    or self.fetch_every != 1 or self.push_every != 1):
            found.append(setting_problem("{servers}, {consistency}, {staleness}, {fetch_every} and "
                                         "{push_every} belong to {mode} ps; ring mode is synchronous"))
        if self.mode == "ps":
            found += self._ps_problems(size, ft) + self._ps_membership_problems()
        elif self.fault.grow_servers:
            found.append(setting_problem("{grow_servers} adds parameter servers: it applies to {mode} ps"))
        elif self.wire_dtype != "float32":
            found.append(setting_problem("{wire_dtype} applies to {mode} ps"))
        if self.mode == "sandblaster":
            found += self._sandblaster_problems(size, ft)
        else:
            given = [name for name in SANDBLASTER_FIELDS if getattr(self, name) != DEFAULTS[name]]
            if given:
                found.append(setting_problem(", ".join("{%s}" % name for name in given)
                                             + (" only apply" if len(given) > 1 else " only applies")
                                             + " to {mode} sandblaster"))
        return (found + self._slow_role_problems()
                + self.fault.problems(self.steps, size, ft, self.mode == "ps"))

    def _table_rows_problems(self) -> List[SettingProblem]:
        """``table_rows`` (logreg's hashed feature space): a power of two from 2 to 2**40."""
        rows = self.table_rows
        if rows is None:
            return []
        if self.model != "logreg":
            return [setting_problem("{table_rows} sets the hashed feature space of {model} logreg, not of "
                                    "{model} {value}", value=self.model)]
        if not 2 <= rows <= 2**40 or rows & (rows - 1):
            return [setting_problem("{table_rows} must be a power of two from 2 to 2**40, got {value}", value=rows)]
        return []

    def _slow_role_problems(self) -> List[SettingProblem]:
        """Stragglers named among the ranks that compute no gradients: PS servers, and Sandblaster's
        servers and coordinator (slowing them would do nothing)."""
        computing_from = {"ps": self.servers, "sandblaster": self.servers + 1}.get(self.mode, 0)
        return [setting_problem("{slow} %d:%g: rank %d is %s, which computes no gradients; slow a worker "
                                "(rank %d or above)" % (rank, factor, rank, "a server" if rank < self.servers
                                                       else "the coordinator", computing_from))
                for rank, factor in self.fault.slow if rank < computing_from]

    def _ps_problems(self, size: int, ft: bool) -> List[SettingProblem]:
        found = [servers_problem(self.servers, size)]
        if self.wire_dtype not in WIRE_DTYPES:
            found.append(_choice("wire_dtype", WIRE_DTYPES, self.wire_dtype))
        elif self.wire_dtype != "float32" and ft:
            found.append(setting_problem("{wire_dtype} %s is not yet supported with in-job fault tolerance "
                                         "(--ft); use float32" % self.wire_dtype))
        if self.consistency != "ssp" and self.staleness:
            found.append(setting_problem("{staleness} only applies to {consistency} ssp"))
        if self.consistency == "ssp" and self.staleness < 0:
            found.append(setting_problem("{staleness} must be >= 0, got {value}", value=self.staleness))
        if self.consistency != "asp" and (self.fetch_every != 1 or self.push_every != 1):
            found.append(setting_problem("{fetch_every} and {push_every} only apply to {consistency} asp"))
        if self.model_dir and self.model_dir == self.fault.checkpoint_dir:
            found.append(setting_problem("{model_dir} and {checkpoint_dir} name one folder, {path}: give each its own",
                                         path=self.model_dir))
        if self.fetch_every < 1 or self.push_every < 1:
            found.append(setting_problem("{fetch_every} and {push_every} must be at least 1"))
        fault = self.fault
        in_job = [name for name in IN_JOB_ONLY if getattr(fault, name)]
        if not ft and in_job:
            named = ["{%s}" % name for name in in_job]
            found.append(setting_problem("in {mode} ps, " + " and ".join([", ".join(named[:-1]), named[-1]] if
                                                                        len(named) > 1 else named)
                                         + " need%s in-job fault tolerance: launch with ULFM (--ft)"
                                         % ("" if len(named) > 1 else "s")))
        elif not ft and fault.needs_ulfm() and not fault.hangs_only():
            found.append(setting_problem(
                "in {mode} ps, {kills} and {kill_random} need in-job fault tolerance (--ft, ULFM) or "
                "{checkpoint_dir} with {checkpoint_every} and --restarts R: the job is then relaunched and "
                "resumes from the latest checkpoint"))
        if ft and self.servers == 1 and not fault.checkpoint_dir and not fault.accept_server_loss:
            found.append(setting_problem(
                "{mode} ps with in-job fault tolerance and {servers} 1 has no copy of the model but the "
                "server's: its death would end the job. Give {servers} 2 or more (each shard replicated on "
                "another server), or {checkpoint_dir} (a worker takes over from the latest checkpoint), or "
                "{accept_server_loss} to run anyway"))
        return [problem for problem in found if problem is not None]

    def _ps_membership_problems(self) -> List[SettingProblem]:
        """``--leave`` of every server (ids 0..K-1 while none is added): the shards need one."""
        leaving = {identity for identity, _ in self.fault.leave}
        if self.fault.leave and not self.fault.grow_servers and set(range(self.servers)) <= leaving:
            return [setting_problem("{leave}: every parameter server (ids 0..%d) would leave; the last server "
                                    "cannot leave (its shards need a home): keep one, or add servers with "
                                    "{grow_servers}" % (self.servers - 1))]
        return []

    def _optimizer_problems(self) -> List[SettingProblem]:
        if self.mode == "sandblaster" and self.optimizer not in METHODS:
            return [setting_problem("{optimizer} {value!r} does not fit {mode} sandblaster, a batch method: "
                                    "use one of {choices}", value=self.optimizer, choices=", ".join(METHODS))]
        if self.mode != "sandblaster" and self.optimizer in METHODS:
            return [setting_problem("{optimizer} {value!r} is a batch method of {mode} sandblaster; {mode} %s "
                                    "takes one of {choices}" % self.mode, value=self.optimizer,
                                    choices=", ".join(OPTIMIZERS))]
        if self.mode != "sandblaster" and self.optimizer not in OPTIMIZERS:
            return [_choice("optimizer", tuple(OPTIMIZERS), self.optimizer)]
        return []

    def _sandblaster_problems(self, size: int, ft: bool) -> List[SettingProblem]:
        found = [roles_problem(self.servers, size)]
        if self.consistency != "bsp" or self.staleness or self.fetch_every != 1 or self.push_every != 1:
            found.append(setting_problem("{consistency}, {staleness}, {fetch_every} and {push_every} belong to "
                                         "{mode} ps; sandblaster runs passes over the whole batch"))
        if self.unit is not None and not 1 <= self.unit <= self.batch:
            found.append(setting_problem("{unit} must be from 1 to {batch} ({size}), got {value}",
                                         size=self.batch, value=self.unit))
        for name in ("gtol", "ftol", "l2"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                found.append(setting_problem("{%s} must be >= 0 and finite, got {value}" % name, value=value))
        if self.history < 1 or self.push_units < 1:
            found.append(setting_problem("{history} and {push_units} must be at least 1, got {a} and {b}",
                                         a=self.history, b=self.push_units))
        return [problem for problem in found if problem is not None] + self._sandblaster_fault_problems(ft)

    def _sandblaster_fault_problems(self, ft: bool) -> List[SettingProblem]:
        """Sandblaster recovers in-job only (ULFM): no growth, no checkpoints; with one server
        (no replica) a server's death cannot be recovered from, so killing it is refused."""
        fault, found = self.fault, []
        if fault.grow or fault.leave or fault.discover or fault.replace or fault.checkpoint_dir:
            found.append(setting_problem("{mode} sandblaster recovers from failures in-job only (--ft): leave out "
                                         "{grow}, {leave}, {discover}, {replace} and {checkpoint_dir}"))
        if not ft and (fault.kills or fault.kill_random):
            found.append(setting_problem("in {mode} sandblaster, {kills} and {kill_random} need in-job fault "
                                         "tolerance: launch with ULFM (--ft)"))
        if self.servers == 1 and any(kill.rank == 0 for kill in fault.kills):
            found.append(setting_problem("{kills}: rank 0 is the only server of {mode} sandblaster with "
                                         "{servers} 1, whose slice has no replica: nothing could recover it; "
                                         "use {servers} 2 or more"))
        return found

    def _shared_outputs(self) -> List[SettingProblem]:
        """Outputs given one file: each would overwrite the other (what is written through,
        ``/dev/stdout``, devices and FIFOs, may be shared)."""
        by_path: Dict[str, List[str]] = {}
        for name in OUTPUTS:
            path = getattr(self, name)
            if path and not written_through(path):
                by_path.setdefault(os.path.realpath(path), []).append(name)
        return [setting_problem(" and ".join("{%s}" % name for name in names) + " name one file, {path}: "
                                "give each its own", path=getattr(self, names[0]))
                for names in by_path.values() if len(names) > 1]

    def output_problems(self) -> List[SettingProblem]:
        """What this rank's disk says against the outputs: files (json_path, metrics_path,
        timeline_path) that cannot be written here (their folders are created) or that name
        one file, and a checkpoint folder that cannot be one. Asked of the rank that writes
        (rank 0), whose answer every rank takes, so no two ranks decide differently."""
        found = self._shared_outputs()
        for name in OUTPUTS:
            path = getattr(self, name)
            why = path_problem(path) if path else None
            if why:
                found.append(setting_problem("{%s} {path}: {why}" % name, path=path, why=why))
        for name, folder in (("checkpoint_dir", self.fault.checkpoint_dir), ("model_dir", self.model_dir)):
            why = folder_problem(folder) if folder else None
            if why:
                found.append(setting_problem("{%s} {path}: {why}" % name, path=folder, why=why))
        return found

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


SANDBLASTER_FIELDS = ("unit", "history", "backups", "gtol", "ftol", "l2", "push_units")
DEFAULTS = {name: TrainConfig.__dataclass_fields__[name].default for name in SANDBLASTER_FIELDS}


def _choice(name: str, choices: Sequence[str], value: object) -> SettingProblem:
    return setting_problem("{%s} must be one of {choices}, got {value!r}" % name,
                           choices=", ".join(choices), value=value)
