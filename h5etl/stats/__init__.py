"""Statistics a build computes: exact normalisation sums, histograms, tallies."""
