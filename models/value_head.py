"""The critic of DiDPO: a scalar value head on the policy's last hidden state (PPO with a shared backbone).

V_φ(s_t) = w · h_t + b, where h_t is the policy's last-layer hidden state at the position whose logits predict
token a_t (the state before a_t is emitted), as in TRL's ``AutoModelForCausalLMWithValueHead`` and the
PPO-for-LMs recipe (Ziegler et al. 2019; Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO").
The head computes in float32 outside any autocast region: values are regression targets, and bf16 would round
them to steps of ~1 %.

Initialisation is zero (w = 0, b = 0): the first values are 0, so the first GAE advantages are the plain
reward-to-go (no random baseline noise), and the head learns from its first value-loss step.

This module imports torch at import time (it defines an ``nn.Module``); `models.rl` imports it inside its
functions only, so importing `models.rl` stays light.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


class ValueHead(torch.nn.Module):
    """A float32 linear map from the hidden size to one value per position.

    Args:
        hidden_size: the policy's hidden size (``model.config.hidden_size``).

    Raises:
        ValueError: ``hidden_size < 1``.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        self.hidden_size = hidden_size
        self.summary = torch.nn.Linear(hidden_size, 1, dtype=torch.float32)
        torch.nn.init.zeros_(self.summary.weight)
        torch.nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values of hidden states.

        Args:
            hidden: (..., H) hidden states in any float dtype.

        Returns:
            (...) float32 values.

        Raises:
            ValueError: the last dimension is not `hidden_size`.
        """
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden states have size {hidden.shape[-1]}, the value head expects {self.hidden_size}")
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.summary(hidden.float()).squeeze(-1)


def save_value_head(head: ValueHead, path: str | Path) -> None:
    """Write the head's weights as safetensors (``summary.weight`` (1, H), ``summary.bias`` (1,))."""
    save_file({k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}, str(path))


def load_value_head(path: str | Path, device: str = "cpu") -> ValueHead:
    """A value head holding the weights `save_value_head` wrote.

    Raises:
        FileNotFoundError: no such file.
        KeyError: the file does not hold a value head.
    """
    state = load_file(str(path))
    head = ValueHead(int(state["summary.weight"].shape[-1]))
    head.load_state_dict(state)
    return head.to(device)
