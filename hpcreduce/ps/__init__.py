"""Parameter server: K server ranks hold sharded tables, the other ranks pull and push.

    from hpcreduce import ps
    specs = [ps.ParamSpec("w", (1024, 16)), ps.ParamSpec("emb", (1 << 20, 8), sparse=True)]
    role = ps.start(specs, lambda: initial_values, servers=2,
                    consistency=ps.Consistency("ssp", 2), optimizer="adagrad", lr=0.1, comm=comm)
    if isinstance(role, ps.Server):
        role.serve()                          # until every worker released it
    else:
        w = role.pull("w")                    # dense tables whole; sparse ones by rows:
        rows = role.pull_rows("emb", ids)
        role.push("w", grad_w)                # or push_async(...) -> Handle; handle.wait()
        role.push_rows("emb", ids, grad_rows)
        role.clock()                          # end of this worker's step
        ...
        role.release()

The servers run the update rule (``optimizer``) on their shards; consistency says when
a push is applied and a read answered (BSP, SSP with a staleness bound, ASP). Protocol,
placement, consistency and costs: docs/parameter-server.md. Training models on it:
``hpcreduce.train`` (``mode="ps"``).
"""
from ..errors import PSConfigError, PSInputError, PSRefusedError, PSTrainingError
from .consistency import Consistency
from .handles import Handle, PushResult
from .optimizers import OPTIMIZERS
from .server import Server
from .start import start
from .tables import Dynamic, ParamSpec, dynamic_table
from .worker import Worker

__all__ = ["start", "ParamSpec", "Dynamic", "dynamic_table", "Consistency", "OPTIMIZERS", "Server", "Worker", "Handle", "PushResult",
           "PSConfigError", "PSInputError", "PSRefusedError", "PSTrainingError"]
