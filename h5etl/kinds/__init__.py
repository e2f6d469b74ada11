"""Field kinds: one behaviour class per kind (``image``, ``mask``, ``label``, ``text``,
``value``, ``volume``, ``series``), worker side: nothing here imports the config. Each kind's
registry entry (``h5etl.config.fields.registry``) builds it from its config model; a kind of
another package registers through the ``h5etl.kinds`` entry-point group (``h5etl.kind_api``)."""
