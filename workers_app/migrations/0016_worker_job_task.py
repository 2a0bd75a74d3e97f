from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workers_app", "0015_relay_fence"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="job_task",
            field=models.CharField(blank=True, max_length=160),
        ),
    ]
