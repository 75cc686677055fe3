"""trainpipe trainer: runs inside the training pod (or locally) under ``torchrun -m trainpipe_trainer``.

Imports neither Airflow nor, at package import time, torch.
"""

__version__ = "0.1.0"
