"""edgecap: image captioning from PyTorch training to fast, verified inference on edge GPUs.

Nothing heavy is imported here: the torch-free runtime imports ``edgecap.spec``,
which runs this file.
"""

__version__ = "0.1.0"
