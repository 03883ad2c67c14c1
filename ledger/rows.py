"""Hand-written SQL for the executor's hot path, built once from the models' own metadata.

The ORM costs more CPU building and compiling a statement than the database spends running it,
and it cannot put an INSERT and its event INSERT into one statement. The few statements on the
hot path (selectors.operation_lookup, transitions.operation_record_and_claim and the fenced
outcome) are therefore written here, from the fields Django knows about, so a column added by a
migration is picked up without touching this file. Values still go through each field's
get_db_prep_save() and come back through the same converters the ORM applies.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from django.db import connections, models
from django.db.models import Field, Model

ONLY_EXPLICIT = 2**31 - 1
HOT_CURSORS = 32


def fetchone(sql: str, params: Sequence[Any], alias: str = "default") -> tuple[Any, ...] | None:
    """Run one hot-path statement and return its first row.

    On PostgreSQL it goes out as a named prepared statement with server-side parameters
    (psycopg's `prepare=True`), so the server parses and plans it once per connection instead
    of once per call — Django's own cursors send literal SQL. The statement text is fixed per
    process (built once from the models), so a connection holds a handful of them. It still
    goes through Django's error translation and query log (CaptureQueriesContext sees it).
    Elsewhere, or while something wraps execution (connection.execute_wrapper: instrumentation,
    fault injection in tests), Django's cursor, so the wrapper sees the statement."""
    connection = connections[alias]
    if connection.vendor != "postgresql" or connection.execute_wrappers:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django opens connections with preparation off; allow it for explicit prepare=True
        # only (Django's own client-side cursors are never prepared).
        raw.prepare_threshold = ONLY_EXPLICIT
    # One cursor per statement text and connection, kept: psycopg keeps a cursor's adaptation
    # context (a dumper for every parameter type, a loader for every column type) only while it
    # executes the same query object again, so one cursor taking turns between the hot path's
    # statements would look all of them up again for every statement.
    hot: dict[str, tuple[str, psycopg.Cursor[Any]]] | None = getattr(
        connection, "_ledger_hot_cursors", None)
    if hot is None or getattr(connection, "_ledger_hot_raw", None) is not raw:
        hot = connection._ledger_hot_cursors = {}  # type: ignore[attr-defined]
        connection._ledger_hot_raw = raw  # type: ignore[attr-defined]
    entry = hot.get(sql)
    if entry is None or entry[1].closed:
        if len(hot) >= HOT_CURSORS:  # the hot path has a handful of statements: a safety net
            for _, stale in hot.values():
                stale.close()
            hot.clear()
        entry = hot[sql] = (sql, psycopg.Cursor(raw))
    sql, kept = entry  # the text this cursor ran last time: the same object, as psycopg asks
    started = time.monotonic()
    with connection.wrap_database_errors:
        kept.execute(sql, params, prepare=True)
        row = kept.fetchone()
    if connection.queries_logged:
        connection.queries_log.append(
            {"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return row


def _concrete(model: type[Model]) -> list[Field[Any, Any]]:
    return [f for f in model._meta.concrete_fields]  # noqa: C416 (a list, not the tuple)


@cache
def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """Every concrete column except the auto primary key."""
    pk = model._meta.pk
    return tuple(f for f in _concrete(model) if f is not pk)


def insert_params_for(fields: Sequence[Field[Any, Any]], values: Mapping[str, Any],
                      alias: str = "default", connection: Any = None) -> list[Any]:
    """Parameters for these fields from values keyed by attname (every field must be there).
    `connection`: the caller's connections[alias], when it has looked it up already."""
    connection = connection or connections[alias]
    return [prep(values[attname], connection)
            for attname, prep in _preppers(fields, connection.vendor)]


def params_for(fields: Sequence[Field[Any, Any]], values: Sequence[Any], connection: Any,
               ) -> list[Any]:
    """Parameters for these fields from their values in the same order."""
    return [prep(value, connection) for (_, prep), value
            in zip(_preppers(fields, connection.vendor), values, strict=True)]


# (attname, prep_save) per field, for field sequences the hot path passes again and again
# (the cached column tuples of transitions and outbox): keyed by the sequence's identity, as
# hashing a tuple of fields calls Field.__hash__ (Python) for every one of them.
_PREPPERS: dict[tuple[int, str], tuple[Sequence[Any], tuple[tuple[str, Any], ...]]] = {}


def _preppers(fields: Sequence[Field[Any, Any]], vendor: str,
              ) -> tuple[tuple[str, Any], ...]:
    key = (id(fields), vendor)
    entry = _PREPPERS.get(key)
    if entry is not None and entry[0] is fields:
        return entry[1]
    preppers = tuple((f.attname, prep_save(f, vendor)) for f in fields)
    if isinstance(fields, tuple):  # immutable: safe to remember (a list could change)
        if len(_PREPPERS) > 256:
            _PREPPERS.clear()
        _PREPPERS[key] = (fields, preppers)  # keeps the tuple alive, so its id stays its own
    return preppers


_PLAIN_TYPES: dict[type[Any], tuple[type[Any], ...]] = {
    models.CharField: (str,),
    models.TextField: (str,),
    models.BooleanField: (bool,),
    models.IntegerField: (int,),
    models.SmallIntegerField: (int,),
    models.BigIntegerField: (int,),
    models.PositiveIntegerField: (int,),
    models.PositiveSmallIntegerField: (int,),
    models.PositiveBigIntegerField: (int,),
    models.DateTimeField: (dt.datetime,),
}


@cache
def prep_save(field: Field[Any, Any], vendor: str) -> Callable[[Any, Any], Any]:
    """field.get_db_prep_save, or on PostgreSQL for a plain field (exactly one of the classes
    above, no subclass with its own conversion) a shortcut that passes a value of its plain type
    through as it is (an int wrapped in its typed psycopg class) — which is what
    get_db_prep_save returns for it there, after a dozen calls. Anything else (None, a naive
    datetime, a str for an integer column, JSON, other backends) takes get_db_prep_save.
    tests/ledger/test_efficiency.py checks the two agree for every hot-path column."""
    slow = field.get_db_prep_save
    if vendor == "postgresql" and type(field) is models.JSONField:
        return _json_prep(field, slow)
    if vendor == "postgresql" and type(field) is models.ForeignKey:
        return _foreign_key_prep(field, slow)
    plain = _PLAIN_TYPES.get(type(field))
    if vendor != "postgresql" or plain is None:
        return slow
    kind = plain[0]
    if kind is str:
        # CharField/TextField.get_prep_value is to_python, which returns any str as it is (a
        # TextChoices member included).
        def text(value: Any, connection: Any) -> Any:
            if value is None or isinstance(value, str):
                return value
            return slow(value, connection)

        return text
    aware = kind is dt.datetime  # a naive datetime takes the slow path (and its warning)
    # Integers go out typed (psycopg's Int2/Int4/Int8), as Django's PostgreSQL backend sends
    # them: connection.ops.integerfield_type_map by the column's internal type.
    integer = field.get_internal_type() if kind is int else None

    def fast(value: Any, connection: Any) -> Any:
        if value is None:  # NULL for every plain column type
            return None
        if type(value) is kind and not (aware and value.tzinfo is None):
            if integer is not None:
                return connection.ops.integerfield_type_map[integer](value)
            return value
        return slow(value, connection)

    return fast


def _foreign_key_prep(field: models.ForeignKey[Any, Any], slow: Callable[[Any, Any], Any],
                      ) -> Callable[[Any, Any], Any]:
    """A foreign key on PostgreSQL whose target is an auto primary key: an int goes out as the
    target's get_db_prep_save sends it (as it is); anything else takes get_db_prep_save."""
    if not isinstance(field.target_field, models.AutoField | models.BigAutoField
                      | models.SmallAutoField):
        return slow

    def fast(value: Any, connection: Any) -> Any:
        if type(value) is int:
            return value
        return slow(value, connection)

    return fast


def _json_prep(field: models.JSONField[Any], slow: Callable[[Any, Any], Any]
               ) -> Callable[[Any, Any], Any]:
    """A JSON column on PostgreSQL: a dict or list goes out wrapped as get_db_prep_save wraps it
    (psycopg's Jsonb with the field's encoder), without its four calls; a value the caller has
    wrapped already (JSON text it rendered itself: ledger.outbox) goes out as it is; anything
    else (None for SQL NULL, an expression, a scalar) takes get_db_prep_save."""
    from django.db.backends.postgresql.operations import get_json_dumps
    from psycopg.types.json import Jsonb

    dumps = get_json_dumps(field.encoder)

    def fast(value: Any, connection: Any) -> Any:
        if type(value) is dict or type(value) is list:
            return Jsonb(value, dumps=dumps)
        if type(value) is Jsonb:
            return value
        return slow(value, connection)

    return fast


def column_list(fields: Iterable[Field[Any, Any]], prefix: str = "") -> str:
    return ", ".join(f'{prefix}"{f.column}"' for f in fields)


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


@cache
def _converters(model: type[Model], vendor: str, alias: str,
                ) -> tuple[tuple[int, Any, tuple[Any, ...]], ...]:
    """(column position, expression, converters) for the columns that have converters."""
    connection = connections[alias]
    table = model._meta.db_table
    out = []
    for n, field in enumerate(_concrete(model)):
        col = field.get_col(table)
        converters = (*field.get_db_converters(connection),
                      *connection.ops.get_db_converters(col))
        if converters:
            out.append((n, col, converters))
    return tuple(out)


def instance(model: type[Model], row: Sequence[Any], alias: str = "default") -> Model:
    """A model instance from a row of all concrete columns (in field order), converted as the
    ORM would convert them (a NULL stays None, as every converter here leaves it)."""
    connection = connections[alias]
    values = list(row)
    for n, col, converters in _converters(model, connection.vendor, alias):
        value = values[n]
        if value is None:
            continue
        for converter in converters:
            value = converter(value, col, connection)
        values[n] = value
    return model.from_db(alias, None, values)  # type: ignore[arg-type]  # all columns


def field_count(model: type[Model]) -> int:
    return len(model._meta.concrete_fields)
