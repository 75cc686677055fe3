"""trainpipe.dags.preload: what Airflow's forkserver imports once for every task process."""

from __future__ import annotations

import logging

from trainpipe.dags import preload


def test_every_listed_library_imports_in_the_provider_environment():
    # A library that renames or drops a module fails here, not as a silently slower deployment.
    assert preload.preload() == list(preload.MODULES)


def test_a_module_that_cannot_be_imported_is_logged_and_skipped(caplog):
    with caplog.at_level(logging.WARNING, logger="trainpipe.dags.preload"):
        loaded = preload.preload(("json", "trainpipe_no_such_module"))

    assert loaded == ["json"]
    assert "trainpipe.dags.preload: could not import trainpipe_no_such_module: No module named" in caplog.text
