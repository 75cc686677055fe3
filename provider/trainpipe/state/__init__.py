"""Run state: what a pipeline's runs leave behind and read back, apart from the steps that write it. Dataset
versions (``datasets``), a DAG run's folder (``run_folder``), its committed checkpoints and the train task's status
(``checkpoint_state``), the device-hours ledger (``usage``) and its sums (``cost_report``), the training cache,
the run notes, and what storage no longer needs (``retention``). Nothing here imports a step."""
