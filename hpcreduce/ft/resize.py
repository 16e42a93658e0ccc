"""When a running job grows or shrinks: one rule for both topologies.

Growth is asked for by ``--grow N@STEP`` entries (N more ranks before step STEP), scale-in
by ``--leave ID@STEP`` entries (the rank with stable id ID leaves before step STEP), and
both by a discovery file read every ``discover_every`` steps (``read_discovery``). The
file holds either the wanted number of ranks or Horovod's discovery format, one
``HOST[:SLOTS]`` a line (SLOTS defaults to 1; ``#`` starts a comment). Every number read is
bounded where it is parsed: a count of ranks or slots by ``runtime.environment.MAX_RANKS``,
and what the file asks for by the most ranks the job may grow to (``runtime.spawn.growth_limit``:
``--max-ranks``, the hostfile's slots, Slurm's allocation, else this node's CPUs): a bare number
past it is cut down to it (and said), hosts whose slots add up past it are a problem (the job
goes on unchanged). The file is read as ``runtime.given_files`` reads what we are pointed at:
a regular file of at most ``MAX_BYTES``, never a FIFO or a device that would block rank 0.
``GrowthRule.leavers`` names the ids that leave before a step; ``GrowthRule.count`` is how
many ranks to add then (after the leavers are gone). The spawn and merge themselves are
``hpcreduce.runtime.spawn``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Collection, Dict, List, Optional, Sequence, Set, Tuple, Union

from ..errors import LaunchError
from ..runtime.hosts import hostfile_hosts
from ..runtime.given_files import read_regular
from ..runtime.nodes import this_node
from ..runtime.environment import MAX_RANKS
from ..runtime.spawn import growth_limit

LOCAL_NAMES = ("localhost", "127.0.0.1")
_NUMBER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: str.isdigit also takes "²", which int refuses
_SLOTS = re.compile(r"[0-9]+")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a host name or address: no spaces, signs or other scripts
_NUMBERLIKE = re.compile(r"[0-9_.]+")
_IPV4 = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
MAX_BYTES = 1 << 20  # a discovery file's most bytes: ample for a line per host of any cluster


@dataclass(frozen=True)
class Wanted:
    """What a discovery file asks for: ``total`` ranks; ``hosts``: {host: slots} (short
    names, in file order), or None for a file holding a plain number; ``bounded``: the
    warning when that number was cut down to the most the job may grow to (``GrowthRule.limit``)."""

    total: int
    hosts: Optional[Dict[str, int]] = None
    bounded: Optional[str] = field(default=None, compare=False)


Discovery = Union[Wanted, str, None]
"""``read_discovery``'s answer: what the file asks for, a problem (a sentence), or None (no file yet)."""


@dataclass(frozen=True)
class GrowthRule:
    """``grow``: (count, step) entries; ``leave``: (id, step) entries; ``discover``: the
    discovery file, read at steps that are multiples of ``discover_every``; ``max_ranks`` and
    ``hostfile``: what bounds what the file asks for, with Slurm's allocation (``limit``)."""

    grow: Sequence[Tuple[int, int]] = ()
    discover: Optional[str] = None
    discover_every: int = 1
    leave: Sequence[Tuple[int, int]] = ()
    max_ranks: Optional[int] = None
    hostfile: Optional[str] = None

    def limit(self) -> Tuple[int, str]:
        """The most ranks the discovery file may take the job to, and what says so."""
        return growth_limit(self.max_ranks, self.hostfile)

    def reads_target(self, step: int) -> bool:
        """Whether the discovery file is read before ``step``."""
        return bool(self.discover) and step % self.discover_every == 0

    def wanted(self, step: int, known_hosts: Optional[Collection[str]] = None) -> Discovery:
        """The discovery file's answer when it is read before ``step`` (None otherwise); a bare
        number past ``limit`` is cut down to it (``Wanted.bounded`` says so), hosts past it are a
        problem. Read by one rank,
        which broadcasts it (the answer pickles); never raises, since the others wait for it: a
        file it cannot use is a problem like any other."""
        if not self.reads_target(step):
            return None
        try:
            found = read_discovery(self.discover, known_hosts)
            limit, why = self.limit()
        except Exception as err:  # noqa: BLE001 - whatever the file holds, the job goes on
            return f"discovery file {self.discover}: cannot use it ({type(err).__name__}: {err})"
        if not isinstance(found, Wanted) or found.total <= limit:
            return found
        past = f"discovery file {self.discover} asks for {found.total} ranks, more than the {limit} of {why}"
        return Wanted(limit, bounded=f"{past}: the job grows to {limit} at most") if found.hosts is None else \
            f"{past}: refused"

    def count(self, after: int, step: int, size: int, target: Union[Wanted, int, None] = None) -> int:
        """Ranks to add to a job of ``size`` ranks (the leavers gone) before ``step``, growth
        before step ``after`` being done; ``target``: what the discovery file asked for, if read."""
        count = sum(n for n, at in self.grow if after < at <= step)
        total = target.total if isinstance(target, Wanted) else target
        if total is not None and total > size + count:
            count = total - size
        return count

    def leavers(self, after: int, step: int, ids: Sequence[int], hosts: Sequence[str],
                wanted: Union[Wanted, int, None]) -> List[int]:
        """The stable ids that leave before ``step`` (sorted), scale-in before step ``after``
        being done. ``ids[r]``/``hosts[r]``: rank r's id and node; ``wanted``: what the
        discovery file asked for (None when not read). They are the ``--leave`` entries due
        in (after, step] of ids still present, plus those the file drops: for a number, the
        highest ids beyond it; for hosts, every rank on a host it no longer lists and, on a
        host listed with fewer slots than it has ranks, the highest ids there. The job never
        loses its last rank this way: should every rank be due to leave, the lowest id stays."""
        present = set(ids)
        leaving = {identity for identity, at in self.leave if after < at <= step and identity in present}
        if isinstance(wanted, int):
            wanted = Wanted(wanted)
        staying = sorted(present - leaving)
        if wanted is not None and wanted.hosts is None:
            leaving.update(staying[max(wanted.total, 0):])
        elif wanted is not None:
            host_of = dict(zip(ids, hosts))
            for host in dict.fromkeys(hosts):
                there = [identity for identity in staying if host_of[identity] == host]
                leaving.update(there[wanted.hosts.get(host, 0):])
        if present and leaving >= present:  # never the last rank: the lowest id stays
            leaving.discard(min(present))
        return sorted(leaving)


def discovery_warning(found: Discovery) -> Optional[str]:
    """What rank 0 warns of for the discovery file's answer ``found``, if anything: a problem (the
    job goes on unchanged) or a number cut down to the slots there are."""
    if isinstance(found, str):
        return f"{found}; the job goes on unchanged (fix the file: it is read again)"
    return found.bounded if isinstance(found, Wanted) else None


def _number_at_step(text: str, form: str, example: str) -> Tuple[int, int]:
    """``A@B`` as two integers; ValueError naming ``form`` (e.g. ``N@STEP``) otherwise."""
    try:
        number, step = (int(part) for part in text.split("@"))
    except ValueError:
        raise ValueError(f"{text!r}: expected {form}, e.g. {example}") from None
    return number, step


def parse_grow(text: str) -> Tuple[int, int]:
    """``N@STEP``: (N, STEP), add N ranks before step STEP."""
    count, step = _number_at_step(text, "N@STEP", "2@50")
    if not 1 <= count <= MAX_RANKS or step < 0:
        raise ValueError(f"{text!r}: N must be from 1 to {MAX_RANKS} and STEP >= 0")
    return count, step


def parse_leave(text: str) -> Tuple[int, int]:
    """``ID@STEP``: (ID, STEP), the rank with stable id ID leaves before step STEP; whether
    they fit the job is ``FaultConfig.problems``'s to say."""
    identity, step = _number_at_step(text, "ID@STEP", "2@50 (rank id 2 leaves before step 50)")
    if identity < 0 or step < 0:
        raise ValueError(f"{text!r}: ID and STEP must be >= 0")
    return identity, step


def read_discovery(path: str, known_hosts: Optional[Collection[str]] = None) -> Discovery:
    """What the discovery file at ``path`` asks for: a ``Wanted``; None while it is absent or
    empty (a file being rewritten is read again at the next poll); or a problem, as a
    sentence naming the file: unreadable, a malformed line, a host twice, a host not in
    ``known_hosts`` (short names; ``localhost`` is this node), no rank wanted."""
    try:
        text = read_regular(path, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        return f"discovery file {path}: cannot read it ({err})"
    lines = [(number, line.split("#", 1)[0].strip()) for number, line in enumerate(text.splitlines(), 1)]
    lines = [(number, line) for number, line in lines if line]
    if not lines:
        return None
    if len(lines) == 1 and _NUMBER.fullmatch(lines[0][1]):
        total = int(lines[0][1])
        return Wanted(total) if 1 <= total <= MAX_RANKS else \
            f"discovery file {path}: asks for {total} ranks; from 1 to {MAX_RANKS} can run"
    hosts: Dict[str, int] = {}
    for number, line in lines:
        host, colon, slots = (part.strip() for part in line.partition(":"))
        name = _short(host)
        if not _is_host(host) or (colon and not (_SLOTS.fullmatch(slots) and 1 <= int(slots) <= MAX_RANKS)):
            return (f"discovery file {path} line {number}: {line!r} is not HOST[:SLOTS] (SLOTS a number from 1 "
                    f"to {MAX_RANKS}) nor, alone in the file, a number of ranks")
        if name in hosts:
            return f"discovery file {path} line {number}: host {name} is listed twice"
        if known_hosts is not None and name not in {_short(known) for known in known_hosts}:
            return (f"discovery file {path} line {number}: host {name} is not one the job can run on "
                    f"(known: {', '.join(sorted({_short(known) for known in known_hosts}))})")
        hosts[name] = int(slots) if colon else 1
    if sum(hosts.values()) > MAX_RANKS:
        return (f"discovery file {path}: its hosts' slots add up to {sum(hosts.values())}, past the {MAX_RANKS} "
                "ranks a job may have")
    return Wanted(sum(hosts.values()), hosts)


def _is_host(text: str) -> bool:
    """Whether ``text`` can name a host: a name or an IPv4 address, not a mistyped number (``3.0``, ``1_000``)."""
    return bool(_HOST.fullmatch(text)) and (not _NUMBERLIKE.fullmatch(text) or bool(_IPV4.fullmatch(text)))


def known_hosts(nodes: Sequence[str], hostfile: Optional[str] = None) -> Set[str]:
    """The hosts a discovery file may name: the nodes the job runs on and its hostfile's hosts."""
    hosts = set(nodes)
    if hostfile:
        try:
            hosts.update(hostfile_hosts(hostfile))
        except LaunchError:  # refused before the launch; a file gone since adds nothing
            pass
    return hosts


def _short(host: str) -> str:
    """A host's short name, as ``runtime.nodes`` names nodes (``localhost``: this node)."""
    if host in LOCAL_NAMES:
        return this_node()
    return host if host.replace(".", "").isdigit() else host.split(".")[0]
