"""INT8 calibration: real feeds -> ranges -> Q/DQ graphs, sensitive layers kept fp32. Never imports torch."""
