"""Resuming a killed build from its journal."""
