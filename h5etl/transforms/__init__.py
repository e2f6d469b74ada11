"""transforms: the user's own stages, run in the decode workers after decode and fit.

A config names calls (``mylab.prep:window`` or a built-in such as ``crop``); ``loading``
resolves and checks them in the parent, once, and hands workers plain ``CallSpec``s;
``apply`` runs a sample's chains in a worker and turns failures into rejects; ``identity``
names the code that made a value for the layout record, the lineage and incremental builds;
``builtin`` holds the operations h5etl ships. Worker side: never imports config or pydantic.
"""
