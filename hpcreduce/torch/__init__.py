"""PyTorch interop (``pip install 'hpcreduce[torch]'``): data-parallel torch models over MPI ranks.

    import hpcreduce.torch as hpt
    hpt.broadcast_parameters(model)          # every rank starts from rank 0's weights
    for x, y in my_shard:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        hpt.allreduce_gradients(model)       # mean gradient over all ranks, in place
        optimizer.step()

or with parameter servers (the servers run hpcreduce's optimizer, see docs/parameter-server.md):

    role = hpt.start_parameter_server(model, servers=1, optimizer="sgd", lr=0.1)
    if isinstance(role, hpcreduce.ps.Server):
        role.serve()
    else:
        for x, y in my_shard:
            role.pull()                      # the servers' parameters into the model
            model.zero_grad(); loss_fn(model(x), y).backward()
            role.push()                      # gradients to the servers
            role.clock()
        role.release()

Tensors are not copied where it can be helped: a CPU tensor is reduced through its numpy
view (``tensor.numpy()`` shares its memory), a CUDA tensor through a cupy view
(DLPack, zero-copy; needs cupy). Every rank must pass the same parameters in the same
order; a parameter without a gradient counts as zeros (as Horovod does). Bad input
(different models on different ranks, a dtype hpcreduce does not reduce, sparse or
non-finite gradients, a root outside the communicator) raises on every rank, naming the
parameters and ranks, before any data moves.
Cost: ``allreduce_gradients`` is one ``allreduce_many`` of all gradients (see
docs/algorithms.md) after one ``isfinite`` pass over them (``check_finite``); after
``bucket_gradients(model)`` the gradients live in persistent fusion buffers and are reduced
there, with no copy in or out;
``broadcast_parameters`` one small allreduce (the root), one small pickled signature
broadcast and an allgather of verdicts, then one ``MPI_Bcast`` per tensor (any dtype, as bytes);
``pull``/``push``: one PS pull or push per parameter, all in flight together.
"""
from .ddp import DistributedDataParallel
from .gradients import allreduce_gradients, bucket_gradients
from .parameters import broadcast_parameters
from .ps_worker import TorchPSWorker, start_parameter_server

__all__ = ["DistributedDataParallel", "allreduce_gradients", "bucket_gradients", "broadcast_parameters", "start_parameter_server",
           "TorchPSWorker"]
