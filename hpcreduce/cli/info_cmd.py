"""``hpcreduce info [--json]``: the MPI library and what this launch can do."""
from __future__ import annotations

import json
import platform

from ..runtime import environment, nodes
from ..runtime.devices import gpu_summary


def register(subcommands) -> None:
    parser = subcommands.add_parser("info", help="show the MPI library, ULFM, CUDA-awareness, launcher",
                                    description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def collect() -> dict:
    """Facts about this process's MPI and hardware (initialises MPI)."""
    from mpi4py import MPI
    import mpi4py
    from ..runtime.context import start_mpi
    start_mpi()
    problem = environment.failure_detection_problem()
    rank_nodes = nodes.rank_nodes(MPI.COMM_WORLD)
    return {
        "mpi_library": environment.mpi_library(MPI),
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "mpi4py": mpi4py.__version__,
        "ulfm_supported": environment.ulfm_supported(MPI),
        "ft_enabled": environment.ft_enabled(MPI) and problem is None,
        "ft_problem": problem,
        "cuda_aware": environment.cuda_aware(MPI),
        "gpu": gpu_summary(),
        "launcher": environment.detect_launcher(),
        "ranks": MPI.COMM_WORLD.Get_size(),
        "cores": environment.usable_cores(),
        "node": rank_nodes[MPI.COMM_WORLD.Get_rank()],
        "nodes": nodes.ranks_by_node(rank_nodes),
        "python": platform.python_version(),
    }


def run(args, _argv) -> int:
    facts = collect()
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    yes = {True: "yes", False: "no"}
    print(f"MPI library     {facts['mpi_library']} (MPI {facts['mpi_standard']}, mpi4py {facts['mpi4py']})")
    print(f"ULFM            {yes[facts['ulfm_supported']]} in the library; "
          f"{'enabled' if facts['ft_enabled'] else 'off: ' + str(facts['ft_problem'])} in this launch")
    print(f"CUDA-aware MPI  {yes[facts['cuda_aware']]}")
    gpu = facts["gpu"]
    print("GPUs            " + (f"{gpu['gpus']}: {', '.join(gpu['names'])} (cupy {gpu['cupy']}, CUDA driver "
                                f"{gpu['cuda_driver']}); train --device gpu takes GPU local rank % {gpu['gpus']}"
                                if gpu["gpus"] else f"none: {gpu['problem']}"))
    print(f"launcher        {facts['launcher']}")
    print(f"ranks / cores   {facts['ranks']} / {facts['cores']}")
    ranks = [0] * facts["ranks"]
    for node, on_node in facts["nodes"].items():
        for rank in on_node:
            ranks[rank] = node
    print(f"nodes           {nodes.describe(ranks)}")
    return 0
