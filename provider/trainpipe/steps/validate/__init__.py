"""The validate step: a snapshot's checks and its acceptance (``validate``), Great Expectations quality (``quality``)
and drift (``drift``)."""
