"""The ``trainpipe`` command line, one module per subject."""
