"""The operators' explorer searches by operation ID (exact, or its beginning) across every
namespace. The unique (namespace, operation_id) index cannot serve that (the namespace comes
first), and under a non-C collation a plain btree cannot serve LIKE 'prefix%' either. One
varchar_pattern_ops index on PostgreSQL serves both the equality and the prefix arm of the
explorer's search (ops.explorer.search_q). SQLite has no operator classes and needs none at the
embedded default's sizes."""

from django.db import migrations

CREATE = ('CREATE INDEX IF NOT EXISTS "operation_id_prefix_idx" '
          'ON "ledger_operation" ("operation_id" varchar_pattern_ops)')
DROP = 'DROP INDEX IF EXISTS "operation_id_prefix_idx"'


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0007_operation_namespaces"),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
