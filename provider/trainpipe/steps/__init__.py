"""The work of each step of a pipeline, one module or subpackage per step: ``snapshot``, ``validate``, ``tuning``,
``train``, ``evaluate`` (with the gate), ``register`` (with promote), ``approval``, ``backtest``. The operators
call them; run state they read and write is ``trainpipe.state``'s."""
