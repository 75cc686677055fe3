"""Deterministic demo data for the example pipelines (fraud detector and search ranker).

The names below are loaded on first use, so ``import trainpipe.demo`` stays cheap and
``python -m trainpipe.demo.synthetic`` does not import the module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainpipe.demo.synthetic import generate_clicks, generate_transactions, write_demo_data

__all__ = ["generate_clicks", "generate_transactions", "write_demo_data"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainpipe.demo import synthetic

        return getattr(synthetic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
