"""``RandomStates``: the process's random generators as one value a ``State`` can track.

    state = elastic.State(model=model, optimizer=opt, rng=elastic.RandomStates())

It holds no state of its own: ``state_dict()`` reads Python's ``random``, numpy's global
generator, torch's CPU generator and, where CUDA is initialised, the current GPU's (torch
only when the program imported it), and ``load_state_dict`` sets them. Tracked in a
``State``, a restore takes every generator back to this rank's last commit, and a sync
(after a failure, to newcomers) gives every rank **rank 0's** streams: the draws that must
agree across ranks (weights initialised after a change, a shuffle, a seed per step) then
agree, and a newcomer draws what the others draw, so a run's randomness does not depend on
which rank died. Randomness that should differ by rank (dropout, augmentation) is drawn
from a generator of its own, seeded from one draw of these and the rank.
"""
from __future__ import annotations

import random
import sys
from typing import Any, Dict

import numpy as np


class RandomStates:
    """The process-wide random generators, as a state dict (see the module docstring)."""

    def state_dict(self) -> Dict[str, Any]:
        """The generators' states: ``python``, ``numpy`` and, when torch is imported, ``torch``
        and (CUDA initialised) ``cuda``."""
        name, keys, position, has_gauss, cached = np.random.get_state()
        states: Dict[str, Any] = {"python": random.getstate(),
                                  "numpy": {"name": name, "keys": keys, "position": position,
                                            "has_gauss": has_gauss, "cached_gaussian": cached}}
        torch = sys.modules.get("torch")
        if torch is not None:
            states["torch"] = torch.get_rng_state()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                states["cuda"] = torch.cuda.get_rng_state()
        return states

    def load_state_dict(self, states: Dict[str, Any]) -> None:
        """Set the generators to ``states`` (from ``state_dict``, a sync or a checkpoint)."""
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
        numpy = states["numpy"]
        np.random.set_state((numpy["name"], np.asarray(numpy["keys"], dtype=np.uint32), int(numpy["position"]),
                             int(numpy["has_gauss"]), float(numpy["cached_gaussian"])))
        torch = sys.modules.get("torch")
        if torch is not None and "torch" in states:
            torch.set_rng_state(torch.as_tensor(states["torch"], dtype=torch.uint8))
            if "cuda" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state(torch.as_tensor(states["cuda"], dtype=torch.uint8))
