"""Parameter server: servers hold sharded parameters, workers pull and push.

    from hpcreduce.ps import Consistency, Server, start
    role = start(ctx, specs, initial, servers=2, consistency=Consistency("bsp"))
    # a Server on ranks 0..K-1 (role.serve()), a PSWorker on the others:
    # pull / push / pull_rows / push_rows / clock / release, and *_async -> Handle.wait()

Training: ``hpcreduce.ps.training.run_ps_training(ctx, config, model, dataset)``.
Protocol, consistency rules and costs: docs/parameter-server.md.
"""
from .consistency import Consistency
from .errors import PSConfigError, PSInputError, PSRefusedError, PSTrainingError
from .handles import Handle, PushResult
from .job import start
from .layout import Layout
from .placement import Piece, Placement, place
from .server import Server
from .state import ShardState
from .worker import PSWorker

__all__ = ["Consistency", "start", "Server", "PSWorker", "Handle", "PushResult", "Layout",
           "Placement", "Piece", "place", "ShardState", "PSConfigError", "PSInputError",
           "PSRefusedError", "PSTrainingError"]
