"""PyTorch interop (``pip install 'hpcreduce[torch]'``): data-parallel torch models over MPI ranks.

    import hpcreduce.torch as hpt
    model = hpt.DistributedDataParallel(model)     # torch DDP's interface: rank 0's weights everywhere
    for x, y in my_shard:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()          # buckets reduced while backward goes on
        optimizer.step()

``DistributedDataParallel`` (``ddp``): gradients live in persistent buckets (reverse
registration order); each bucket's reduction is started from autograd hooks as soon as its last
gradient is ready and runs on a reduction thread (``reducer``, ``comm_thread``) through its comm
hook (``hooks``, torch's ``register_comm_hook``: the mean through ``hpcreduce.collectives`` by
default, 16 bits on the wire with float32 sums, PowerSGD); every reduced bucket gets a
one-pass NaN/Inf check (``finite``); ``no_sync()`` accumulates. Importing this package
changes nothing global but the registered c10d backend and ``env://`` under an MPI launch (``c10d``;
the optimizer pre-hook that refuses a step inside ``no_sync`` lives
while a wrapper does). ``ZeroRedundancyOptimizer`` (``zero``): torch's sharded optimizer, each
rank stepping its slice of the parameters with its slice of the optimizer state. Without the wrapper:
``allreduce_gradients(model)`` after ``backward()`` (one ``allreduce_many``, after one summing
pass per gradient for ``check_finite``; ``bucket_gradients(model)`` first keeps gradients in
persistent fusion buffers), ``broadcast_parameters(model)`` (a small signature check, then one
``MPI_Bcast`` per tensor), and parameter servers (``start_parameter_server``: ``pull``/``push``,
one PS request per parameter, all in flight together; see docs/parameter-server.md).
Tensors are not copied where it can be helped: a CPU tensor is reduced through its numpy
view, a CUDA tensor through a cupy view (DLPack; staged through host memory unless MPI is
CUDA-aware). Bad input (different models on different ranks, a dtype hpcreduce does not
reduce, sparse or non-finite gradients) raises on every rank, naming the parameter.
For ``hpcreduce.elastic`` (docs/torch.md, "Elastic torch training"): ``ElasticSampler``
(``sampler``: DistributedSampler's shares, resharded when the ranks change) and
``save_checkpoint``/``load_checkpoint`` (``checkpoints``: files plain ``torch.load`` reads).
``c10d``: the ``torch.distributed`` backend ``"hpcreduce"`` (registered on import), so torch's own DDP,
FSDP2, DCP and DeviceMesh run over these collectives: ``dist.init_process_group("hpcreduce")``.
Recommendation models, with TorchRec's names: ``EmbeddingBagCollection`` of ``EmbeddingBagConfig``
tables (``embedding_collection``, ``embedding_configs``) over a ``KeyedJaggedTensor`` batch, giving
a ``KeyedTensor`` (``jagged``); ``start_hybrid`` (``hybrid``, ``layouts``: the tables on K dedicated
servers or a shard on every trainer, the dense rest averaged by ``DistributedDataParallel``, the
rows updated by ``sparse_optimizer``) and ``TrainPipeline`` (``pipeline``: the next batch routed
while this one computes; ``save_tables`` and ``start_hybrid(tables_from=...)``: fixed tables saved
sharded, loaded at any number of ranks); or ``TorchModel`` (``model_adapter``: the same module as a
``hpcreduce.train`` model, which the hybrid trainer runs with fault tolerance).
"""
from . import c10d  # registers the torch.distributed backend "hpcreduce"
from .checkpoints import load_checkpoint, save_checkpoint
from .ddp import DistributedDataParallel
from .embedding_collection import EmbeddingBagCollection
from .embedding_configs import (DataType, EmbeddingBagConfig, LFUEviction, LRUEviction, PoolingType,
                                ProbabilisticAdmission, RowOptimizer, ThresholdAdmission)
from .gradients import allreduce_gradients, bucket_gradients
from .hybrid import HybridWorker, start_hybrid
from .jagged import KeyedJaggedTensor, KeyedTensor
from .model_adapter import TorchModel
from .parameters import broadcast_parameters
from .pipeline import TrainPipeline
from .table_files import save_tables
from .ps_worker import TorchPSWorker, start_parameter_server
from .sampler import ElasticSampler
from .zero import ZeroRedundancyOptimizer

__all__ = ["DistributedDataParallel", "ElasticSampler", "HybridWorker", "allreduce_gradients",
           "bucket_gradients", "broadcast_parameters", "load_checkpoint", "save_checkpoint", "start_hybrid",
           "start_parameter_server", "TorchModel", "TorchPSWorker", "ZeroRedundancyOptimizer", "DataType",
           "EmbeddingBagCollection", "EmbeddingBagConfig", "KeyedJaggedTensor", "KeyedTensor", "LFUEviction",
           "LRUEviction", "PoolingType", "ProbabilisticAdmission", "RowOptimizer", "ThresholdAdmission",
           "TrainPipeline", "save_tables"]
