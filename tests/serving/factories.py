"""Torch model factories the serving tests name with ``--torch-factory NAME=module:function``.

:func:`gated` builds ``y = x * factor`` whose forward first marks that it was entered (a file
``entered-<n>`` in the gate folder named by ``SERVE_TEST_GATE``) and then waits until the test
creates ``open`` in that folder. Tests thereby hold a batch on the worker thread for exactly as
long as they need (fill the queue, hit a deadline, start a drain) and release it at will.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import torch

_calls = itertools.count()
_MAX_WAIT_S = 60.0


class GatedScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = torch.nn.Parameter(torch.ones(1), requires_grad=False)
        gate = os.environ.get("SERVE_TEST_GATE")
        self.gate = Path(gate) if gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            (self.gate / f"entered-{next(_calls)}").write_text(str(x.shape[0]))
            deadline = time.monotonic() + _MAX_WAIT_S
            while not (self.gate / "open").exists() and time.monotonic() < deadline:
                time.sleep(0.002)  # the model's own wait, not test synchronisation
        return x * self.factor


def gated() -> torch.nn.Module:
    return GatedScale()
