"""Inference backends behind one interface: ``encode(pixels) -> StepSession``."""
