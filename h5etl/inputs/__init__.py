"""One reader per input type: rasters, volumes, recordings, tables, class folders."""
