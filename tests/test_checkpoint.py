"""models.checkpoint.weights_digest: the starting-weights part of every resume fingerprint."""

import torch

from models.checkpoint import weights_digest
from models.policy import build_tiny_causal_lm


def test_weights_digest_tells_weights_apart_and_nothing_else():
    a, b = build_tiny_causal_lm(0)[0], build_tiny_causal_lm(0)[0]
    assert weights_digest(a) == weights_digest(b)  # same seed, same weights: same digest, whatever the object
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-3
    assert weights_digest(a) != weights_digest(b)
    assert weights_digest(a) != weights_digest(build_tiny_causal_lm(1)[0])
    # dtypes are part of it (bf16 bytes hash too: numpy has no bf16, the digest reads raw bytes)
    assert weights_digest(a.to(torch.bfloat16)) != weights_digest(build_tiny_causal_lm(0)[0])
