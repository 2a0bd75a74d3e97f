"""Where people may browse on a cluster besides their home: folders an operator names (scratch,
project). Naming one grants nothing: the cluster's OS decides what each account may read."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models


class FileRoot(models.Model):
    cluster = models.ForeignKey(
        "workers_app.Cluster", on_delete=models.CASCADE, related_name="file_roots"
    )
    label = models.CharField(max_length=64, help_text="What the Files page calls it: Scratch.")
    path = models.CharField(
        max_length=1024,
        help_text="An absolute path on the cluster, e.g. /scratch. `~` (the home) is always "
        "offered first.",
    )

    class Meta:
        ordering = ("cluster", "label")
        constraints = [
            models.UniqueConstraint(fields=("cluster", "label"), name="file_root_label_unique")
        ]

    def __str__(self) -> str:
        return f"{self.label} ({self.path})"

    def clean(self) -> None:
        if not self.path.startswith("/") or "\x00" in self.path:
            raise ValidationError({"path": "An absolute path, starting with /."})
