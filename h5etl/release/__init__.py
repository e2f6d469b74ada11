"""Release files: names, the build lock, publishing, the link, listing, pruning."""
