"""PyTorch -> ONNX export of a captioner's encoder and single-step decoder (DESIGN.md §4)."""
