"""Deterministic demo data for the example pipelines.

* :func:`generate_transactions`: card transactions for the fraud detector (binary classification).
* :func:`generate_clicks`: query/document pairs for the search ranker (graded relevance 0..4).
* :func:`generate_digits`: a real table, scikit-learn's bundled handwritten digits (8x8 pixels, classes
  0..9), with event times, for the digit classifier (multiclass classification).
* :func:`generate_tickets`: support tickets (subject and body text, a channel) and the queue that
  resolved them, for the ticket router (text, multiclass). Synthetic: no public text table ships with
  the packages trainpipe installs, so ``benchmarks/text_accuracy.py`` measures on real ones.
* :func:`generate_instructions`: the tickets as an instruction table (a ``prompt`` asking which team handles a
  ticket, the ``completion`` naming its queue), for the instruction fine-tune (``task: causal_lm``).
* :func:`tiny_model_files`: a small language model (a two-layer GPT-2, randomly initialised, and a tokenizer
  trained on the tickets' text): the ``model.pretrained`` folder of the transformer examples. Nothing downloads.
* :func:`write_demo_data`: writes them as Parquet under a local directory, never silently
  overwriting a file whose content differs.

Every generator is a pure function of its arguments: the same arguments give the same frame
(and, with the same pandas/pyarrow, the same Parquet bytes). A naive ``end`` is read as UTC.

Run ``python -m trainpipe.demo.synthetic --out DIR [--end YYYY-MM-DD] [--force]`` to write the files.
numpy and pandas are imported inside the functions so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainpipe.errors import SpecError, StorageConflictError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from airflow.sdk import ObjectStoragePath

TRANSACTION_FEATURES: tuple[str, ...] = (
    "amount",
    "merchant_risk",
    "hour_of_day",
    "distance_from_home_km",
    "transactions_last_24h",
    "account_age_days",
    "is_foreign",
)
"""Numeric feature columns of :func:`generate_transactions`, all float64. The label is ``is_fraud``."""

MERCHANT_CATEGORIES: tuple[str, ...] = (
    "grocery", "fuel", "restaurants", "apparel", "pharmacy", "entertainment", "travel",
    "online_services", "electronics", "gift_cards",
)
"""Values of the categorical ``merchant_category`` column (about 4% of its values are missing)."""

TRANSACTION_CATEGORICAL_FEATURES: tuple[str, ...] = ("merchant_category",)
"""Categorical (text, with missing values) feature columns of :func:`generate_transactions`."""

TRANSACTION_REGIONS: tuple[str, ...] = ("north", "south", "east", "west")
"""Values of the ``region`` column of :func:`generate_transactions` (not a feature: the example
pipeline slices its evaluation by it), drawn 40/30/20/10%."""

CLICK_FEATURES: tuple[str, ...] = (
    "bm25",
    "doc_quality",
    "freshness_days",
    "click_rate_prior",
    "title_match",
    "position_prior",
)
"""Feature columns of :func:`generate_clicks`, all float64. The label is ``relevance`` (int 0..4)."""

DIGIT_FEATURES: tuple[str, ...] = tuple(f"pixel_{row}_{column}" for row in range(8) for column in range(8))
"""Feature columns of :func:`generate_digits` (ink 0..16 per pixel, float64). The label is ``digit``."""

TICKET_QUEUES: tuple[str, ...] = ("account", "billing", "shipping", "technical")
"""Values of the label ``queue`` of :func:`generate_tickets`."""

DEMO_FILES: dict[str, str] = {
    "transactions": "transactions/transactions.parquet",
    "clicks": "clicks/clicks.parquet",
    "digits": "digits/digits.parquet",
    "tickets": "tickets/tickets.parquet",
    "instructions": "instructions/instructions.parquet",
}
"""Dataset name -> path relative to the root given to :func:`write_demo_data`."""

DEMO_MODEL = "models/tiny-lm"
"""The small language model's folder (``save_pretrained``: weights and tokenizer), relative to the same root."""
_DEMO_MODEL_NAME = "tiny-lm"

_SECONDS_PER_DAY = 86_400
_DOC_CORPUS_SIZE = 1_000_000


def _utc_timestamp(end: datetime) -> pd.Timestamp:
    import pandas as pd

    if not isinstance(end, datetime):
        raise SpecError(f"end: expected a datetime, got {type(end).__name__} {end!r}")
    stamp = pd.Timestamp(end)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name}: must be a positive integer, got {value!r}")


def _event_times(rng: np.random.Generator, count: int, *, days: int, end: pd.Timestamp) -> pd.Series:
    """``count`` UTC timestamps (second resolution) uniform over ``(end - days, end]``, ascending."""
    import numpy as np
    import pandas as pd

    seconds_before_end = np.sort(rng.integers(0, days * _SECONDS_PER_DAY, size=count))[::-1]
    times = end - pd.to_timedelta(seconds_before_end, unit="s")
    return pd.Series(times).astype("datetime64[us, UTC]")


def generate_transactions(
    *, rows: int = 20_000, days: int = 60, end: datetime, seed: int = 7
) -> pd.DataFrame:
    """Card transactions with an ``is_fraud`` label, about 7% positive.

    Columns: ``transaction_id`` (int64, 1..rows in time order), ``event_time`` (UTC, uniform over
    ``(end - days, end]``), the float64 features in :data:`TRANSACTION_FEATURES`, ``region`` (str, one
    of :data:`TRANSACTION_REGIONS`, independent of the rest), ``merchant_category`` (text, one of
    :data:`MERCHANT_CATEGORIES` or missing) and ``is_fraud`` (int64 0/1). ``hour_of_day`` is the UTC
    hour of ``event_time``. The merchant category follows ``merchant_risk`` (gift cards and
    electronics are riskier), so it carries signal without changing the label.

    Fraud follows interactions rather than any single feature (large night-time amounts, foreign
    transactions at risky merchants, bursts on new accounts, card testing with tiny amounts), so a
    small MLP or a tree model reaches an AUC around 0.9 while a logistic regression stays lower.
    """
    import numpy as np
    import pandas as pd

    _check_positive("rows", rows)
    _check_positive("days", days)
    end_ts = _utc_timestamp(end)
    rng = np.random.default_rng([seed, 0x7A11])

    event_time = _event_times(rng, rows, days=days, end=end_ts)
    hour = event_time.dt.hour.to_numpy().astype(np.float64)
    amount = np.round(np.maximum(rng.lognormal(3.6, 1.1, rows), 0.5), 2)
    merchant_risk = np.round(rng.beta(2.0, 6.0, rows), 4)
    is_foreign = (rng.random(rows) < 0.08).astype(np.float64)
    distance = rng.lognormal(1.5, 1.3, rows) + is_foreign * rng.lognormal(6.5, 0.6, rows)
    distance = np.round(distance, 1)
    txn_24h = rng.poisson(3.0, rows).astype(np.float64)
    account_age = np.clip(np.round(rng.gamma(1.5, 500.0, rows)), 1, 5000)

    night = hour <= 5
    new_account = account_age < 180
    logit = (
        -5.0
        + 5.8 * (night & (amount > 120))
        + 5.6 * ((is_foreign > 0) & (merchant_risk > 0.3))
        + 5.8 * (new_account & (txn_24h >= 5))
        + 6.0 * ((amount < 5) & (txn_24h >= 5))
        + 8.0 * np.maximum(merchant_risk - 0.45, 0.0)
        + 0.6 * np.tanh(np.log1p(distance) - 4.0)
        + rng.normal(0.0, 0.5, rows)
    )
    is_fraud = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    # Its own random stream: adding the column left every other column as it was.
    region = np.random.default_rng([seed, 0x5E61]).choice(TRANSACTION_REGIONS, size=rows, p=[0.4, 0.3, 0.2, 0.1])
    merchant_category = _merchant_categories(np.random.default_rng([seed, 0xCA7E]), merchant_risk)

    return pd.DataFrame(
        {
            "transaction_id": np.arange(1, rows + 1, dtype=np.int64),
            "event_time": event_time,
            "amount": amount,
            "merchant_risk": merchant_risk,
            "hour_of_day": hour,
            "distance_from_home_km": distance,
            "transactions_last_24h": txn_24h,
            "account_age_days": account_age,
            "is_foreign": is_foreign,
            "region": region,
            "merchant_category": merchant_category,
            "is_fraud": is_fraud,
        }
    )


def generate_digits(*, days: int = 60, end: datetime, seed: int = 11) -> pd.DataFrame:
    """scikit-learn's 1,797 handwritten digits (UCI, bundled with scikit-learn: nothing downloads) as a table:
    ``event_time`` spread over ``days`` days before ``end``, the 64 pixels, and ``digit`` (int 0..9)."""
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits

    _check_positive("days", days)
    digits = load_digits()
    rng = np.random.default_rng(seed)
    # Rows in a seeded random order before their times: every window holds every class.
    order = rng.permutation(len(digits.target))
    frame = pd.DataFrame(digits.data[order].astype(np.float64), columns=list(DIGIT_FEATURES))
    frame.insert(0, "event_time", _event_times(rng, len(order), days=days, end=_utc_timestamp(end)))
    frame["digit"] = digits.target[order].astype(np.int64)
    return frame


# Words each queue's tickets use more than the others do; phrases are word pairs that tell queues apart where
# their words alone do not ("charged twice" is billing, "shipped twice" shipping).
_TICKET_WORDS: dict[str, tuple[str, ...]] = {
    "account": ("password", "login", "locked", "username", "email", "profile", "reset", "verify", "account",
                "sign", "two-factor", "code", "access", "delete", "settings"),
    "billing": ("invoice", "charged", "refund", "card", "payment", "subscription", "price", "receipt", "billing",
                "discount", "tax", "plan", "renewal", "credit", "fee"),
    "shipping": ("package", "delivery", "tracking", "courier", "address", "shipped", "parcel", "arrived", "late",
                 "box", "damaged", "warehouse", "shipping", "carrier", "return"),
    "technical": ("error", "crash", "app", "bug", "update", "screen", "slow", "install", "browser", "sync",
                  "feature", "version", "freezes", "loading", "server"),
}
_TICKET_PHRASES: dict[str, tuple[str, ...]] = {
    "account": ("cannot login", "reset password", "account locked", "change email"),
    "billing": ("charged twice", "refund please", "cancel subscription", "wrong amount"),
    "shipping": ("shipped twice", "wrong address", "never arrived", "where is"),
    "technical": ("keeps crashing", "error message", "does not", "after update"),
}
_TICKET_FILLER: tuple[str, ...] = (
    "hi", "hello", "i", "my", "the", "a", "is", "it", "this", "please", "help", "thanks", "again", "today",
    "yesterday", "still", "not", "working", "problem", "issue", "order", "need", "can", "you", "we", "with", "and",
    "for", "was", "have", "been", "week", "time", "urgent", "team", "twice", "wrong", "again", "new", "old",
)


def generate_tickets(*, rows: int = 4_000, days: int = 60, end: datetime, seed: int = 13) -> pd.DataFrame:
    """Support tickets: ``event_time``, ``subject`` and ``body`` (text), ``channel`` (email, chat, phone) and
    ``queue`` (the label: account, billing, shipping, technical; about 3% of them are the wrong queue, as a
    triage team's labels are)."""
    import numpy as np
    import pandas as pd

    _check_positive("rows", rows)
    _check_positive("days", days)
    rng = np.random.default_rng(seed)
    queues = rng.choice(len(TICKET_QUEUES), size=rows, p=[0.2, 0.3, 0.3, 0.2])

    def text(queue: int, low: int, high: int) -> str:
        words: list[str] = []
        for _ in range(int(rng.integers(low, high))):
            draw = rng.random()
            if draw < 0.18:  # a word of its own queue
                words.append(str(rng.choice(_TICKET_WORDS[TICKET_QUEUES[queue]])))
            elif draw < 0.26:  # a word of another queue: tickets mention other things
                words.append(str(rng.choice(_TICKET_WORDS[TICKET_QUEUES[int(rng.integers(len(TICKET_QUEUES)))]])))
            elif draw < 0.32:
                words.append(str(rng.choice(_TICKET_PHRASES[TICKET_QUEUES[queue]])))
            else:
                words.append(str(rng.choice(_TICKET_FILLER)))
        return " ".join(words)

    subjects = [text(int(q), 2, 7).capitalize() for q in queues]
    bodies = [text(int(q), 8, 60) for q in queues]
    labels = queues.copy()
    relabelled = rng.random(rows) < 0.03
    labels[relabelled] = rng.integers(len(TICKET_QUEUES), size=int(relabelled.sum()))
    return pd.DataFrame({
        "event_time": _event_times(rng, rows, days=days, end=_utc_timestamp(end)),
        "subject": subjects,
        "body": bodies,
        "channel": rng.choice(["email", "chat", "phone"], size=rows, p=[0.5, 0.35, 0.15]).astype(object),
        "queue": np.asarray(TICKET_QUEUES, dtype=object)[labels],
    })


def _merchant_categories(rng: np.random.Generator, merchant_risk: np.ndarray) -> np.ndarray:
    """A category per row, likelier riskier the higher ``merchant_risk``; about 4% missing (None).

    Its own random stream, so the other columns are the same as before it existed.
    """
    import numpy as np

    rows = len(merchant_risk)
    popularity = np.log([0.22, 0.14, 0.16, 0.1, 0.07, 0.08, 0.06, 0.08, 0.05, 0.04])
    risk_affinity = np.linspace(-2.0, 4.0, len(MERCHANT_CATEGORIES))
    # Gumbel-max: one draw from softmax(popularity + affinity * risk) per row.
    scores = popularity + np.outer(merchant_risk, risk_affinity) + rng.gumbel(size=(rows, len(MERCHANT_CATEGORIES)))
    categories = np.asarray(MERCHANT_CATEGORIES, dtype=object)[scores.argmax(axis=1)]
    categories[rng.random(rows) < 0.04] = None
    return categories


def generate_clicks(
    *, queries: int = 1_500, docs_per_query: int = 20, days: int = 60, end: datetime, seed: int = 11
) -> pd.DataFrame:
    """Query/document pairs with a graded ``relevance`` label (int64 0..4) for learning to rank.

    Columns: ``query_id`` (int64, 1..queries in time order), ``doc_id`` (int64, unique within a
    query), ``event_time`` (UTC, one per query, uniform over ``(end - days, end]``), the float64
    features in :data:`CLICK_FEATURES` and ``relevance``. ``position_prior`` is the 1-based position
    a legacy ranker gave the document (a noisy bm25 ordering). About half the pairs have relevance 0
    and about 4% have 4; some hard queries have no relevant document at all.

    Relevance is a noisy function of the features: bm25, title match times document quality,
    freshness decay, the click-rate prior and a per-query difficulty.
    """
    import numpy as np
    import pandas as pd

    _check_positive("queries", queries)
    _check_positive("docs_per_query", docs_per_query)
    _check_positive("days", days)
    end_ts = _utc_timestamp(end)
    rng = np.random.default_rng([seed, 0xC11C])
    n = queries * docs_per_query

    query_time = _event_times(rng, queries, days=days, end=end_ts)
    query_id = np.repeat(np.arange(1, queries + 1, dtype=np.int64), docs_per_query)
    doc_id = np.concatenate(
        [rng.choice(_DOC_CORPUS_SIZE, size=docs_per_query, replace=False) for _ in range(queries)]
    ).astype(np.int64)

    bm25 = np.round(rng.gamma(2.0, 3.0, n), 3)
    title_match = rng.binomial(4, np.clip(bm25 / 15.0, 0.05, 0.95)) / 4.0
    doc_quality = np.round(rng.beta(3.0, 3.0, n), 4)
    freshness_days = np.round(rng.exponential(120.0, n), 1)
    click_rate_prior = np.round(rng.beta(1.5, 12.0, n), 4)
    legacy_score = (bm25 + rng.normal(0.0, 3.0, n)).reshape(queries, docs_per_query)
    position = np.argsort(np.argsort(-legacy_score, axis=1, kind="stable"), axis=1, kind="stable") + 1
    position_prior = position.reshape(n).astype(np.float64)

    difficulty = np.repeat(rng.normal(0.0, 0.6, queries), docs_per_query)
    latent = (
        0.22 * bm25
        + 2.4 * title_match * doc_quality
        + 1.0 * np.exp(-freshness_days / 60.0)
        + 6.0 * click_rate_prior
        + difficulty
        + rng.normal(0.0, 0.7, n)
    )
    cuts = np.quantile(latent, [0.50, 0.75, 0.88, 0.96])
    relevance = np.searchsorted(cuts, latent, side="right").astype(np.int64)

    return pd.DataFrame(
        {
            "query_id": query_id,
            "doc_id": doc_id,
            "event_time": np.repeat(query_time.to_numpy(), docs_per_query),
            "bm25": bm25,
            "doc_quality": doc_quality,
            "freshness_days": freshness_days,
            "click_rate_prior": click_rate_prior,
            "title_match": title_match,
            "position_prior": position_prior,
            "relevance": relevance,
        }
    ).astype({"event_time": "datetime64[us, UTC]"})


def drift_feature(frame: pd.DataFrame, feature: str, *, seed: int = 0) -> pd.DataFrame:
    """A copy of ``frame`` whose ``feature`` drifted, as an upstream change would make it: a numeric
    feature's values move up by one standard deviation; a categorical one's missing and most common
    values give way, in half of the rows, to its least common category."""
    import numpy as np
    import pandas as pd

    if feature not in frame.columns:
        raise SpecError(f"--drift: {feature!r} is not a column; columns are {', '.join(map(str, frame.columns))}")
    out = frame.copy()
    column = out[feature]
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        out[feature] = column + float(column.std())
        return out
    counts = column.value_counts()
    if counts.empty:
        raise SpecError(f"--drift: {feature!r} has no values to drift")
    rng = np.random.default_rng([seed, 0xD21F])
    out.loc[rng.random(len(out)) < 0.5, feature] = counts.index[-1]
    return out


def generate_instructions(*, end: datetime) -> pd.DataFrame:
    """Instruction pairs, one per ticket of :func:`generate_tickets`: ``event_time``, ``prompt`` (the ticket's
    subject and the start of its body, with the question) and ``completion`` (a space and its queue, then a full
    stop): what the instruction fine-tune of a small language model learns to answer."""
    return instructions_from_tickets(generate_tickets(end=end))


def instructions_from_tickets(tickets: pd.DataFrame) -> pd.DataFrame:
    """The instruction pairs of :func:`generate_instructions`, from a tickets frame."""
    openings = tickets["body"].str.split().str[:12].str.join(" ")
    return tickets.assign(
        prompt="Ticket: " + tickets["subject"] + ". " + openings + "\nWhich team handles it?",
        completion=" " + tickets["queue"] + ".",
    )[["event_time", "prompt", "completion"]]


# Each model written in this process, by its inputs: tests and a long-lived caller pay the trainer's start once.
_TINY_MODELS: dict[str, dict[str, bytes]] = {}


def tiny_model_files(texts: list[str], *, seed: int = 0) -> dict[str, bytes] | None:
    """The files of a small causal language model whose tokenizer is trained on ``texts`` (a byte-level BPE of
    1,024 tokens, a two-layer GPT-2 64 wide, initialised from ``seed``): file name -> bytes, the same bytes for
    the same arguments. None where the trainer's ``[transformers]`` extra is not installed.

    The trainer writes it, in a process of its own: the provider imports no torch.
    """
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("trainpipe_trainer") is None:
        return None
    key = hashlib.sha256(json.dumps([seed, texts]).encode()).hexdigest()
    if key not in _TINY_MODELS:
        _TINY_MODELS[key] = _write_tiny_model(texts, seed=seed)
    return dict(_TINY_MODELS[key])


def _write_tiny_model(texts: list[str], *, seed: int) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="trainpipe-tiny-lm-") as work:
        texts_file, folder = Path(work) / "texts.json", Path(work) / "model"
        texts_file.write_text(json.dumps(texts), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "trainpipe_trainer.models.transformer.tiny", "--texts", str(texts_file),
             "--out", str(folder), "--seed", str(seed), "--vocab-size", "1024", "--n-embd", "64"],
            capture_output=True, text=True, check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if done.returncode != 0:
            raise RuntimeError(f"writing the demo language model failed: {done.stderr.strip()[-2000:]}")
        return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


WriteStatus = Literal["written", "unchanged", "overwritten"]


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Arrow's own buffers, not io.BytesIO: a Python file object can leave Arrow's thread pool to
    # abort or hang the interpreter at exit (apache/arrow#34314, #50482).
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink)
    return sink.getvalue().to_pybytes()


def _same_content(path: Path, data: bytes) -> bool:
    """True when ``path`` holds ``data`` byte for byte, or a Parquet table equal to it.

    The table comparison keeps a file written by another pyarrow version (different footer) from
    counting as a conflict.
    """
    existing_bytes = path.read_bytes()
    if existing_bytes == data:
        return True
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        existing = pq.read_table(pa.BufferReader(existing_bytes), use_threads=False)
    except (pa.ArrowException, OSError):
        return False
    return existing.equals(pq.read_table(pa.BufferReader(data), use_threads=False))


def _shown(path: Any) -> str:
    """A local path as it is; an object-store path as its plain URI with the connection named apart."""
    if isinstance(path, Path):
        return str(path)
    from trainpipe.storage import shown_uri

    return shown_uri(path)


def _conflict(path: Any) -> StorageConflictError:
    return StorageConflictError(
        f"{_shown(path)}: already exists with different content; "
        "pass --force (force=True) to overwrite it, or choose another output directory"
    )


def _write_file(path: Any, data: bytes, *, force: bool) -> WriteStatus:
    existed = path.exists()
    if existed and _same_content(path, data):
        return "unchanged"
    if existed and not force:
        raise _conflict(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not isinstance(path, Path):  # an object store: a put replaces the object whole
        path.write_bytes(data)
        return "overwritten" if existed else "written"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return "overwritten" if existed else "written"


def _write_demo_data(
    root: str | os.PathLike[str] | ObjectStoragePath, *, end: datetime, force: bool, drift: str | None = None
) -> dict[str, tuple[str, WriteStatus, int]]:
    # A local folder, or an object-store root (the storage root's ObjectStoragePath, with its connection).
    root_path = root if hasattr(root, "protocol") else Path(root)
    frames = {
        "transactions": generate_transactions(end=end),
        "clicks": generate_clicks(end=end),
        "digits": generate_digits(end=end),
        "tickets": generate_tickets(end=end),
    }
    frames["instructions"] = instructions_from_tickets(frames["tickets"])
    if drift is not None:
        # The transactions only: the drift walkthrough in docs/data-checks.md runs the fraud pipeline.
        frames["transactions"] = drift_feature(frames["transactions"], drift)
    encoded = {name: _parquet_bytes(df) for name, df in frames.items()}
    tickets, instructions = frames["tickets"], frames["instructions"]
    model = tiny_model_files([*tickets["subject"], *tickets["body"], *instructions["prompt"],
                              *instructions["completion"]])
    targets = [(root_path / DEMO_FILES[name], data) for name, data in encoded.items()]
    if model is not None:
        targets += [(root_path / DEMO_MODEL / file_name, data) for file_name, data in model.items()]
    # Check every target before writing any, so a conflict leaves the directory as it was.
    if not force:
        for path, data in targets:
            if path.exists() and not _same_content(path, data):
                raise _conflict(path)
    results: dict[str, tuple[str, WriteStatus, int]] = {}
    for name, data in encoded.items():
        path = root_path / DEMO_FILES[name]
        results[name] = (_shown(path), _write_file(path, data, force=force), len(frames[name]))
    if model is not None:
        statuses = {_write_file(root_path / DEMO_MODEL / file_name, data, force=force)
                    for file_name, data in model.items()}
        status: WriteStatus = "overwritten" if "overwritten" in statuses else \
            "written" if "written" in statuses else "unchanged"
        results[_DEMO_MODEL_NAME] = (_shown(root_path / DEMO_MODEL), status, len(model))
    return results


def write_demo_data(root: str | os.PathLike[str] | ObjectStoragePath, *, end: datetime, force: bool = False,
                    drift: str | None = None) -> dict[str, str]:
    """Write ``transactions/transactions.parquet``, ``clicks/clicks.parquet``, ``digits/digits.parquet``,
    ``tickets/tickets.parquet`` and ``instructions/instructions.parquet`` under ``root``, and the small language
    model's folder ``models/tiny-lm`` where the trainer's ``[transformers]`` extra is installed.

    Each is generated with their default sizes and seeds and the given ``end``; with ``drift``,
    that transactions column drifted (:func:`drift_feature`). A file that
    already holds the same data is left alone; one with different data raises
    :class:`~trainpipe.errors.StorageConflictError` (nothing is written) unless ``force`` is true.
    Files are replaced atomically. Returns dataset name -> path of its file.
    """
    return {name: path for name, (path, _, _) in _write_demo_data(root, end=end, force=force, drift=drift).items()}


def _parse_end(text: str) -> datetime:
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"--end: expected YYYY-MM-DD, got {text!r}") from None
    return day.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainpipe.demo.synthetic",
        description="Write the deterministic demo datasets (transactions, clicks, digits, tickets, instructions) as "
                    "Parquet, and a small language model's folder.",
    )
    parser.add_argument("--out", required=True, help="local directory to write under")
    parser.add_argument(
        "--end",
        type=_parse_end,
        default=None,
        help="last day covered, YYYY-MM-DD, read as UTC midnight (default: today, UTC midnight)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite files with different content")
    args = parser.parse_args(argv)
    end = args.end or datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        results = _write_demo_data(args.out, end=end, force=args.force)
    except StorageConflictError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for name, (path, status, count) in results.items():
        what = f"{count} files" if name == _DEMO_MODEL_NAME else f"{count} rows, end {end:%Y-%m-%d}"
        print(f"{status:<11} {name}: {path} ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
