"""The package version: a bottom module, so code that records or checks the version does not
import ``h5etl`` itself (whose ``__init__`` names the pipeline lazily). ``h5etl.__version__``
is this value; keep it equal to ``version`` in ``pyproject.toml``."""

__version__ = "0.1.0"
