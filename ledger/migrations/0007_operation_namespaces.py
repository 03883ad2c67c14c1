"""Operation IDs unique per namespace, not across the ledger, and the params retention
marker (issue 11).

Every existing credential gets a namespace of its own ("agent/<name>") and its operations move
into it, so what each agent could see and replay stays exactly what it was.
"""

import django.db.models.deletion
from django.db import migrations, models


def personal_namespaces(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # Check the new foreign keys now, so the table has no pending trigger events when the
        # next step makes the columns NOT NULL.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    Namespace = apps.get_model("ledger", "Namespace")
    AgentCredential = apps.get_model("ledger", "AgentCredential")
    Operation = apps.get_model("ledger", "Operation")
    for agent in AgentCredential.objects.all():
        namespace = Namespace.objects.create(name=f"agent/{agent.name}")
        AgentCredential.objects.filter(pk=agent.pk).update(namespace=namespace)
        Operation.objects.filter(agent_id=agent.pk).update(namespace=namespace)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0006_ops_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Namespace",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=100, unique=True)),
                ("description", models.CharField(blank=True, max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.AddField(
            model_name="agentcredential",
            name="namespace",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="credentials", to="ledger.namespace"),
        ),
        migrations.AddField(
            model_name="operation",
            name="namespace",
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="operations", to="ledger.namespace"),
        ),
        migrations.RunPython(personal_namespaces, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="agentcredential",
            name="namespace",
            field=models.ForeignKey(help_text="Operation IDs are unique within a namespace; credentials that share one see and replay each other's operations.", on_delete=django.db.models.deletion.PROTECT, related_name="credentials", to="ledger.namespace"),
        ),
        migrations.AlterField(
            model_name="operation",
            name="namespace",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="operations", to="ledger.namespace"),
        ),
        migrations.RemoveConstraint(
            model_name="operation",
            name="operation_operation_id_uniq",
        ),
        migrations.AddConstraint(
            model_name="operation",
            constraint=models.UniqueConstraint(fields=("namespace", "operation_id"), name="operation_unique_in_namespace"),
        ),
        migrations.AddField(
            model_name="operation",
            name="params_redacted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(condition=models.Q(("params_redacted_at__isnull", True), ("status__in", ["succeeded", "failed"])), fields=["resolved_at"], name="operation_retention_idx"),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(fields=["namespace", "run_id", "id"], name="operation_ns_run_idx"),
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(condition=models.Q(("status__in", ["prepared", "in_flight", "unknown"])), fields=["namespace", "run_id", "id"], name="operation_ns_run_open_idx"),
        ),
    ]
