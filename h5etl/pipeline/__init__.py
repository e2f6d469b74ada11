"""The build: wires plan -> execute -> sink -> release, and its status."""
