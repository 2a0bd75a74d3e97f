"""Apps defined by operators: session kinds that are data, not code (issue 37).

An app is a row (``models.App`` with its ``AppField`` rows) made in the admin or imported from
YAML; ``spec.AppSpec`` is the same thing as plain data, which the YAML files, the checks in
``rules`` and the registry's ``kinds.operator.OperatorApp`` read. ``store`` reads and writes the
rows; ``yaml_files`` reads and writes the files. The program itself is started on the node by
the generic starter ``node/starters/app.py``, told the spec in one argument."""
