"""torch's DDP communication hooks over hpcreduce, by torch's names
(``torch.distributed.algorithms.ddp_comm_hooks``): register one with
``DistributedDataParallel.register_comm_hook(state, hook)``; ``hook(state, bucket)`` returns a
``torch.futures.Future`` of the bucket's reduced flat tensor. Built in: ``allreduce_hook``
(the default), ``fp16_compress_hook``, ``bf16_compress_hook``, ``PowerSGDState`` with
``powerSGD_hook``. A hook of one's own communicates with ``all_reduce`` (see ``bucket``)."""
from .bucket import GradBucket, all_reduce, get_world_size
from .default import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .powersgd import PowerSGDState, powerSGD_hook

__all__ = ["GradBucket", "PowerSGDState", "all_reduce", "allreduce_hook", "bf16_compress_hook",
           "fp16_compress_hook", "get_world_size", "powerSGD_hook"]
