"""PyTorch -> ONNX export of a captioner's encoder and single-step decoder (the export contract: docs/design.md)."""
