"""The step contract every model keeps: iterating ``step`` reproduces the teacher-forced ``forward``."""

import torch


def assert_steps_equal_forward(model, features: torch.Tensor, tokens: torch.Tensor):
    """Decode ``tokens`` (B, T) one ``step`` at a time from ``prepare(features)`` and compare each step's log-probs
    and attention with ``forward``'s (atol 1e-5); returns ``forward``'s outputs for model-specific checks."""
    full = model(features, tokens)
    memory, state = model.prepare(features)
    for t in range(tokens.shape[1]):
        logprobs, state, attention = model.step(tokens[:, t], state, memory, torch.tensor(t))
        torch.testing.assert_close(logprobs, full.logprobs[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(attention, full.attention[:, t], atol=1e-5, rtol=0)
    return full
