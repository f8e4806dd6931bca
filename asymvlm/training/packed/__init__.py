"""Packed trials: K configurations of one method trained in one process as one batched model.

The protocol (paper App. B.4) trains every method for several learning rates and seeds; at the
adapter sizes of the paper (~3 M parameters, d = 512) one run leaves most of a GPU idle, and on
a CPU a small adapter's step is dominated by per-operation overhead. :class:`PackedTrainer`
trains K members -- the same method and hyper-parameters, different ``lr`` and/or ``seed`` --
as one model: every step gathers the K members' batches into [K, B, d] tensors, stacks the
members' parameters and evaluates the method's own loss (:func:`~asymvlm.distributed.\
global_batch_loss`, Eq. 2 / App. A.3 for AsymVLM) for all of them at once with
``torch.func.vmap(functional_call(...))``; one backward pass of the summed losses leaves each
member's own gradient on its own parameters. Everything else stays per member, exactly as its
unpacked :class:`~asymvlm.training.Trainer` has it (each member *is* driven through its own
``Trainer``):

* its initialisation, built under its own seed as :class:`~asymvlm.training.TrainingRun`
  builds it (``torch.manual_seed(seed)``, then ``build_method``), and its own global-RNG
  stream, swapped in whenever member code may draw from it (``fit_start``, evaluation);
* its per-epoch permutation (``epoch_generator(seed, 0, epoch)``), optimiser state, cosine
  schedule (from its own lr), epoch rows (``train_loss``, ``lr``, kappa statistics) and
  divergence checks: a member whose loss, gradient or parameters become non-finite is stopped
  with the message its ``Trainer`` would raise, and the others go on.

So member k ends where its unpacked run ends, up to the rounding of batched matrix products
(tested to float tolerance in ``tests/test_packed.py``; ``epoch_seconds`` is the pack's epoch).

A method whose loss cannot be vmapped (data-dependent Python control flow, random draws,
custom autograd Functions without a vmap rule) or whose batched loss differs from its own is
detected by a probe before the first step; the pack then trains its members one after another
(each with its own RNG stream, so still equal to the unpacked runs) and logs why. Methods
without SGD training (``clip``, ``bayesvlm``) are fitted one after another as well.

Single process only (``world_size`` 1): a packed member is never a DDP worker. A pack resumes
between epochs from :meth:`PackedTrainer.state_dict` (every member's trainer state, RNG stream,
history and failure) and ends where the uninterrupted pack ends.
"""

from asymvlm.training.packed.protocol import check_packable_specs, run_packed_protocol
from asymvlm.training.packed.trainer import (
    PACKABLE_FIELDS,
    PackedEpochHook,
    PackedStateHook,
    PackedTrainer,
    check_packable,
)

__all__ = [
    "PACKABLE_FIELDS",
    "PackedEpochHook",
    "PackedStateHook",
    "PackedTrainer",
    "check_packable",
    "check_packable_specs",
    "run_packed_protocol",
]
