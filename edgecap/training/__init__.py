"""Training: cross-entropy and self-critical loops, CIDEr-D reward, checkpoints."""
