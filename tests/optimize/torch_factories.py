"""Factories the torch-model tests name with ``--torch-factory tests.optimize.torch_factories:...``
(the operator's code: a model folder never names it)."""

from __future__ import annotations

import torch
from torch import nn

WINE_FEATURES, WINE_CLASSES = 13, 3


class WineMLP(nn.Module):
    """A small MLP classifier; standardisation is inside the module (as buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(WINE_FEATURES))
        self.register_buffer("scale", torch.ones(WINE_FEATURES))
        self.hidden = nn.Linear(WINE_FEATURES, 32)
        self.out = nn.Linear(32, WINE_CLASSES)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = (features - self.mean) / self.scale
        return self.out(torch.relu(self.hidden(x)))


def wine_mlp() -> nn.Module:
    return WineMLP()


class TwoInputConv(nn.Module):
    """A conv net over ``image`` [batch, 1, 8, variable width] plus a per-row ``scale`` vector;
    returns class scores and a pooled embedding by name."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, image: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = torch.relu(self.conv(image)).mean(dim=(2, 3)) * scale
        return {"scores": self.head(pooled), "pooled": pooled}


def two_input_conv() -> nn.Module:
    return TwoInputConv()


def not_a_module() -> object:
    return {"weights": [1.0, 2.0]}


def raises() -> nn.Module:
    raise RuntimeError("the factory fails")


NOT_CALLABLE = 42


class TokenBag(nn.Module):
    """Mean of token embeddings over a variable-length ``tokens`` [batch, length] (INT64)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens).mean(dim=1)


def token_bag() -> nn.Module:
    return TokenBag()
