"""Planning a build: discover, pair, admit, assign splits, cut tasks."""
