"""The worker side: one task's files decoded into stored, compressed columns."""
