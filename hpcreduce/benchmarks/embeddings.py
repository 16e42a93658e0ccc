"""``hpcreduce bench embeddings``: embedding tables on the parameter server, measured (issue 25).

Parts (``--parts``, in this order, all in one job):

- ``rows``: rows per second of a sparse pull+push of ``--rows`` ids x ``--width`` float32
  against raw point-to-point of the same bytes between the same ranks (``embedding_rows``).
- ``scale``: a stream of ``--ids`` distinct ids pushed through a dynamic table on K servers
  (``--replicas``: each also holds its predecessor's shard) within ``--budget`` bytes a server:
  ids/s, server peak RSS against base and budget, rows created/admitted/evicted, load, worker
  RSS along the stream (``embedding_scale``).
- ``peers``: a DLRM-like model (embedding bags, dot interactions, MLPs) on the same data and
  ranks with torch DDP over a replicated ``nn.EmbeddingBag(sparse=True)`` (gloo), TorchRec on
  CPU where it imports, and hpcreduce's PS-backed embedding bag where it exists: examples/s,
  bytes per step, RSS per rank (``embedding_peers``; needs torch).

The defaults are a smoke test's sizes; the issue's figures take ``--ids 1G --servers 8
--replicas`` and larger tables (bench/embeddings.sh). Cost: ``rows`` about 2 x ``--rounds`` x
``--reps`` pull+push calls; ``scale`` ``--ids`` / ``--push-rows`` pushes; ``peers``
(``--warmup`` + ``--iterations``) steps of each candidate.
"""
from __future__ import annotations

from typing import Dict, List

from ..runtime.context import Context
from . import embedding_rows, embedding_scale
from .timing import launch_facts

NAME = "embeddings"
HELP = "embedding tables: sparse rows/s vs raw MPI, a stream of distinct ids at scale, DLRM vs torch peers"
PARTS = ("rows", "scale", "peers")


def run(context: Context, args) -> Dict[str, object]:
    result: Dict[str, object] = {"benchmark": NAME, **launch_facts(context.comm), "parts": args.parts}
    if "rows" in args.parts:
        result["rows"] = embedding_rows.measure(context, args)
    if "scale" in args.parts:
        result["scale"] = embedding_scale.measure(context, args)
    if "peers" in args.parts:
        from . import embedding_peers  # imports torch: only when asked for
        result["peers"] = embedding_peers.measure(context, args)
    return result


def render(result: Dict[str, object]) -> str:
    lines: List[str] = [f"embeddings, {result['ranks']} ranks on {result['cores']} cores"
                        f"{' (oversubscribed)' if result['oversubscribed'] else ''}, transport {result['transport']}"]
    if "rows" in result:
        lines += embedding_rows.render(result["rows"])
    if "scale" in result:
        lines += embedding_scale.render(result["scale"])
    if "peers" in result:
        from . import embedding_peers
        lines += embedding_peers.render(result["peers"])
    return "\n".join(lines)
