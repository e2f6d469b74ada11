"""What a release says about itself and how it was made; diffs between releases."""
