"""What a written file promises: names, codecs, digests, the journal, part files."""
