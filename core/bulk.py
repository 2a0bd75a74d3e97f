"""Many rows updated at once, each with values of its own: one statement on PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, models


def update_each(
    model: type[models.Model],
    own: Mapping[Any, Mapping[str, Any]],
    *,
    common: Mapping[str, Any] | None = None,
    status: str | None = None,
) -> set[Any]:
    """Write ``own[pk]`` (the same names for every pk) and ``common`` to each row of ``model``
    named in ``own``; with ``status``, only to rows still at that status (a compare-and-set on
    each). Returns the pks of the rows written.

    Django's bulk_update builds a CASE per column, whose cost grows with the square of the
    rows: 0.35 s for 500 workers' agent secrets, against a few milliseconds for this.
    """
    common = common or {}
    if not own:
        return set()
    if connection.vendor != "postgresql":
        rows = (
            model._default_manager.all()
            if status is None
            else model._default_manager.filter(status=status)
        )
        return {pk for pk, values in own.items() if rows.filter(pk=pk).update(**common, **values)}
    names = sorted({name for values in own.values() for name in values})
    pks = list(own)
    params = [_field(model, name).get_db_prep_save(v, connection) for name, v in common.items()]
    params.append(pks)
    params += [[own[pk][name] for pk in pks] for name in names]
    if status is not None:
        params.append(status)
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(model, list(common), names, guarded=status is not None), params)
        return {row[0] for row in cursor.fetchall()}


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field


def _update_sql(
    model: type[models.Model], common: list[str], names: list[str], *, guarded: bool
) -> str:
    """Parameters: the common values, the pks, one array per name, then the status if guarded."""
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        return quote(_field(model, name).column or name)

    def unnest(name: str, alias: str) -> str:
        return f"unnest(%s::{_field(model, name).db_type(connection)}[]) AS {alias}"

    pk = model._meta.pk
    assert pk is not None
    sets = [f"{column(name)} = %s" for name in common]
    sets += [f"{column(name)} = v.c{i}" for i, name in enumerate(names)]
    arrays = [unnest(pk.name, "pk")] + [unnest(name, f"c{i}") for i, name in enumerate(names)]
    where = f"t.{column(pk.name)} = v.pk"
    if guarded:
        where += f" AND t.{column('status')} = %s"
    # Every name here is the model's own, quoted; every value goes as a parameter.
    return (
        f"UPDATE {quote(model._meta.db_table)} AS t SET {', '.join(sets)} "  # noqa: S608
        f"FROM (SELECT {', '.join(arrays)}) AS v WHERE {where} RETURNING t.{column(pk.name)}"
    )


def insert_all(objs: Sequence[models.Model], *, key: str | None = None) -> None:
    """bulk_create for objects of one model that differ in a few columns, each given its pk.

    On PostgreSQL one INSERT ... SELECT: what every object shares goes as one value, the rest
    as arrays (``key``, a unique column among them, pairs the new pks with the objects; without
    it they pair in order, as bulk_create's do). Django's bulk_create prepares every column of
    every row: 0.4 s for 500 workers, most of a bulk request's time.
    """
    if not objs:
        return
    model = type(objs[0])
    if connection.vendor != "postgresql" or len(objs) == 1:
        model._default_manager.bulk_create(objs)
        return
    pk = model._meta.pk
    assert pk is not None
    shared: list[tuple[models.Field[Any, Any], Any]] = []
    varying: list[tuple[models.Field[Any, Any], list[Any]]] = []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.db_returning:
            continue
        raw = [field.pre_save(obj, add=True) for obj in objs]
        if all(type(v) is type(raw[0]) and v == raw[0] for v in raw):
            shared.append((field, field.get_db_prep_save(raw[0], connection)))
        else:
            varying.append((field, [field.get_db_prep_save(v, connection) for v in raw]))
    if key is not None and key not in {field.name for field, _ in varying}:
        raise ValueError(f"{key} is not a column the objects differ in")
    quote = connection.ops.quote_name
    columns = [quote(field.column or field.name) for field, _ in shared + varying]
    values = [f"%s::{field.db_type(connection)}" for field, _ in shared]
    values += [f"v.c{i}" for i in range(len(varying))]
    arrays = [f"%s::{field.db_type(connection)}[]" for field, _ in varying]
    aliases = ", ".join(f"c{i}" for i in range(len(varying)))
    returning = quote(pk.column or pk.name)
    if key:
        returning += f", {quote(_field(model, key).column or key)}"
    # Every name here is the model's own, quoted; every value goes as a parameter.
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(columns)}) "  # noqa: S608
        f"SELECT {', '.join(values)} FROM unnest({', '.join(arrays)}) AS v({aliases}) "
        f"RETURNING {returning}"
    )
    params = [value for _, value in shared] + [array for _, array in varying]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if len(rows) != len(objs):
        raise RuntimeError(f"inserted {len(rows)} rows of {len(objs)}")
    by_key = {getattr(obj, key): obj for obj in objs} if key else {}
    for index, row in enumerate(rows):
        obj = by_key[row[1]] if key else objs[index]
        setattr(obj, pk.attname, row[0])
        obj._state.adding = False
        obj._state.db = connection.alias
