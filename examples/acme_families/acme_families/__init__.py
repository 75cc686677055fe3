"""Acme's trainpipe model families, registered in the ``trainpipe.models`` entry-point group (pyproject.toml)."""
