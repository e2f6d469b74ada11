"""Field kinds: one behaviour class per kind (``image``, ``mask``, ``label``, ``text``,
``value``); ``h5etl.plan.kind_registry`` builds them from a spec. Adding a kind is one module
here, one model in ``h5etl.config.fields`` and one entry in the registry."""
